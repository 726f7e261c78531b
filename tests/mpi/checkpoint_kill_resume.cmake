# SPDX-License-Identifier: Apache-2.0
# A job under FP8 delayed scaling with the expert weights as codes, saving every 2 steps, is killed
# (SIGKILL) after a random step from 2 to 5; the next job loads the last save and trains to step 6
# with the uninterrupted run's losses and final state, bit for bit. Arguments: MPIEXEC, PROGRAM,
# DIR, RANKS, and the layout in LAYOUT (| separated).
file(REMOVE_RECURSE ${DIR})
string(RANDOM LENGTH 1 ALPHABET 2345 step)
string(REPLACE "|" ";" layout "${LAYOUT}")
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe -n ${RANKS} ${PROGRAM} --mode killed --steps ${step} ${layout}
          --dir ${DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "killed after step ${step}: exit ${rc}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the killed job exited 0")
endif()
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe -n ${RANKS} ${PROGRAM} --mode after_kill --steps ${step}
          ${layout} --dir ${DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "resumed: exit ${rc}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the resumed job differs from the uninterrupted one")
endif()
