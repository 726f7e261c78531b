# SPDX-License-Identifier: Apache-2.0
# Builds TARGET (static/by_need_missing.cpp), which must fail, and requires each of MESSAGES
# (";"-separated) in the compiler's output: one per module included by need.
execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(out "${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled: a module chosen without its header was accepted")
endif()
set(missing)
foreach(header IN LISTS MESSAGES)
  string(FIND "${out}" "#include <megamoe/${header}> before its model is instantiated" at)
  if(at EQUAL -1)
    list(APPEND missing ${header})
  endif()
endforeach()
if(missing)
  message(FATAL_ERROR "no message naming: ${missing}\n${out}")
endif()
list(LENGTH MESSAGES count)
message(STATUS "${count} modules chosen without their headers, each named")
