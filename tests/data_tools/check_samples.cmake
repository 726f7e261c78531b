# SPDX-License-Identifier: Apache-2.0
# `megamoe-data samples` against a GPT vector of tests/data/megatron_data: the first samples of a
# split, as the program prints them (one JSON array per line, nothing else), are the vector's.
#   cmake -DDATA_TOOL=... -DVECTOR=gpt_....json -DDATA_DIR=.../megatron_data -DSPLIT=train
#         -DEXTRA="--data-cache-path;DIR" -P check_samples.cmake
file(READ ${VECTOR} vector)
string(JSON prefix GET "${vector}" config blend_prefixes 0)
string(JSON seq GET "${vector}" config sequence_length)
string(JSON seed GET "${vector}" config random_seed)
string(JSON split GET "${vector}" config split)
string(JSON train GET "${vector}" config sizes 0)
string(JSON valid GET "${vector}" config sizes 1)
string(JSON test GET "${vector}" config sizes 2)
string(JSON count LENGTH "${vector}" splits ${SPLIT} samples)
execute_process(
  COMMAND ${DATA_TOOL} samples --data-path ${DATA_DIR}/${prefix} --seq-length ${seq}
          --seed ${seed} --split ${split} --num-samples ${train},${valid},${test}
          --split-name ${SPLIT} --count ${count} ${EXTRA}
  OUTPUT_VARIABLE output ERROR_VARIABLE errors RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "megamoe-data samples failed (${status}): ${errors}")
endif()
string(REGEX REPLACE "\n$" "" output "${output}")
string(REPLACE "\n" ";" lines "${output}")
list(LENGTH lines printed)
if(NOT printed EQUAL count)
  message(FATAL_ERROR "printed ${printed} lines, expected ${count}")
endif()
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON index GET "${vector}" splits ${SPLIT} samples ${i} index)
  if(NOT index EQUAL i)
    message(FATAL_ERROR "the vector's sample ${i} is sample ${index}")
  endif()
  string(JSON expected GET "${vector}" splits ${SPLIT} samples ${i} text)
  string(REGEX REPLACE "[ \n\t]" "" expected "${expected}")
  list(GET lines ${i} got)
  if(NOT got STREQUAL expected)
    message(FATAL_ERROR "sample ${i} of ${SPLIT}:\n  got      ${got}\n  expected ${expected}")
  endif()
endforeach()
message(STATUS "megamoe-data samples: the first ${count} ${SPLIT} samples are the vector's")
