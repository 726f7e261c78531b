#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Resident memory stays flat: megamoe-train on 2 ranks with EP 2 and with PP 2, every rank's
# resident memory logged every 10 steps (--log-memory-interval), must not grow by more than
# LIMIT (default 1 %) over its value at step 20 in any later step. Prints each rank's curve.
#   memory_flat.sh MEGAMOE_TRAIN MPIEXEC CORPUS WORKDIR [PRESET [STEPS [LIMIT]]]
set -euo pipefail
train=$(realpath "$1") mpiexec=$2 corpus=$(realpath "$3") work=$4
preset=${5:-tiny} steps=${6:-300} limit=${7:-0.01}
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset "$preset" --sample-bytes 0 --steps "$steps" --eval-iters 2
        --log-memory-interval 10)
fail() { echo "FAILED: $*"; exit 1; }

# check NAME: every rank's growth after step 20 in NAME/metrics.jsonl within the limit.
check() {
  python3 - "$1/metrics.jsonl" "$limit" "$1" <<'EOF'
import json, sys
path, limit, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
curve = [(l["step"], l["resident_bytes"]) for l in map(json.loads, open(path)) if "resident_bytes" in l]
base = dict(curve)[20]
worst = 0.0
for rank in range(len(base)):
    points = [(s, r[rank]) for s, r in curve]
    growth = max(r for s, r in points if s >= 20) / base[rank] - 1
    worst = max(worst, growth)
    shown = " ".join(f"{s}:{r / 2**20:.1f}" for s, r in points if s in (10, 20) or s % 50 == 0)
    print(f"{name} rank {rank}: resident MiB by step {shown}; growth after step 20 {100 * growth:+.3f} %")
if worst >= limit:
    sys.exit(f"{name}: resident memory grew by {100 * worst:.3f} % after step 20 (limit {100 * limit:g} %)")
EOF
}

"$mpiexec" -n 2 "$train" "${common[@]}" --ep 2 --out ep2 >ep2.log 2>&1 ||
  { cat ep2.log; fail "the EP 2 job"; }
check ep2 || fail "EP 2"
"$mpiexec" -n 2 "$train" "${common[@]}" --pp 2 --micro-batch 4 --global-batch 16 --out pp2 \
  >pp2.log 2>&1 || { cat pp2.log; fail "the PP 2 job"; }
check pp2 || fail "PP 2"
echo "memory flat: passed"
