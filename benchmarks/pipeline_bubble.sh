#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The pipeline bubble megamoe-train measures against the analytical (p - 1) / (m + p - 1) / V:
# the `medium` preset (8 layers), sequences of 128 bytes, micro-batches of 2, M micro-batches per
# step on each of pp2, pp2 vpp2, pp4, pp4 vpp2 (one DP rank), RUNS runs each in turn, medians.
#   benchmarks/pipeline_bubble.sh [MEGAMOE_TRAIN] [CORPUS] [M] [RUNS] [STEPS]
set -euo pipefail
train=${1:-build/examples/megamoe-train}
corpus=${2:-tests/data/corpus_sample.txt}
m=${3:-8} runs=${4:-3} steps=${5:-6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
layouts=("2 --pp 2" "2 --pp 2 --vpp 2" "4 --pp 4" "4 --pp 4 --vpp 2")
for ((r = 0; r < runs; ++r)); do
  for i in "${!layouts[@]}"; do
    set -- ${layouts[$i]}
    ranks=$1
    shift
    mpiexec --oversubscribe -n "$ranks" "$train" --data "$corpus" --preset medium --seq-len 128 \
      --micro-batch 2 --global-batch $((2 * m)) --steps "$steps" --eval-iters 1 --profile "$@" \
      --out "$work/out" 2>/dev/null | grep '^{"final"' |
      sed -E 's/.*"tokens_per_s":([0-9.e+]+).*"pipeline_bubble":([0-9.e+-]+).*"pipeline_bubble_analytical":([0-9.e+-]+).*/\1 \2 \3/' \
        >>"$work/layout$i"
  done
done
printf '%-16s %8s %10s %11s %9s\n' layout ranks measured analytical tokens/s
for i in "${!layouts[@]}"; do
  set -- ${layouts[$i]}
  ranks=$1
  shift
  sort -g -k2 "$work/layout$i" | awk -v name="$*" -v ranks="$ranks" -v n="$runs" '
    { t[NR] = $1; b[NR] = $2; a = $3 }
    END { k = int((n + 1) / 2); printf "%-16s %8d %10.3f %11.3f %9.0f\n", name, ranks, b[k], a, t[k] }'
done
