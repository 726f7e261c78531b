#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train on a folded layout follows the one-rank run: 20 steps of the `tiny` preset on the
# same global batches (8 sequences of 32 bytes; FOLDED_SIZES replaces the preset and sizes), alone
# and on RANKS ranks with the given degree flags; every step's loss must agree within RTOL
# relative (the first three within RTOL / 10: a wrong gradient shows by step 2, before rounding
# has moved many routing decisions or BF16 roundings), model.safetensors must hold the same whole tensors, and the folded run ends with its
# sample and final line (the one-rank run writes no sample: the two samples may part, since a byte
# drawn near a boundary of the sampling distribution follows float rounding). The folded run's
# --profile reports the bytes each group carried per step: where the layout implies a volume, the
# measured bytes must be it (within 1e-3: the optimizer's shards of a size P does not divide differ
# by a few elements).
#   folded_curve.sh MEGAMOE_TRAIN MPIEXEC CORPUS WORKDIR RANKS RTOL FLAG...
set -euo pipefail
train=$(realpath "$1") mpiexec=$2 corpus=$(realpath "$3") work=$4 ranks=$5 rtol=$6
shift 6
rm -rf "$work"
mkdir -p "$work"
cd "$work"
read -ra sizes <<<"${FOLDED_SIZES:---preset tiny --seq-len 32 --micro-batch 4 --global-batch 8}"
common=(--data "$corpus" --steps 20 "${sizes[@]}")
fail() { echo "FAILED: $*"; exit 1; }
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }

"$train" "${common[@]}" --sample-bytes 0 --out one >one.log 2>&1 || { cat one.log; fail "one rank"; }
"$mpiexec" --oversubscribe -n "$ranks" "$train" "${common[@]}" "$@" --profile --out folded >folded.log 2>&1 ||
  { cat folded.log; fail "$ranks ranks $*"; }
losses one/metrics.jsonl >one.txt
losses folded/metrics.jsonl >folded.txt
[ "$(wc -l <one.txt)" = 20 ] && [ "$(wc -l <folded.txt)" = 20 ] || fail "not 20 steps each"
paste one.txt folded.txt | awk -v rtol="$rtol" '
  { d = ($2 - $4) / $2; if (d < 0) d = -d; if (d > worst) worst = d
    tol = $1 <= 3 ? rtol / 10 : rtol
    if ($1 != $3 || d > tol) { printf "step %s: one rank %s, folded %s\n", $1, $2, $4; bad = 1 } }
  END { printf "worst relative difference over 20 steps: %.3g\n", worst; exit bad }' ||
  fail "the loss curves differ by more than $rtol"
grep -aq '^sample:' folded.log && grep -aq '^{"final":{"steps":20,' folded.log ||
  fail "no sample or final line"
# model.safetensors holds whole tensors whatever the layout: the same names, shapes and offsets.
header() { head -c $((8 + $(od -An -t u8 -N8 "$1"))) "$1"; }
cmp -s <(header one/model.safetensors) <(header folded/model.safetensors) ||
  fail "model.safetensors' tensors differ in name or shape from the one-rank run's"
[ "$(stat -c %s one/model.safetensors)" = "$(stat -c %s folded/model.safetensors)" ] ||
  fail "model.safetensors differs in size from the one-rank run's"
# A pipeline reports the share of the schedule its stages spent waiting.
if [[ " $* " == *" --pp "* ]]; then
  grep -a '^{"final"' folded.log | grep -q '"pipeline_bubble":0\.[0-9]' ||
    fail "no pipeline_bubble in the final line"
fi
traffic=$(grep -a '^{"final"' folded.log | grep -o '"traffic":{.*}}}' || true)
[ -n "$traffic" ] || fail "no traffic in the final line"
echo "$traffic"
echo "$traffic" | grep -o '"[a-z_]*":{"bytes_per_step":[0-9.e+]*,"implied":[0-9.e+]*}' |
  sed -E 's/"([a-z_]*)":\{"bytes_per_step":([^,]*),"implied":([^}]*)\}/\1 \2 \3/' >implied.txt
[ -s implied.txt ] || fail "no group with an implied volume"
awk '{ d = ($2 - $3) / $3; if (d < 0) d = -d
       if (d > 1e-3) { printf "group %s: %s bytes per step, the layout implies %s\n", $1, $2, $3; bad = 1 } }
     END { exit bad }' implied.txt || fail "measured bytes differ from the implied volume"
echo "folded curve ($ranks ranks $*): passed"
