#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The loss-curve study of the precision recipes: megamoe-train's `small` preset for STEPS steps
# (default 700, README command 1's run) under fp32 and every recipe (NVFP4 with its first and last
# layers in BF16 and without) on the grouped fp32 backend, the same seed and batches, held-out
# bits per byte every EVAL steps over every held-out window. Draws one picture (held-out bits per
# byte and training bits per byte against step, a curve per run) and prints the table of
# benchmarks/README.md (final held-out bpb, its difference from fp32, tokens/s).
#   benchmarks/precision_study.sh [MEGAMOE_TRAIN] [CORPUS] [STEPS] [EVAL] [OUT_SVG]
set -euo pipefail
here=$(dirname "$0")
train=${1:-build/examples/megamoe-train}
corpus=${2:-/usr/share/games/fortunes}
steps=${3:-700} eval=${4:-100}
svg=${5:-docs/images/precision-study-small-${steps}-steps.svg}
work=${PRECISION_STUDY_DIR:-$(mktemp -d)}
mkdir -p "$work"
# Each run: its name, then its flags. nvfp4 keeps its first and last layers in BF16 by default
# (as the reference's NVFP4 recipes); nvfp4_every_layer runs every layer in NVFP4.
runs=("fp32 --precision fp32" "bf16 --precision bf16" "fp8_delayed --precision fp8_delayed"
  "fp8_current --precision fp8_current" "fp8_blockwise --precision fp8_blockwise"
  "mxfp8 --precision mxfp8" "nvfp4 --precision nvfp4"
  "nvfp4_every_layer --precision nvfp4 --no-first-last-layers-bf16")
for run in "${runs[@]}"; do
  read -r name flags <<<"$run"
  [ -s "$work/$name/final.json" ] && continue # a rerun keeps finished runs
  # shellcheck disable=SC2086 # the flags are words
  "$train" --data "$corpus" --preset small --steps "$steps" --eval-interval "$eval" $flags \
    --backend grouped \
    --out "$work/$name" 2>"$work/$name.log" | grep '^{"final"' >"$work/$name.final"
  mv "$work/$name.final" "$work/$name/final.json"
  echo "$name: $(cat "$work/$name/final.json")" >&2
done
python3 "$here/plot_precision_study.py" "$work" "$svg"
