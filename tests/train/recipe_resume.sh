#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train under every precision recipe (and fp8_delayed with its first and last layers in
# BF16) saved at iteration 4 of 8 and resumed from it: every step's loss in metrics.jsonl and the
# final model.safetensors equal those of the run that was never interrupted, bit for bit (delayed
# scaling's amax histories and the step that stochastic rounding draws from travel in the
# checkpoint).
#   recipe_resume.sh MEGAMOE_TRAIN CORPUS WORKDIR
set -euo pipefail
train=$(realpath "$1") corpus=$(realpath "$2") work=$3
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset small --seq-len 32 --micro-batch 4 --eval-iters 1 --steps 8)
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
fail() { echo "FAILED: $*"; exit 1; }
# resume_case NAME RECIPE [FLAGS...]: the uninterrupted run, the run that saves at 4 and the run
# resumed from 4, which takes the recipe and its layers kept in BF16 from the checkpoint.
resume_case() {
  local name=$1 recipe=$2
  shift 2
  "$train" --sample-bytes 0 "${common[@]}" --precision "$recipe" "$@" --out "whole-$name" >"whole-$name.log" 2>&1 ||
    fail "$name: the uninterrupted run"
  "$train" --sample-bytes 0 "${common[@]}" --precision "$recipe" "$@" --out "run-$name" --save "ckpt-$name" \
    --save-interval 4 >"run-$name.log" 2>&1 || fail "$name: the run that saves"
  # As a crash between the saves of iterations 4 and 8 leaves it: the tracker names 4.
  echo 4 >"ckpt-$name/latest_checkpointed_iteration.txt"
  "$train" --sample-bytes 0 --data "$corpus" --out "run-$name" --load "ckpt-$name" >"resume-$name.log" 2>&1 ||
    { cat "resume-$name.log"; fail "$name: the resumed run"; }
  grep -aq "precision $recipe" "resume-$name.log" || fail "$name: not resumed under $recipe"
  grep -aq "resumed from iteration 4" "resume-$name.log" || fail "$name: not resumed from 4"
  diff <(losses "whole-$name/metrics.jsonl") <(losses "run-$name/metrics.jsonl") >/dev/null ||
    fail "$name: the losses differ from the uninterrupted run's"
  cmp "whole-$name/model.safetensors" "run-$name/model.safetensors" ||
    fail "$name: the final weights differ"
  echo "$name: 8 losses and the final weights equal the uninterrupted run's, bit for bit"
}
for recipe in bf16 fp8_delayed fp8_current fp8_blockwise mxfp8 nvfp4; do
  resume_case "$recipe" "$recipe"
done
# nvfp4 keeps its first and last layers in BF16 by default; delayed scaling with them kept has
# state for the middle layers only.
grep -aq "precision nvfp4 (layers 0, 3 in BF16)" resume-nvfp4.log ||
  fail "nvfp4: the resumed run does not keep layers 0 and 3 in BF16"
resume_case fp8_delayed_edges fp8_delayed --first-last-layers-bf16
grep -aq "precision fp8_delayed (layers 0, 3 in BF16)" resume-fp8_delayed_edges.log ||
  fail "fp8_delayed: the resumed run does not keep layers 0 and 3 in BF16"
cmp -s whole-fp8_delayed/model.safetensors whole-fp8_delayed_edges/model.safetensors &&
  fail "fp8_delayed: keeping layers in BF16 changed nothing"
echo "recipe resume: passed"
