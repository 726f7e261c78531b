#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train with its linear weights held as the recipe's codes (the reference's
# --fp8-param-gather and --fp4-param-gather: memory::quantized_weights for attention, the dense FFNs
# and the experts, the fp32 masters in the optimizer's shards):
#   - under fp8_current, fp8_delayed and nvfp4 (its first and last layers in BF16) every loss and
#     model.safetensors (written from the masters) equal the run that quantizes its fp32 weights at
#     every forward, bit for bit; on 2 ranks too, with the masters sharded over DP = EDP = 2 and
#     over TP's shards (TP = ETP = 2);
#   - the start-up line and the final JSON say so and give the masters' bytes, --describe lists
#     the modules whose weights are codes;
#   - under fp8_delayed, saved at iteration 4 of 8 and resumed (which keeps the codes without the
#     flag), every loss and the final weights equal the uninterrupted run's, bit for bit.
#   param_gather.sh MEGAMOE_TRAIN MPIEXEC CORPUS WORKDIR
set -euo pipefail
train=$(realpath "$1") mpiexec=$2 corpus=$(realpath "$3") work=$4
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset small --seq-len 32 --micro-batch 4 --eval-iters 1 --steps 8)
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
final() { grep -a '^{"final"' "$1" | grep -o "\"$2\":[^,}]*" | cut -d: -f2; }
fail() { echo "FAILED: $*"; exit 1; }

# same_as_every_forward RECIPE FLAG [RANKS DEGREE-FLAGS...]: the run with FLAG against the run
# without, on one rank or under mpiexec on RANKS ranks with the degree flags.
same_as_every_forward() {
  local recipe=$1 flag=$2 ranks=${3:-1}
  shift $(($# > 2 ? 3 : 2))
  local launch=("$train" --sample-bytes 0) name=$recipe
  if [ "$ranks" -gt 1 ]; then
    launch=("$mpiexec" --oversubscribe -n "$ranks" "$train" --sample-bytes 0 "$@")
    name=$recipe-n$ranks$(echo "$*" | tr -d ' ')
  fi
  "${launch[@]}" "${common[@]}" --precision "$recipe" --out "plain-$name" >"plain-$name.log" 2>&1 ||
    { cat "plain-$name.log"; fail "$name"; }
  "${launch[@]}" "${common[@]}" --precision "$recipe" "$flag" --out "codes-$name" \
    >"codes-$name.log" 2>&1 || { cat "codes-$name.log"; fail "$name $flag"; }
  grep -aq "linear weights as $recipe codes" "codes-$name.log" ||
    fail "$name: the start-up line does not say the weights are codes"
  [ "$(final "codes-$name.log" quantized_weights)" = true ] &&
    [ "$(final "plain-$name.log" quantized_weights)" = false ] ||
    fail "$name: quantized_weights in the final JSON"
  awk -v b="$(final "codes-$name.log" weight_master_bytes)" \
    -v z="$(final "plain-$name.log" weight_master_bytes)" 'BEGIN { exit !(b > 0 && z == 0) }' ||
    fail "$name: weight_master_bytes in the final JSON"
  cmp -s <(losses "plain-$name/metrics.jsonl") <(losses "codes-$name/metrics.jsonl") ||
    fail "$name: the losses differ from quantizing at every forward"
  cmp -s "plain-$name/model.safetensors" "codes-$name/model.safetensors" ||
    fail "$name: model.safetensors differs from quantizing at every forward"
  echo "$name $flag: 8 losses and model.safetensors equal quantizing at every forward"
}
same_as_every_forward fp8_current --fp8-param-gather
same_as_every_forward fp8_delayed --fp8-param-gather
same_as_every_forward nvfp4 --fp4-param-gather
same_as_every_forward fp8_current --fp8-param-gather 2 --ep 1
same_as_every_forward fp8_delayed --fp8-param-gather 2 --tp 2

"$train" --sample-bytes 0 --preset small --precision mxfp8 --fp8-param-gather --describe >describe.json ||
  fail "--describe"
grep -q '"weights_as_codes":\["decoder.layers.0.self_attention.linear_qkv"' describe.json ||
  fail "--describe does not list the modules whose weights are codes"

# Delayed scaling resumes bit for bit with its weights as codes.
delayed=(--precision fp8_delayed --fp8-param-gather)
"$train" --sample-bytes 0 "${common[@]}" "${delayed[@]}" --out whole >whole.log 2>&1 || fail "fp8_delayed whole"
"$train" --sample-bytes 0 "${common[@]}" "${delayed[@]}" --out run --save ckpt --save-interval 4 >run.log 2>&1 ||
  fail "fp8_delayed: the run that saves"
echo 4 >ckpt/latest_checkpointed_iteration.txt
"$train" --sample-bytes 0 --data "$corpus" --out run --load ckpt >resume.log 2>&1 || { cat resume.log; fail "resume"; }
grep -aq "linear weights as fp8_delayed codes" resume.log ||
  fail "the resumed run does not hold its weights as codes"
cmp -s <(losses whole/metrics.jsonl) <(losses run/metrics.jsonl) ||
  fail "fp8_delayed: the resumed losses differ from the uninterrupted run's"
cmp -s whole/model.safetensors run/model.safetensors || fail "fp8_delayed: the final weights differ"
echo "fp8_delayed --fp8-param-gather: resumed from 4, 8 losses and the final weights equal"
echo "param gather: passed"
