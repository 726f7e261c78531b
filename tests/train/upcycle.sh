#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The dense preset trains, writes model.safetensors under the reference's dense names, and
# `--preset small --upcycle` starts from it (every expert a copy of the dense FFN): the upcycled
# model's training loss over its last 10 steps lies below the dense model's over its last 10, and
# its held-out bits per byte below the dense model's.
# megamoe-checkpoint upcycle writes the same upcycled model as a checkpoint: --load it --finetune
# and every loss equals the --upcycle run's.
#   upcycle.sh MEGAMOE_TRAIN CORPUS WORKDIR MEGAMOE_CHECKPOINT
set -euo pipefail
train=$(realpath "$1") corpus=$(realpath "$2") work=$3 tool=$(realpath "$4")
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --seq-len 32 --micro-batch 4 --steps 60)
fail() { echo "FAILED: $*"; exit 1; }
last10() { tail -n 10 "$1" | sed -E 's/^\{"step":[0-9]+,"loss":([^,]+),.*/\1/' |
  awk '{ s += $1 } END { printf "%.6f", s / NR }'; }
heldout() { grep -a '"final"' "$1" | sed -E 's/.*"heldout_bpb":([^,]+),.*/\1/'; }

"$train" --sample-bytes 0 "${common[@]}" --preset dense --out dense >dense.log 2>&1 || { cat dense.log; fail "dense"; }
grep -aq 'decoder.layers.0.mlp.linear_fc1.weight"' dense/model.safetensors ||
  fail "the dense model's FFN is not saved under its dense name"
"$train" --sample-bytes 0 "${common[@]}" --preset small --upcycle dense/model.safetensors --out up >up.log 2>&1 ||
  { cat up.log; fail "upcycled"; }
grep -a "upcycled from .*dense/model.safetensors (granularity 1)" up.log || fail "no 'upcycled from'"
d=$(last10 dense/metrics.jsonl) u=$(last10 up/metrics.jsonl)
dh=$(heldout dense.log) uh=$(heldout up.log)
echo "mean loss of the last 10 steps: dense $d, upcycled $u; held-out bits/byte: dense $dh, upcycled $uh"
awk -v d="$d" -v u="$u" -v dh="$dh" -v uh="$uh" 'BEGIN { exit !(u < d && uh < dh) }' ||
  fail "the upcycled model does not train below the dense one"
if "$train" --sample-bytes 0 "${common[@]}" --preset small --upcycle dense/model.safetensors --load nowhere \
  >both.log 2>&1; then
  fail "--upcycle with --load ran"
fi
grep -a -- "--upcycle starts a new run; it does not go with --load" both.log || fail "no --load error"

losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
"$tool" upcycle dense/model.safetensors upcycled --preset small || fail "megamoe-checkpoint upcycle"
"$train" --sample-bytes 0 "${common[@]}" --load upcycled --finetune --out up2 >up2.log 2>&1 ||
  { cat up2.log; fail "--finetune from the upcycled checkpoint"; }
diff <(losses up/metrics.jsonl) <(losses up2/metrics.jsonl) >/dev/null ||
  fail "megamoe-checkpoint upcycle and --upcycle train differently"
echo "megamoe-checkpoint upcycle then --finetune: the same losses as --upcycle"
echo "upcycling: passed"
