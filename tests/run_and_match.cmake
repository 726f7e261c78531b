# SPDX-License-Identifier: Apache-2.0
# Runs COMMAND (| separated) and passes when its exit status is as EXIT says (zero, nonzero or a
# number) and its output (stdout and stderr) matches EXPECT. ctest alone can check one of the two,
# not both.
string(REPLACE "|" ";" command "${COMMAND}")
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 100)
message(STATUS "exit: ${rc}\n${out}${err}")
if(EXIT STREQUAL "zero" AND NOT rc EQUAL 0)
  message(FATAL_ERROR "expected exit status 0")
elseif(EXIT STREQUAL "nonzero" AND rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status")
elseif(EXIT MATCHES "^[0-9]+$" AND NOT rc EQUAL EXIT)
  message(FATAL_ERROR "expected exit status ${EXIT}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "output does not match '${EXPECT}'")
endif()
