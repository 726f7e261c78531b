#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Adam's moments in BF16 (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype
# bf16) against fp32 moments on the `medium` preset (sequences of 256 bytes, micro-batches of 8):
# the moments' bytes (the final JSON's optimizer_state_bytes and _saved), and RUNS runs of each in
# turn with --profile: medians of the median step's tokens/s and of the optimizer's seconds per
# step.
#   benchmarks/moments_speed.sh [BUILD_DIR] [CORPUS] [RUNS] [STEPS]
set -euo pipefail
build=${1:-build}
corpus=${2:-tests/data/corpus_sample.txt}
runs=${3:-3} steps=${4:-12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"
final() { grep -a '^{"final"' "$1" | grep -o "\"$2\":[0-9.e+]*" | head -1 | cut -d: -f2; }
for ((r = 0; r < runs; ++r)); do
  for moments in fp32 bf16; do
    "$build/examples/megamoe-train" --data "$corpus" --preset medium --steps "$steps" \
      --eval-iters 1 --profile --use-precision-aware-optimizer --exp-avg-dtype "$moments" \
      --exp-avg-sq-dtype "$moments" --out "$work/out" >"$work/log" 2>/dev/null
    step_speed "$work/out" >>"$work/$moments.speed"
    seconds=$(final "$work/log" seconds_per_step)
    share=$(grep -a '^{"final"' "$work/log" | grep -o '"optimizer":[0-9.e+]*' | cut -d: -f2)
    awk -v s="$seconds" -v f="$share" 'BEGIN { print s * f }' >>"$work/$moments.optimizer"
    final "$work/log" optimizer_state_bytes >"$work/$moments.bytes"
    final "$work/log" optimizer_state_bytes_saved >"$work/$moments.saved"
  done
done
echo "| moments | bytes | saved | tokens/s | optimizer ms per step |"
echo "|---|---|---|---|---|"
for moments in fp32 bf16; do
  awk -v m="$moments" -v b="$(cat "$work/$moments.bytes")" -v s="$(cat "$work/$moments.saved")" \
    -v t="$(median <"$work/$moments.speed")" -v o="$(median <"$work/$moments.optimizer")" \
    'BEGIN { printf "| %s | %.1f MB | %.1f MB | %.0f | %.1f |\n", m, b / 1e6, s / 1e6, t, o * 1e3 }'
done
