#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train under every precision recipe saved at iteration 4 of 8 and resumed from it: every
# step's loss in metrics.jsonl and the final model.safetensors equal those of the run that was never
# interrupted, bit for bit (delayed scaling's amax histories and the step that stochastic rounding
# draws from travel in the checkpoint).
#   recipe_resume.sh MEGAMOE_TRAIN CORPUS WORKDIR
set -euo pipefail
train=$(realpath "$1") corpus=$(realpath "$2") work=$3
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset small --seq-len 32 --micro-batch 4 --eval-iters 1 --steps 8)
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
fail() { echo "FAILED: $*"; exit 1; }
for recipe in bf16 fp8_delayed fp8_current fp8_blockwise mxfp8 nvfp4; do
  "$train" "${common[@]}" --precision "$recipe" --out "whole-$recipe" >"whole-$recipe.log" 2>&1 ||
    fail "$recipe: the uninterrupted run"
  "$train" "${common[@]}" --precision "$recipe" --out "run-$recipe" --save "ckpt-$recipe" \
    --save-interval 4 >"run-$recipe.log" 2>&1 || fail "$recipe: the run that saves"
  # As a crash between the saves of iterations 4 and 8 leaves it: the tracker names 4.
  echo 4 >"ckpt-$recipe/latest_checkpointed_iteration.txt"
  # The recipe comes from the checkpoint.
  "$train" --data "$corpus" --out "run-$recipe" --load "ckpt-$recipe" >"resume-$recipe.log" 2>&1 ||
    { cat "resume-$recipe.log"; fail "$recipe: the resumed run"; }
  grep -aq "precision $recipe" "resume-$recipe.log" || fail "$recipe: not resumed under $recipe"
  grep -aq "resumed from iteration 4" "resume-$recipe.log" || fail "$recipe: not resumed from 4"
  diff <(losses "whole-$recipe/metrics.jsonl") <(losses "run-$recipe/metrics.jsonl") >/dev/null ||
    fail "$recipe: the losses differ from the uninterrupted run's"
  cmp "whole-$recipe/model.safetensors" "run-$recipe/model.safetensors" ||
    fail "$recipe: the final weights differ"
  echo "$recipe: 8 losses and the final weights equal the uninterrupted run's, bit for bit"
done
echo "recipe resume: passed"
