#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train --async-save on 2 ranks (EP 2): checkpoints written in the background hold the
# state of their step (resuming from one written while later steps ran continues bit for bit);
# a job killed in the middle of a background write (the checkpoint fault hook) leaves the
# previous checkpoint the latest, whole, and the job resumes from it bit for bit.
#   async_save.sh MEGAMOE_TRAIN MPIEXEC CORPUS WORKDIR
set -euo pipefail
train=$(realpath "$1") mpiexec=$2 corpus=$(realpath "$3") work=$4
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset tiny --seq-len 32 --micro-batch 4 --sample-bytes 0 --ep 2)
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
fail() { echo "FAILED: $*"; exit 1; }
two() { "$mpiexec" -n 2 "$train" "$@"; }

two "${common[@]}" --steps 60 --out whole >whole.log 2>&1 || fail "the uninterrupted run"
two "${common[@]}" --steps 60 --out async --save ckpt --save-interval 10 --async-save >async.log 2>&1 ||
  { cat async.log; fail "the run with --async-save"; }
cmp whole/model.safetensors async/model.safetensors || fail "--async-save changed the training"
[ "$(grep -c "saving iteration [0-9]* to ckpt in the background" async.log)" -eq 6 ] ||
  fail "not 6 saves started in the background"
[ "$(grep -c "saved iteration [0-9]* to ckpt (.* while training)" async.log)" -eq 6 ] ||
  fail "not 6 background saves recorded"
grep -q '"saves":6,"save_blocked_seconds":' async.log || fail "no saves in the final line"
[ "$(cat ckpt/latest_checkpointed_iteration.txt)" -eq 60 ] || fail "the last save is not the latest"
# Iteration 20 was written while steps 21-30 ran: resumed from it, the run is the same.
echo 20 >ckpt/latest_checkpointed_iteration.txt
two --sample-bytes 0 --data "$corpus" --load ckpt --out from20 >from20.log 2>&1 ||
  { cat from20.log; fail "resuming iteration 20"; }
grep -aq "resumed from iteration 20" from20.log || fail "no 'resumed from iteration 20'"
cmp whole/model.safetensors from20/model.safetensors || fail "resumed from 20: the weights differ"
diff <(losses whole/metrics.jsonl | tail -n 40) <(losses from20/metrics.jsonl) >/dev/null ||
  fail "resumed from 20: the losses differ"
echo "--async-save: 6 saves in the background, the weights unchanged; iteration 20 resumes bit for bit"

# Killed mid-write: rank 1 dies in its background write of iteration 40.
# As a job that saved iterations 10-30 left its folder.
cp -r ckpt kckpt
rm -rf kckpt/iter_00000{40,50,60}
echo 30 >kckpt/latest_checkpointed_iteration.txt
set +e
MEGAMOE_CHECKPOINT_FAULT=kill_in_save:1 "$mpiexec" -x MEGAMOE_CHECKPOINT_FAULT -n 2 "$train" \
  --sample-bytes 0 --data "$corpus" --load kckpt --save kckpt --save-interval 10 --async-save \
  --out killed >k2.log 2>&1
status=$?
set -e
[ "$status" -ne 0 ] || fail "the job with the fault hook did not fail"
[ "$(cat kckpt/latest_checkpointed_iteration.txt)" -eq 30 ] ||
  fail "after the kill the tracker names $(cat kckpt/latest_checkpointed_iteration.txt), not 30"
ls -a kckpt | grep -q '^\.iter_0000040\.partial$' || fail "no partial folder of iteration 40"
two --sample-bytes 0 --data "$corpus" --load kckpt --save kckpt --async-save --out killed >k3.log 2>&1 ||
  { cat k3.log; fail "resuming after the kill"; }
grep -aq "resumed from iteration 30" k3.log || fail "no 'resumed from iteration 30'"
ls -a kckpt | grep -q '\.partial$' && fail "the partial folder outlived the next save"
cmp whole/model.safetensors killed/model.safetensors || fail "after the kill: the weights differ"
echo "killed in the background write of iteration 40: iteration 30 stayed the latest, the job resumed bit for bit"
echo "async save: passed"
