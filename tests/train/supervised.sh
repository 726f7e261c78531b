#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-run supervising megamoe-train:
# - kill soak: jobs on 1 rank and on 2 ranks (EP 2), each killed with SIGKILL several times at
#   random moments (a random rank, any point of a step, a save or the start-up), finish with every
#   step's loss and the final model.safetensors bit for bit those of the job never interrupted;
# - on fewer ranks: a 4-rank job (EP 4, MEGAMOE_RANKS_PER_NODE=2: two emulated nodes of 2 ranks)
#   loses a node (its hostfile shrinks to 2 slots, a rank is killed); megamoe-run relaunches it on
#   the 2 ranks of the listed layout 2:--ep=2, which finishes bit for bit as a 2-rank job loading
#   that checkpoint by hand does, and within 1e-5 of the 4-rank job's losses;
# - SIGTERM to megamoe-run: the job saves after its current step (a save interval that would not
#   have saved), megamoe-run exits 0;
# - a job that keeps failing ends after --max-restarts relaunches with its exit status.
#   supervised.sh MEGAMOE_RUN MEGAMOE_TRAIN MPIEXEC CORPUS WORKDIR
set -euo pipefail
run=$(realpath "$1") train=$(realpath "$2") mpiexec=$3 corpus=$(realpath "$4") work=$5
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset tiny --seq-len 32 --micro-batch 4 --sample-bytes 0)
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
fail() { echo "FAILED: $*"; exit 1; }
events() { grep -c "\"event\":\"$2\"" "$1/supervisor.jsonl" || true; }
# The ranks of the job megamoe-run (pid $1) has running: its launcher's children.
ranks_of() {
  local launcher
  for launcher in $(pgrep -P "$1" || true); do pgrep -P "$launcher" -x megamoe-train || true; done
}

# soak NAME RANKS KILLS FLAGS...: the job under megamoe-run, killed KILLS times, each time a
# random rank of a launch that has run a random 0.1-0.9 s.
soak() {
  local name=$1 ranks=$2 kills=$3
  shift 3
  "$run" -n "$ranks" --max-restarts $((kills + 2)) --restart-delay 0.2 --launcher "$mpiexec" \
    -- "$train" "${common[@]}" "$@" --out "$name" --save "$name-ckpt" --save-interval 25 \
    >"$name.log" 2>&1 &
  local pid=$! done=0 victims
  while [ "$done" -lt "$kills" ]; do
    kill -0 "$pid" 2>/dev/null || fail "$name: the job ended after $done of $kills kills"
    victims=($(ranks_of "$pid"))
    if [ "${#victims[@]}" -lt "$ranks" ]; then sleep 0.05; continue; fi
    sleep "0.$((1 + RANDOM % 9))"
    victims=($(ranks_of "$pid"))
    [ "${#victims[@]}" -eq "$ranks" ] || continue
    kill -KILL "${victims[$((RANDOM % ranks))]}" 2>/dev/null || continue
    done=$((done + 1))
    # The next launch, before the next kill.
    until [ "$(events "$name" launch)" -gt "$done" ]; do
      kill -0 "$pid" 2>/dev/null || fail "$name: megamoe-run ended after kill $done"
      sleep 0.05
    done
  done
  wait "$pid" || { cat "$name.log"; fail "$name: megamoe-run exited with $?"; }
  [ "$(events "$name" failure)" -eq "$kills" ] ||
    fail "$name: $(events "$name" failure) failures logged for $kills kills"
  echo "$name: $kills kills at random moments, $(events "$name" restart) restarts, resumed from" \
    "iterations $(grep -o '"resume_iteration":[0-9a-z]*' "$name/supervisor.jsonl" | cut -d: -f2 | tr '\n' ' ')"
}

# On 1 rank: 5 kills.
"$mpiexec" -n 1 "$train" "${common[@]}" --steps 1500 --out whole1 >whole1.log 2>&1 || fail "the 1-rank run"
soak soak1 1 5 --steps 1500
diff <(losses whole1/metrics.jsonl) <(losses soak1/metrics.jsonl) >/dev/null ||
  fail "soak1: the losses differ from the uninterrupted run's"
cmp whole1/model.safetensors soak1/model.safetensors || fail "soak1: the final weights differ"
echo "soak1: 1500 losses and the final weights equal the uninterrupted run's, bit for bit"

# On 2 ranks (EP 2): 5 kills.
"$mpiexec" -n 2 "$train" "${common[@]}" --ep 2 --steps 1000 --out whole2 >whole2.log 2>&1 ||
  fail "the 2-rank run"
soak soak2 2 5 --ep 2 --steps 1000
diff <(losses whole2/metrics.jsonl) <(losses soak2/metrics.jsonl) >/dev/null ||
  fail "soak2: the losses differ from the uninterrupted run's"
