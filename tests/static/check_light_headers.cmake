# SPDX-License-Identifier: Apache-2.0
# Fails if any of FILES includes, directly or not, Eigen, Boost.MPI or range-v3: configuration
# checks must stay light (a compile-fail test should take about a second).
set(failed)
foreach(file IN LISTS FILES)
  execute_process(
    COMMAND ${CXX} -std=c++20 -M -x c++ -I${INCLUDE_DIR} -DMEGAMOE_COMPILE_FAIL ${file}
    RESULT_VARIABLE rc OUTPUT_VARIABLE deps ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "could not list the includes of ${file}:\n${err}")
    continue()
  endif()
  if(deps MATCHES "(eigen3|boost/mpi|range/v3)[^ \n]*")
    list(APPEND failed "${file} includes ${CMAKE_MATCH_0}")
  endif()
endforeach()
list(LENGTH FILES count)
if(failed)
  list(JOIN failed "\n  " text)
  message(FATAL_ERROR "heavy includes found:\n  ${text}")
endif()
message(STATUS "${count} files checked: none includes Eigen, Boost.MPI or range-v3")
