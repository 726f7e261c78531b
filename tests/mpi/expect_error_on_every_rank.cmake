# SPDX-License-Identifier: Apache-2.0
# Runs COMMAND (| separated) under mpiexec with RANKS ranks and passes when the job exits non-zero and
# each rank r printed "megamoe: rank r of RANKS: ..." matching EXPECT: a start-up error reported on
# every rank, without a hang (the test's TIMEOUT catches a hang). With PRINTING_RANKS (| separated)
# only those ranks must print: an error on one rank that ends the whole job. With WITHIN, the job
# must end within that many seconds (whole seconds, so allow one more).
string(REPLACE "|" ";" command "${COMMAND}")
string(TIMESTAMP started "%s")
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe -n ${RANKS} ${command}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
set(all "${out}${err}")
message(STATUS "exit: ${rc}\n${all}")
string(TIMESTAMP ended "%s")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit")
endif()
if(DEFINED WITHIN)
  math(EXPR took "${ended} - ${started}")
  if(took GREATER WITHIN)
    message(FATAL_ERROR "the job took ${took} s, more than ${WITHIN} s")
  endif()
endif()
math(EXPR last "${RANKS} - 1")
if(DEFINED PRINTING_RANKS)
  string(REPLACE "|" ";" printing "${PRINTING_RANKS}")
else()
  set(printing)
  foreach(r RANGE 0 ${last})
    list(APPEND printing ${r})
  endforeach()
endif()
foreach(r IN LISTS printing)
  if(NOT all MATCHES "megamoe: rank ${r} of ${RANKS}: [^\n]*${EXPECT}")
    message(FATAL_ERROR "rank ${r} did not print an error matching '${EXPECT}'")
  endif()
endforeach()
message(STATUS "ranks ${printing} reported the error")