cmp whole2/model.safetensors soak2/model.safetensors || fail "soak2: the final weights differ"
echo "soak2: 1000 losses and the final weights equal the uninterrupted run's, bit for bit"

# 4 ranks on two "nodes" lose one: relaunched on 2 with the listed layout.
export MEGAMOE_RANKS_PER_NODE=2
four=(--ep 4 --global-batch 16 --steps 60)
"$mpiexec" -n 4 "$train" "${common[@]}" "${four[@]}" --out whole4 >whole4.log 2>&1 || fail "the 4-rank run"
echo "localhost slots=4" >hosts
# Rank 0 slowed by 25 ms a step (the numbers are untouched), so the kill lands mid-run.
MEGAMOE_FAULT=slow:0:25 "$run" -n 4 --min-ranks 2 --layout 2:--ep=2 --hostfile hosts --restart-delay 0.2 --launcher "$mpiexec" \
  -- "$train" "${common[@]}" "${four[@]}" --out fewer --save fewer-ckpt --save-interval 10 >fewer.log 2>&1 &
pid=$!
until grep -qs '^[1-9]' fewer-ckpt/latest_checkpointed_iteration.txt; do
  kill -0 $pid 2>/dev/null || fail "fewer: the job ended before its first save"
  sleep 0.05
done
echo "localhost slots=2" >hosts  # a node is gone
victims=($(ranks_of $pid))
kill -KILL "${victims[3]}"
wait $pid || { cat fewer.log; fail "fewer: megamoe-run exited with $?"; }
grep -q '"event":"launch","attempt":1,"ranks":2' fewer/supervisor.jsonl ||
  fail "fewer: no relaunch on 2 ranks"
from=$(grep -o '"resume_iteration":[0-9]*' fewer/supervisor.jsonl | tail -1 | cut -d: -f2)
[ -n "$from" ] || fail "fewer: the relaunch loaded no checkpoint"
grep -a "resumed from iteration $from" fewer.log >/dev/null || fail "fewer: no 'resumed from iteration $from'"
# By hand: the same checkpoint loaded on 2 ranks with EP 2.
cp -r fewer-ckpt by-hand-ckpt
echo "$from" >by-hand-ckpt/latest_checkpointed_iteration.txt
"$mpiexec" -n 2 "$train" --sample-bytes 0 --data "$corpus" --ep 2 --load by-hand-ckpt --out by-hand \
  >by-hand.log 2>&1 || { cat by-hand.log; fail "by hand: 2 ranks from iteration $from"; }
cmp by-hand/model.safetensors fewer/model.safetensors ||
  fail "fewer: the relaunch on 2 ranks differs from loading iteration $from on 2 ranks by hand"
paste <(losses whole4/metrics.jsonl) <(losses fewer/metrics.jsonl) | awk '
  { d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-5 * $2) { bad = 1; print "step " $1 ": " $2 " vs " $4 } }
  END { exit bad }' || fail "fewer: 2 ranks continue the 4-rank run beyond 1e-5"
echo "fewer: 4 ranks relaunched on 2 from iteration $from (--layout 2:--ep=2), as the same load by hand," \
  "losses within 1e-5 of the 4-rank run"
unset MEGAMOE_RANKS_PER_NODE

# SIGTERM to megamoe-run: SIGUSR1 through mpiexec, every rank saves, exit 0.
"$run" -n 2 --launcher "$mpiexec" -- "$train" "${common[@]}" --ep 2 --steps 100000 --out term \
  --save term-ckpt --save-interval 50000 >term.log 2>&1 &
pid=$!
until grep -qs '"step":3,' term/metrics.jsonl; do
  kill -0 $pid 2>/dev/null || fail "term: the job ended"
  sleep 0.05
done
kill -TERM $pid
wait $pid || { cat term.log; fail "term: megamoe-run exited with $?"; }
grep -a "SIGUSR1: saved after step" term.log >/dev/null || fail "term: no 'SIGUSR1: saved after step'"
step=$(cat term-ckpt/latest_checkpointed_iteration.txt)
[ "$step" -ge 3 ] || fail "term: saved iteration '$step'"
[ "$(events term stopped)" -eq 1 ] || fail "term: no 'stopped' event"
echo "term: SIGTERM to megamoe-run saved iteration $step on both ranks and exited 0"

# A job that keeps failing: --max-restarts 2 relaunches, then its exit status.
set +e
"$run" -n 1 --max-restarts 2 --restart-delay 0 --launcher "$mpiexec" -- "$train" "${common[@]}" \
  --steps 5 --lr -1 --out failing >failing.log 2>&1
status=$?
set -e
[ "$status" -eq 1 ] || fail "failing: megamoe-run exited with $status"
[ "$(events failing failure)" -eq 3 ] && [ "$(events failing gave_up)" -eq 1 ] ||
  fail "failing: not 3 failures and a 'gave_up'"
echo "failing: 3 launches, then megamoe-run gave up with the job's exit status"
echo "supervised: passed"
