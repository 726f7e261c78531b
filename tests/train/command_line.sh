#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The training job's command line under mpiexec -n 2: --help printed once, its groups in order
# (model and data, parallelism, precision, checkpoints, output) and the presets' own defaults
# noted; a parse error printed once with a non-zero exit; --version on every installed program; a
# flag that depends on one not given warned about once and accepted; a program of one
# configuration type (my-model) refuses a recipe or a backend its type does not hold, describes
# its type and trains it.
#   command_line.sh MPIEXEC MEGAMOE_TRAIN MY_MODEL MEGAMOE_CHECKPOINT MEGAMOE_LAYOUT CORPUS WORKDIR
set -euo pipefail
mpiexec=$1 train=$(realpath "$2") my_model=$(realpath "$3") checkpoint=$(realpath "$4")
layout=$(realpath "$5") corpus=$(realpath "$6") work=$7
rm -rf "$work"
mkdir -p "$work"
cd "$work"
fail() { echo "FAILED: $*"; exit 1; }
two() { "$mpiexec" --oversubscribe -n 2 "$@"; }

two "$train" --help >help.log 2>&1 || { cat help.log; fail "--help exited non-zero"; }
[ "$(grep -c '^megamoe-train: train a byte-level' help.log)" = 1 ] ||
  { cat help.log; fail "--help not printed exactly once by 2 ranks"; }
groups=$(grep -oE '^(Model and data|Parallelism|Precision|Checkpoints|Output):' help.log | tr '\n' ' ')
[ "$groups" = "Model and data: Parallelism: Precision: Checkpoints: Output: " ] ||
  fail "option groups '$groups'"
grep -q -- '--steps.*(qwen3: 120, mixtral: 160, deepseek: 100)' help.log ||
  fail "--steps' help does not give the presets' defaults"
grep -q -- '--seq-len.*(medium: 256)' help.log || fail "--seq-len's help lacks medium's default"

if two "$train" --no-such-flag >bad.log 2>&1; then fail "an unknown flag was accepted"; fi
[ "$(grep -c 'no-such-flag' bad.log)" = 1 ] || { cat bad.log; fail "parse error not printed once"; }

for program in "$train" "$checkpoint" "$layout" "$my_model"; do
  "$program" --version >version.log 2>&1 || fail "$program --version exited non-zero"
  grep -qE "^$(basename "$program") \(megamoe [0-9]+\.[0-9]+\.[0-9]+\)$" version.log ||
    { cat version.log; fail "$program --version printed '$(cat version.log)'"; }
done

for flags in "--save-interval 5" "--finetune" "--no-load-optim"; do
  # shellcheck disable=SC2086
  two "$train" --describe $flags >warn.log 2>&1 || { cat warn.log; fail "$flags was refused"; }
  [ "$(grep -c "warning: ${flags%% *} without" warn.log)" = 1 ] ||
    { cat warn.log; fail "$flags alone not warned about exactly once"; }
  grep -q '"preset":"small"' warn.log || fail "$flags: no description printed"
done
two "$train" --describe --save x --save-interval 5 >nowarn.log 2>&1 || fail "--save with an interval"
if grep -q warning nowarn.log; then fail "--save-interval with --save warned"; fi

# A program of one configuration type: its recipe and backend are the type's.
"$my_model" --describe >describe.log 2>&1 || { cat describe.log; fail "my-model --describe"; }
grep -q '"fp8_recipe":"tensorwise"' describe.log || { cat describe.log; fail "my-model's recipe"; }
grep -q '"backend":"grouped"' describe.log || fail "my-model's backend"
if two "$my_model" --precision fp32 >recipe.log 2>&1; then fail "my-model ran under fp32"; fi
grep -q 'this program is built for --precision fp8_current' recipe.log ||
  { cat recipe.log; fail "my-model --precision fp32: $(cat recipe.log)"; }
if two "$my_model" --backend amx --precision fp8_current >backend.log 2>&1; then
  fail "my-model ran on amx"
fi
grep -q 'this program is built for --backend grouped' backend.log || fail "my-model --backend amx"
if "$my_model" --fp8-param-gather >codes.log 2>&1; then fail "my-model held codes"; fi
grep -q 'holds the linear weights in full precision' codes.log || fail "my-model --fp8-param-gather"
two "$my_model" --data "$corpus" --ep 2 --steps 3 --seq-len 32 --micro-batch 4 --out my \
  >my.log 2>&1 || { cat my.log; fail "my-model at EP 2"; }
grep -q '^{"final":{"steps":3,"precision":"fp8_current","backend":"grouped",' my.log ||
  { cat my.log; fail "my-model's final line"; }
[ "$(wc -l <my/metrics.jsonl)" = 3 ] || fail "my-model's metrics.jsonl"
echo "command line: passed"
