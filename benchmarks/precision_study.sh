#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The loss-curve study of the precision recipes: megamoe-train's `small` preset for STEPS steps
# (default 700, README command 1's run) under fp32 and every recipe, the same seed and batches,
# held-out bits per byte every EVAL steps over every held-out window. Draws one picture (held-out
# bits per byte and training bits per byte against step, a curve per recipe) and prints the table
# of benchmarks/README.md (final held-out bpb, its difference from fp32, tokens/s).
#   benchmarks/precision_study.sh [MEGAMOE_TRAIN] [CORPUS] [STEPS] [EVAL] [OUT_SVG]
set -euo pipefail
here=$(dirname "$0")
train=${1:-build/examples/megamoe-train}
corpus=${2:-/usr/share/games/fortunes}
steps=${3:-700} eval=${4:-100}
svg=${5:-docs/images/precision-study-small-${steps}-steps.svg}
work=${PRECISION_STUDY_DIR:-$(mktemp -d)}
mkdir -p "$work"
for recipe in fp32 bf16 fp8_delayed fp8_current fp8_blockwise mxfp8 nvfp4; do
  [ -s "$work/$recipe/final.json" ] && continue # a rerun keeps finished recipes
  "$train" --data "$corpus" --preset small --steps "$steps" --eval-interval "$eval" \
    --precision "$recipe" --out "$work/$recipe" 2>"$work/$recipe.log" |
    grep '^{"final"' >"$work/$recipe.final"
  mv "$work/$recipe.final" "$work/$recipe/final.json"
  echo "$recipe: $(cat "$work/$recipe/final.json")" >&2
done
python3 "$here/plot_precision_study.py" "$work" "$svg"
