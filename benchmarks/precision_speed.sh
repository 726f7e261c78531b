#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The bf16 recipe's whole training step against fp32's on the BF16 units of this CPU: the `medium`
# preset (sequences of 256 bytes, micro-batches of 8), fp32 on the grouped backend and bf16 on
# each BF16 unit megamoe can use (avx512_bf16, amx), RUNS runs in turn, medians of the median
# step's tokens/s; beside the ratio of the units' peaks measured in the same run, before and
# after the runs, the higher reading counting (`peak` for fp32, `tile_peak` per BF16 unit,
# 2 threads). The targets: bf16 / fp32 >= 0.8 x the peak ratio on AVX512-BF16, >= 3x on AMX.
#   benchmarks/precision_speed.sh [BUILD_DIR] [CORPUS] [RUNS] [STEPS]
set -euo pipefail
build=${1:-build}
corpus=${2:-tests/data/corpus_sample.txt}
runs=${3:-3} steps=${4:-12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"
# The peaks are read before and after the runs and the higher reading counts: one reading on a
# noisy host can come out far low.
units=()
measure_peaks() {
  "$build/benchmarks/peak" --threads 2 | grep -o '"gflops_median":[0-9.e+]*' | cut -d: -f2 \
    >>"$work/fp32_peaks"
  for unit in avx512_bf16 amx; do
    line=$("$build/benchmarks/tile_peak" --threads 2 --size 1024 | grep "\"unit\":\"$unit\"" || true)
    if grep -q '"peak_tflops_median"' <<<"$line"; then
      echo "$unit $(grep -o '"peak_tflops_median":[0-9.e+]*' <<<"$line" | cut -d: -f2)" >>"$work/peaks"
    fi
  done
}
measure_peaks
for unit in avx512_bf16 amx; do
  if grep -q "^$unit " "$work/peaks" 2>/dev/null; then units+=("$unit"); fi
done
for ((r = 0; r < runs; ++r)); do
  for backend in grouped "${units[@]}"; do
    precision=bf16
    [ "$backend" = grouped ] && precision=fp32
    "$build/examples/megamoe-train" --data "$corpus" --preset medium --steps "$steps" \
      --eval-iters 1 --precision "$precision" --backend "$backend" --out "$work/out" \
      >/dev/null 2>&1
    step_speed "$work/out" >>"$work/$backend"
  done
done
measure_peaks
fp32_peak=$(sort -g "$work/fp32_peaks" | tail -1)
fp32=$(median <"$work/grouped")
echo "fp32 peak (2 threads): $fp32_peak GFLOP/s; medium fp32 on grouped: $fp32 tokens/s"
echo "| unit | unit peak (TFLOP/s) | peak ratio to fp32 | bf16 tokens/s | bf16 / fp32 | target |"
echo "|---|---|---|---|---|---|"
for unit in "${units[@]}"; do
  peak=$(grep "^$unit " "$work/peaks" | cut -d' ' -f2 | sort -g | tail -1)
  speed=$(median <"$work/$unit")
  awk -v u="$unit" -v p="$peak" -v f="$fp32_peak" -v s="$speed" -v b="$fp32" 'BEGIN {
    ratio = p * 1000 / f; got = s / b; want = (u == "amx") ? 3 : 0.8 * ratio
    printf "| %s | %.2f | %.2f | %.0f | %.2fx | %.2fx: %s |\n", u, p, ratio, s, got, want,
      (got >= want ? "met" : "not met") }'
done
