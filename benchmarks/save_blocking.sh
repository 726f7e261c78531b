#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# How long a checkpoint save holds the steps up, synchronous against --async-save, on the default
# preset (small) and on medium: RUNS runs of each in turn, STEPS steps saving every INTERVAL (long
# enough for a background write to end before the next save); per save the medians of the time
# the steps were held up (the final JSON's save_blocked_seconds over its saves), and the median
# step's tokens/s (the background writes share the cores).
#   benchmarks/save_blocking.sh [BUILD_DIR] [CORPUS] [RUNS] [STEPS] [INTERVAL] [SAVE_DIR]
set -euo pipefail
build=${1:-build}
corpus=${2:-tests/data/corpus_sample.txt}
runs=${3:-3} steps=${4:-20} interval=${5:-10}
work=$(mktemp -d)
save=${6:-$work/ckpt}
trap 'rm -rf "$work" "$save"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"
final() { grep -a '^{"final"' "$1" | grep -o "\"$2\":[0-9.e+-]*" | head -1 | cut -d: -f2; }
echo "| preset | checkpoint | save | held up per save (ms) | tokens/s |"
echo "|---|---|---|---|---|"
for preset in small medium; do
  for ((r = 0; r < runs; ++r)); do
    for mode in sync async; do
      rm -rf "$save"
      flags=()
      [ "$mode" = async ] && flags=(--async-save)
      "$build/examples/megamoe-train" --data "$corpus" --preset "$preset" --steps "$steps" \
        --eval-iters 0 --sample-bytes 0 --save "$save" --save-interval "$interval" "${flags[@]}" \
        --out "$work/out" >"$work/log" 2>&1
      awk -v b="$(final "$work/log" save_blocked_seconds)" -v n="$(final "$work/log" saves)" \
        'BEGIN { print b / n * 1e3 }' >>"$work/$preset.$mode.held"
      step_speed "$work/out" >>"$work/$preset.$mode.speed"
      grep -ao '([0-9.]* MB' "$work/log" | head -1 | tr -d '(' >"$work/$preset.size"
    done
  done
  for mode in sync async; do
    printf "| %s | %s | %s | %.1f | %.0f |\n" "$preset" "$(cat "$work/$preset.size")" "$mode" \
      "$(median <"$work/$preset.$mode.held")" "$(median <"$work/$preset.$mode.speed")"
  done
done
