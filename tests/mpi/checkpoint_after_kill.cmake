# SPDX-License-Identifier: Apache-2.0
# A save killed midway: the job saves at step 2, trains to 4 and saves again while rank RANK kills
# itself (SIGKILL) halfway through its file. The job dies; the next one must load iteration 2 and
# continue with the uninterrupted run's losses. Arguments: MPIEXEC, PROGRAM, DIR, RANKS, RANK.
file(REMOVE_RECURSE ${DIR})
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe -n ${RANKS} ${PROGRAM} --mode fault --fault kill_in_save:${RANK}
          --ep 2 --dir ${DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "killed save: exit ${rc}\n${out}${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the job with a rank killed in its save exited 0")
endif()
if(NOT EXISTS ${DIR}/.iter_0000004.partial/rank_0000${RANK}.safetensors)
  message(FATAL_ERROR "the killed save left no partial file of rank ${RANK}")
endif()
file(READ ${DIR}/latest_checkpointed_iteration.txt tracker)
if(NOT tracker STREQUAL "2\n")
  message(FATAL_ERROR "the tracker names '${tracker}' after the killed save, not 2")
endif()
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe -n ${RANKS} ${PROGRAM} --mode recover --ep 2 --dir ${DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 100)
message(STATUS "recovery: exit ${rc}\n${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the previous checkpoint did not load after a killed save")
endif()
