# SPDX-License-Identifier: Apache-2.0
# A preset trained from megamoe-train's defaults (its steps, batch, sequence length and learning
# rate, on the default text) reaches held-out bits per byte at least MARGIN below the unigram
# baseline the run measures. Evaluation runs at the start and the end only, over the first
# EVAL_ITERS global batches of held-out windows, and no sample is written, to keep the test
# short; the training is the default run's. Run as:
#   cmake -DTRAIN=... -DPRESET=... -DOUT=... -DMARGIN=1 -DEVAL_ITERS=16 -P
execute_process(
  COMMAND ${TRAIN} --preset ${PRESET} --out ${OUT} --eval-interval 1000000 --eval-iters
          ${EVAL_ITERS} --sample-bytes 0
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit: ${rc}\n${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "megamoe-train --preset ${PRESET} failed:\n${out}")
endif()
string(REGEX MATCH "{\"final\":[^\n]*" final "${out}")
if(final STREQUAL "")
  message(FATAL_ERROR "no final line in the output:\n${out}")
endif()
message(STATUS "${final}")
string(JSON heldout GET "${final}" final heldout_bpb)
string(JSON unigram GET "${final}" final unigram_bpb)
# Thousandths of a bit, in integers (CMake's arithmetic has no fractions).
function(milli value out_var)
  if(NOT value MATCHES "^([0-9]+)(\\.([0-9]*))?")
    message(FATAL_ERROR "not a non-negative number: ${value}")
  endif()
  set(whole ${CMAKE_MATCH_1})
  string(SUBSTRING "${CMAKE_MATCH_3}000" 0 3 fraction)
  string(REGEX REPLACE "^0+([0-9])" "\\1" fraction "${fraction}")  # no octal
  math(EXPR result "${whole} * 1000 + ${fraction}")
  set(${out_var} ${result} PARENT_SCOPE)
endfunction()
milli("${heldout}" heldout_milli)
milli("${unigram}" unigram_milli)
math(EXPR below "${unigram_milli} - ${heldout_milli}")
math(EXPR needed "${MARGIN} * 1000")
message(STATUS "${PRESET}: held-out ${heldout} bits/byte, unigram ${unigram}: ${below} thousandths below")
if(below LESS needed)
  message(FATAL_ERROR "${PRESET} ends ${below} thousandths of a bit per byte below the unigram "
                      "baseline; at least ${needed} expected")
endif()
