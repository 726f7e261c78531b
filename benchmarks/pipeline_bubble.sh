#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The pipeline bubble megamoe-train measures against the analytical (p - 1) / (m + p - 1) / V:
# the `medium` preset (8 layers), sequences of 128 bytes, micro-batches of 2, M micro-batches per
# step on each of pp2, pp2 vpp2, pp4, pp4 vpp2 (one DP rank), RUNS runs each in turn, medians.
# The merged forward-backward schedule (--overlap-moe-expert-parallel-comm) beside the schedule it
# merges: on one rank, on pp2 vpp2, and on ep2 (two DP ranks exchanging tokens).
#   benchmarks/pipeline_bubble.sh [MEGAMOE_TRAIN] [CORPUS] [M] [RUNS] [STEPS]
set -euo pipefail
train=${1:-build/examples/megamoe-train}
corpus=${2:-tests/data/corpus_sample.txt}
m=${3:-8} runs=${4:-3} steps=${5:-6}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
merged=--overlap-moe-expert-parallel-comm
layouts=("2 --pp 2" "2 --pp 2 --vpp 2" "4 --pp 4" "4 --pp 4 --vpp 2" "2 --pp 2 --vpp 2 $merged"
  "1" "1 $merged" "2 --ep 2" "2 --ep 2 $merged")
# A field of the final JSON line (0 where a run on one stage has none).
field() { grep -o "\"$1\":[0-9.e+-]*" <<<"$final" | head -1 | cut -d: -f2 | grep . || echo 0; }
for ((r = 0; r < runs; ++r)); do
  for i in "${!layouts[@]}"; do
    set -- ${layouts[$i]}
    ranks=$1
    shift
    final=$(mpiexec --oversubscribe -n "$ranks" "$train" --data "$corpus" --preset medium \
      --seq-len 128 --micro-batch 2 --global-batch $((2 * m)) --steps "$steps" --eval-iters 1 \
      --profile "$@" --out "$work/out" 2>/dev/null | grep '^{"final"')
    echo "$(field tokens_per_s) $(field pipeline_bubble) $(field pipeline_bubble_analytical)" \
      >>"$work/layout$i"
  done
done
printf '%-50s %5s %9s %11s %9s\n' layout ranks measured analytical tokens/s
k=$(((runs + 1) / 2))
median() { cut -d' ' -f"$1" "$2" | sort -g | sed -n "${k}p"; }
for i in "${!layouts[@]}"; do
  set -- ${layouts[$i]}
  ranks=$1
  shift
  printf '%-50s %5d %9.3f %11.3f %9.0f\n' "$*" "$ranks" "$(median 2 "$work/layout$i")" \
    "$(head -1 "$work/layout$i" | cut -d' ' -f3)" "$(median 1 "$work/layout$i")"
done
