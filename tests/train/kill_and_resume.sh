#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train killed with SIGKILL at a random moment after its first save, then resumed with
# --load: every step's loss in metrics.jsonl and the final model.safetensors equal those of the run
# that was never interrupted, bit for bit. Then: a run whose --steps is already reached writes its
# outputs and exits 0; a larger --steps recomputes the schedule and says so; a job saved on 2 ranks
# (EP 2) resumes on 1 and continues within fp32 round-off of the 2-rank run; SIGTERM with
# --exit-signal-handler saves and exits 0.
# megamoe-checkpoint: inspect; export --optimizer and import give a checkpoint that continues the
# same bits; model.safetensors imports to a weights-only checkpoint that only --finetune loads.
#   kill_and_resume.sh MEGAMOE_TRAIN MPIEXEC CORPUS WORKDIR MEGAMOE_CHECKPOINT
set -euo pipefail
train=$(realpath "$1") mpiexec=$2 corpus=$(realpath "$3") work=$4 tool=$(realpath "$5")
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset tiny --seq-len 32 --micro-batch 4)
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
fail() { echo "FAILED: $*"; exit 1; }

"$train" --sample-bytes 0 "${common[@]}" --steps 200 --out whole >whole.log 2>&1 || fail "the uninterrupted run"

"$train" --sample-bytes 0 "${common[@]}" --steps 200 --out run --save ckpt --save-interval 20 >run.log 2>&1 &
pid=$!
until grep -qs '^[1-9]' ckpt/latest_checkpointed_iteration.txt; do
  kill -0 $pid 2>/dev/null || fail "the run ended before its first save"
  sleep 0.01
done
sleep "0.0$((RANDOM % 10))"
kill -KILL $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
saved=$(cat ckpt/latest_checkpointed_iteration.txt)
echo "killed after the save of iteration $saved; metrics.jsonl had $(wc -l <run/metrics.jsonl) lines"
[ "$saved" -lt 200 ] || fail "the run finished before the kill (iteration $saved)"

"$train" --sample-bytes 0 --data "$corpus" --out run --load ckpt --save ckpt --save-interval 20 >resume.log 2>&1 ||
  { cat resume.log; fail "the resumed run"; }
grep -a "resumed from iteration $saved" resume.log || fail "no 'resumed from iteration $saved'"
diff <(losses whole/metrics.jsonl) <(losses run/metrics.jsonl) >/dev/null ||
  fail "the losses differ from the uninterrupted run's"
cmp whole/model.safetensors run/model.safetensors || fail "the final weights differ"
echo "200 losses and the final weights equal the uninterrupted run's, bit for bit"

"$train" --sample-bytes 0 --data "$corpus" --out run --load ckpt >reached.log 2>&1 || fail "a run already at --steps"
grep -a -- "--steps 200 already reached at iteration 200" reached.log || fail "no 'already reached'"
grep -a '"final":{"steps":200' reached.log || fail "no final line after 'already reached'"
[ "$(wc -l <run/metrics.jsonl)" -eq 200 ] || fail "metrics.jsonl lost or gained lines"

"$train" --sample-bytes 0 --data "$corpus" --out run --load ckpt --steps 210 >longer.log 2>&1 || fail "--steps 210"
grep -a "learning-rate schedule recomputed for 210 steps (was 200)" longer.log ||
  fail "no 'schedule recomputed'"
[ "$(wc -l <run/metrics.jsonl)" -eq 210 ] || fail "metrics.jsonl does not hold 210 steps"

# Another layout: saved on 2 ranks (EP 2, global batch 8), resumed on 1.
"$mpiexec" --oversubscribe -n 2 "$train" --sample-bytes 0 "${common[@]}" --ep 2 --steps 30 --out two \
  >two.log 2>&1 || fail "the 2-rank run"
"$mpiexec" --oversubscribe -n 2 "$train" --sample-bytes 0 "${common[@]}" --ep 2 --steps 30 --out moved \
  --save ckpt2 --save-interval 20 >moved.log 2>&1 || fail "the 2-rank run that saves"
# As a crash between the saves of iterations 20 and 30 leaves it: the tracker names 20.
echo 20 >ckpt2/latest_checkpointed_iteration.txt
mv ckpt2 ckpt2-moved  # a moved checkpoint loads: it holds no absolute paths
"$train" --sample-bytes 0 --data "$corpus" --out moved --load ckpt2-moved >one.log 2>&1 ||
  { cat one.log; fail "resuming the 2-rank checkpoint on 1 rank"; }
grep -a "resumed from iteration 20" one.log || fail "no 'resumed from iteration 20' on 1 rank"
paste <(losses two/metrics.jsonl) <(losses moved/metrics.jsonl) | awk '
  { d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * $2) { bad = 1; print "step " $1 ": " $2 " vs " $4 } }
  END { exit bad }' || fail "1 rank continues the 2-rank run beyond 1e-5"
echo "resumed on 1 rank from 2: steps 21-30 within 1e-5 of the 2-rank run"

# SIGTERM with --exit-signal-handler: save after the current step, exit 0.
"$train" --sample-bytes 0 "${common[@]}" --steps 100000 --out term --save ckpt3 --exit-signal-handler >term.log 2>&1 &
pid=$!
until grep -qs '"step":3,' term/metrics.jsonl; do sleep 0.01; done
kill -TERM $pid
wait $pid || fail "SIGTERM: exit status $?"
grep -a "SIGTERM: saved after step" term.log || fail "no 'SIGTERM: saved'"
test -s ckpt3/latest_checkpointed_iteration.txt || fail "SIGTERM: no checkpoint"
echo "SIGTERM saved iteration $(cat ckpt3/latest_checkpointed_iteration.txt) and exited 0"
# megamoe-checkpoint.
"$tool" inspect ckpt >inspect.log || fail "inspect"
grep -a "iteration 200" inspect.log && grep -a "optimizer.exp_avg.output_layer.weight F32 \[257,64\]" inspect.log ||
  fail "inspect does not show the iteration and the tensors"
"$tool" export ckpt all.safetensors --optimizer || fail "export --optimizer"
"$tool" import all.safetensors imported || fail "import"
"$train" --sample-bytes 0 --data "$corpus" --out from-ckpt --load ckpt --steps 214 >a.log 2>&1 || fail "214 from ckpt"
"$train" --sample-bytes 0 --data "$corpus" --out from-import --load imported --steps 214 >b.log 2>&1 ||
  { cat b.log; fail "214 from the imported checkpoint"; }
cmp from-ckpt/model.safetensors from-import/model.safetensors ||
  fail "export and import changed the training state"
"$tool" import run/model.safetensors weights || fail "import model.safetensors"
if "$train" --sample-bytes 0 --data "$corpus" --preset tiny --out w --load weights >w.log 2>&1; then
  fail "a weights-only checkpoint resumed without --finetune"
fi
grep -a "holds weights only, no training state" w.log || fail "no 'weights only' error"
"$train" --sample-bytes 0 "${common[@]}" --steps 4 --out ft --load weights --finetune >ft.log 2>&1 ||
  { cat ft.log; fail "--finetune from model.safetensors"; }
grep -a "fine-tuning from iteration 0" ft.log || fail "no 'fine-tuning from'"
echo "megamoe-checkpoint: inspect, export, import and --finetune from model.safetensors work"
echo "kill and resume: passed"
