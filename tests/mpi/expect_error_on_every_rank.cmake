# SPDX-License-Identifier: Apache-2.0
# Runs COMMAND (| separated) under mpiexec with RANKS ranks and passes when the job exits non-zero and
# each rank r printed "megamoe: rank r of RANKS: ..." matching EXPECT: a start-up error reported on
# every rank, without a hang (the test's TIMEOUT catches a hang).
string(REPLACE "|" ";" command "${COMMAND}")
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe -n ${RANKS} ${command}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
set(all "${out}${err}")
message(STATUS "exit: ${rc}\n${all}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit")
endif()
math(EXPR last "${RANKS} - 1")
foreach(r RANGE 0 ${last})
  if(NOT all MATCHES "megamoe: rank ${r} of ${RANKS}: [^\n]*${EXPECT}")
    message(FATAL_ERROR "rank ${r} did not print an error matching '${EXPECT}'")
  endif()
endforeach()
message(STATUS "every rank reported the error")
