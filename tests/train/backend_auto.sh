#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train --precision bf16 --backend auto takes the fastest BF16 unit /proc/cpuinfo lists
# (amx_bf16, then avx512_bf16, else grouped) and says so in its start-up line and final JSON;
# with both units turned off it takes grouped. Every unit's run follows the grouped backend's
# losses (the same BF16 operands, sums in another order): the first step's within 1e-5, the next
# three (which the summation order's differences feed) within 1e-3.
#   backend_auto.sh MEGAMOE_TRAIN CORPUS WORKDIR
set -euo pipefail
train=$(realpath "$1") corpus=$(realpath "$2") work=$3
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset small --seq-len 32 --micro-batch 4 --eval-iters 1 --steps 4
  --precision bf16)
fail() { echo "FAILED: $*"; exit 1; }
expected=grouped
grep -qw avx512_bf16 /proc/cpuinfo && expected=avx512_bf16
grep -qw amx_bf16 /proc/cpuinfo && expected=amx
field() { grep -o "\"$1\":\"[a-z0-9_]*\"" "$2" | head -1 | cut -d'"' -f4; }
"$train" --sample-bytes 0 "${common[@]}" --out auto >auto.log 2>&1 || { cat auto.log; fail "the auto run"; }
[ "$(field backend auto.log)" = "$expected" ] ||
  fail "auto took $(field backend auto.log), /proc/cpuinfo says $expected"
grep -aq "precision bf16 on $expected" auto.log || fail "the start-up line does not name $expected"
MEGAMOE_DISABLE_AMX=1 MEGAMOE_DISABLE_AVX512=1 "$train" --sample-bytes 0 "${common[@]}" --out off >off.log 2>&1 ||
  fail "the run with both units off"
[ "$(field backend off.log)" = grouped ] || fail "with both units off auto took $(field backend off.log)"
"$train" --sample-bytes 0 "${common[@]}" --backend grouped --out grouped >grouped.log 2>&1 || fail "the grouped run"
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\2/' "$1/metrics.jsonl"; }
for unit in avx512_bf16 amx; do
  grep -qw "${unit/amx/amx_bf16}" /proc/cpuinfo || { echo "$unit: not on this CPU"; continue; }
  "$train" --sample-bytes 0 "${common[@]}" --backend "$unit" --out "$unit" >"$unit.log" 2>&1 ||
    { cat "$unit.log"; fail "the $unit run"; }
  paste <(losses grouped) <(losses "$unit") |
    awk -v u="$unit" '{ d = $1 - $2; if (d < 0) d = -d; bound = NR == 1 ? 1e-5 : 1e-3
      if (d > bound * $1) { print u ": step " NR " loss " $2 " vs grouped " $1; bad = 1 } }
      END { exit bad }' || fail "$unit's losses leave the grouped backend's"
  echo "$unit: step 1's loss within 1e-5 of the grouped backend's, the next within 1e-3:" \
    "$(losses "$unit" | tr '\n' ' ')"
done
echo "backend auto: passed"
