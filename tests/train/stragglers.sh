#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train --log-straggler-interval on 2 ranks (EP 2): rank 1 slowed by 30 ms per step
# (MEGAMOE_FAULT=slow:1:30) is named in every check, in metrics.jsonl and on the progress line,
# and rank 0, which waits for it in the collectives, is not; the same job without the fault
# names nobody at a 50 % threshold.
#   stragglers.sh MEGAMOE_TRAIN MPIEXEC CORPUS WORKDIR
set -euo pipefail
train=$(realpath "$1") mpiexec=$2 corpus=$(realpath "$3") work=$4
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset tiny --seq-len 32 --micro-batch 4 --sample-bytes 0 --ep 2
        --steps 40 --log-straggler-interval 10)
fail() { echo "FAILED: $*"; exit 1; }

MEGAMOE_FAULT=slow:1:30 "$mpiexec" -x MEGAMOE_FAULT -n 2 "$train" "${common[@]}" --out slow \
  >slow.log 2>&1 || { cat slow.log; fail "the job with rank 1 slowed"; }
checks=$(grep -c '"stragglers":' slow/metrics.jsonl)
[ "$checks" -eq 4 ] || fail "$checks straggler checks in 40 steps, not 4"
named=$(grep -c '"stragglers":\[{"rank":1,"relative":[0-9.]*}\]' slow/metrics.jsonl)
[ "$named" -eq 4 ] || { grep -o '"stragglers":[^]]*]' slow/metrics.jsonl; fail "rank 1 alone named in $named of 4 checks"; }
grep -a "stragglers over steps 31-40 (compute over the median rank's): rank 1 (" slow.log || fail "no straggler on the progress line"
grep -o '"stragglers":[^]]*]' slow/metrics.jsonl | head -1

"$mpiexec" -n 2 "$train" "${common[@]}" --straggler-threshold 0.5 --out even >even.log 2>&1 ||
  { cat even.log; fail "the job without the fault"; }
[ "$(grep -c '"stragglers":\[\]' even/metrics.jsonl)" -eq 4 ] ||
  { grep -o '"stragglers":[^]]*]' even/metrics.jsonl; fail "a rank named without the fault"; }
grep -aq "stragglers over" even.log && fail "a straggler printed without the fault"
echo "without the fault nobody is named over 50 %"
echo "stragglers: passed"
