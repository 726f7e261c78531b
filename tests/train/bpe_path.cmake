# SPDX-License-Identifier: Apache-2.0
# The README's path from text to a trained model on a BPE tokenizer, on the shipped sample and the
# tests' GPT-2-format vocabulary of 600 tokens: megamoe-data preprocess, then megamoe-train on the
# dataset with a train/valid split (one rank, and two ranks sharing --data-cache-path). Checks the
# final JSON: the tokenizer, its vocabulary padded to a multiple of 128, the samples consumed, and
# a validation curve in bits per byte that falls below the unigram baseline. Run as:
#   cmake -DDATA=... -DTRAIN=... -DMPIEXEC=... -DSAMPLE=... -DVOCAB=... -DMERGES=... -DOUT=... -P
file(REMOVE_RECURSE ${OUT})
set(tokenizer --tokenizer-type GPT2BPETokenizer --vocab-file ${VOCAB} --merge-file ${MERGES})
execute_process(
  COMMAND ${DATA} preprocess --input ${SAMPLE} --input-format text ${tokenizer} --append-eod
          --output-prefix ${OUT}/fortunes
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "megamoe-data preprocess failed:\n${out}\n${err}")
endif()
set(train_flags --data-path ${OUT}/fortunes_text_document --split 90,10,0 ${tokenizer}
    --preset tiny --steps 150 --seq-len 32 --micro-batch 4 --global-batch 8 --eval-interval 50
    --eval-iters 21 --sample-bytes 40 --data-cache-path ${OUT}/cache)
foreach(ranks 1 2)
  execute_process(
    COMMAND ${MPIEXEC} --oversubscribe -n ${ranks} ${TRAIN} ${train_flags} --out ${OUT}/run${ranks}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${ranks} rank(s):\n${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "megamoe-train on ${ranks} rank(s) failed:\n${out}\n${err}")
  endif()
  string(REGEX MATCH "{\"final\":[^\n]*" final "${out}")
  message(STATUS "${final}")
  foreach(check "tokenizer;GPT2BPETokenizer" "vocab_size;600" "padded_vocab_size;640"
                "consumed_train_samples;1200" "consumed_valid_samples;504")
    list(GET check 0 key)
    list(GET check 1 expected)
    string(JSON value GET "${final}" final ${key})
    if(NOT value STREQUAL expected)
      message(FATAL_ERROR "${key} is ${value}, not ${expected}")
    endif()
  endforeach()
  # The validation curve (each evaluation covers the valid split's 167 samples): bits per byte at
  # steps 50, 100 and 150, falling, and ending below the unigram baseline.
  file(STRINGS ${OUT}/run${ranks}/metrics.jsonl lines REGEX "heldout_bpb")
  list(LENGTH lines evaluations)
  if(NOT evaluations EQUAL 3)
    message(FATAL_ERROR "${evaluations} evaluations, not 3")
  endif()
  list(GET lines 0 first)
  list(GET lines 2 last)
  string(JSON first_bpb GET "${first}" heldout_bpb)
  string(JSON last_bpb GET "${last}" heldout_bpb)
  string(JSON unigram GET "${final}" final unigram_bpb)
  message(STATUS "valid bits per byte: ${first_bpb} at step 50, ${last_bpb} at step 150 (unigram "
                 "${unigram})")
  if(NOT last_bpb LESS first_bpb OR NOT last_bpb LESS unigram)
    message(FATAL_ERROR "the validation bits per byte did not fall below ${first_bpb} and the "
                        "unigram baseline ${unigram}: ${last_bpb}")
  endif()
endforeach()
file(GLOB cached ${OUT}/cache/*)
if(cached STREQUAL "")
  message(FATAL_ERROR "nothing in --data-cache-path")
endif()
