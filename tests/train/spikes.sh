#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A step's checks on 2 ranks (EP 2): a bit flipped once in rank 1's gradients
# (MEGAMOE_FAULT=bitflip:1:15) fails the large-gradient check, the recomputation differs
# (transient) and the job goes on with it, ending bit for bit as the job without the fault; a NaN
# written on every pass (nan:1:12) repeats in the recomputation (persistent): the step is skipped
# with rank 1's tensor named, or with --on-failed-check stop every rank stops with the error.
# FLAGs go to every job: under a precision recipe (--precision fp8_delayed, nvfp4) the
# recomputation starts from the step's delayed scaling and stochastic rounding's draws, and the
# stop is not run again.
#   spikes.sh MEGAMOE_TRAIN MPIEXEC CORPUS [FLAG...] WORKDIR
set -euo pipefail
train=$(realpath "$1") mpiexec=$2 corpus=$(realpath "$3") work=${*: -1}
flags=("${@:4:$#-4}")
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset tiny --seq-len 32 --micro-batch 4 --sample-bytes 0 --ep 2
        --steps 30 --eval-iters 2 --check-for-large-grads ${flags[@]+"${flags[@]}"})
fail() { echo "FAILED: $*"; exit 1; }
# The metrics line of step $2 in $1/metrics.jsonl.
step_line() { grep "^{\"step\":$2," "$1/metrics.jsonl"; }

"$mpiexec" -n 2 "$train" "${common[@]}" --out clean >clean.log 2>&1 ||
  { cat clean.log; fail "the job without a fault"; }
grep -q '"failed_check"' clean/metrics.jsonl && fail "a check failed without a fault"

MEGAMOE_FAULT=bitflip:1:15 "$mpiexec" -x MEGAMOE_FAULT -n 2 "$train" "${common[@]}" --out flip \
  >flip.log 2>&1 || { cat flip.log; fail "the job with a flipped bit"; }
line=$(step_line flip 15)
echo "$line" | grep -o '"failed_check".*"skipped":[a-z]*'
echo "$line" | grep -q '"rerun":"transient"' || fail "step 15 not recomputed as transient: $line"
echo "$line" | grep -q '"skipped":false' || fail "step 15 skipped: $line"
grep -a "step 15: .*recomputed: transient" flip.log || fail "no transient report on stderr"
[ "$(grep -c '"failed_check"' flip/metrics.jsonl)" -eq 1 ] || fail "other steps failed a check"
python3 - clean/metrics.jsonl flip/metrics.jsonl <<'EOF' || fail "the losses differ"
import json, sys
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
for a, b in zip(*runs):
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"], (a["step"], a, b)
print(len(runs[0]), "steps' losses and gradient norms equal")
EOF
cmp clean/model.safetensors flip/model.safetensors || fail "the weights differ from the job without the fault"
echo "a flipped bit recomputed: the final weights equal the job's without the fault"

MEGAMOE_FAULT=nan:1:12 "$mpiexec" -x MEGAMOE_FAULT -n 2 "$train" "${common[@]}" --out nan \
  >nan.log 2>&1 || { cat nan.log; fail "the job with a recurring NaN"; }
line=$(step_line nan 12)
echo "$line" | grep -o '"failed_check".*"skipped":[a-z]*'
echo "$line" | grep -q '"failed_check":"non-finite gradient"' || fail "step 12: $line"
echo "$line" | grep -q '"rerun":"persistent"' || fail "step 12 not persistent: $line"
echo "$line" | grep -q '"fault_rank":1' || fail "step 12's NaN not placed on rank 1: $line"
echo "$line" | grep -q '"skipped":true' || fail "step 12 not skipped: $line"
grep -a "step 12: non-finite gradient (in .* on rank 1); recomputed: persistent" nan.log ||
  fail "no persistent report on stderr"
cmp -s clean/model.safetensors nan/model.safetensors && fail "a skipped step left the weights as the clean job's"

[ ${#flags[@]} -eq 0 ] || { echo "spikes: passed"; exit 0; }
status=0
MEGAMOE_FAULT=nan:1:12 "$mpiexec" -x MEGAMOE_FAULT -n 2 "$train" "${common[@]}" --out stop \
  --on-failed-check stop >stop.log 2>&1 || status=$?
[ "$status" -ne 0 ] || fail "--on-failed-check stop went on"
errors=$(grep -ac "non-finite gradient at step 12 (persistent), in .* on rank 1" stop.log || true)
[ "$errors" -eq 2 ] || { cat stop.log; fail "$errors ranks of 2 gave the error"; }
grep -q '"step":12,' stop/metrics.jsonl && fail "step 12 logged although the job stopped"
echo "--on-failed-check stop: status $status, the error on both ranks"
echo "spikes: passed"
