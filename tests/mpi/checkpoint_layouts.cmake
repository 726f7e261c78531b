# SPDX-License-Identifier: Apache-2.0
# Resharding: a checkpoint saved on one layout is loaded on the next and saved again at once, along
# 4 ranks (EP 2, EDP 2) -> 2 (EP 2) -> 1 -> 4 (ETP 2, EP 2) -> 2 (EP 1, EDP 2) -> 4 (EP 4) -> 4
# (TP 2, ETP 1, EP 2, EDP 2) -> 4 (TP 2, CP 2, ETP 1, EP 4) -> 2 (CP 2, EP 2) -> 2 (PP 2) -> 4
# (PP 4) -> 1 -> 4 (PP 2, TP 2, ETP 1, EP 2) -> 1; each
# pair of checkpoints must hold the same bits, and the losses each layout continues with must agree
# within RTOL. Arguments: MPIEXEC, PROGRAM, DIR, PRECISION, RTOL; optionally LAYOUTS (another
# sequence: ranks and arguments joined by '|', layouts by '/') and EXTRA (arguments every save
# and load job takes, joined by '|').
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
if(DEFINED LAYOUTS)
  string(REPLACE "/" ";" layouts "${LAYOUTS}")
else()
  set(layouts "4|--ep|2" "2|--ep|2" "1" "4|--etp|2|--ep|2" "2|--ep|1" "4|--ep|4"
      "4|--tp|2|--etp|1|--ep|2" "4|--tp|2|--cp|2|--etp|1|--ep|4" "2|--cp|2|--ep|2"
      "2|--pp|2|--ep|1" "4|--pp|4|--ep|1" "1" "4|--pp|2|--tp|2|--etp|1|--ep|2" "1")
endif()
string(REPLACE "|" ";" extra "${EXTRA}")
set(previous "")
set(index 0)
foreach(layout IN LISTS layouts)
  string(REPLACE "|" ";" words "${layout}")
  list(POP_FRONT words ranks)
  if(previous STREQUAL "")
    set(mode --mode save --dir ${DIR}/c${index})
  else()
    set(mode --mode resave --dir ${DIR}/c${previous} --to ${DIR}/c${index})
  endif()
  execute_process(
    COMMAND ${MPIEXEC} --oversubscribe -n ${ranks} ${PROGRAM} ${mode} ${words} ${extra}
            --steps 3 --more 2
            --precision ${PRECISION} --losses ${DIR}/losses${index}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
  message(STATUS "${ranks} ranks ${words}: exit ${rc}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "layout ${layout} failed")
  endif()
  if(NOT previous STREQUAL "")
    execute_process(
      COMMAND ${MPIEXEC} --oversubscribe -n 1 ${PROGRAM} --mode compare --dir ${DIR}/c${previous}
              --to ${DIR}/c${index} --losses ${DIR}/losses${index}
              --against ${DIR}/losses${previous} --rtol ${RTOL}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
    message(STATUS "compare ${previous} -> ${index}: exit ${rc}\n${out}${err}")
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "the state loaded on layout ${layout} differs from the saved one")
    endif()
  endif()
  set(previous ${index})
  math(EXPR index "${index} + 1")
endforeach()
