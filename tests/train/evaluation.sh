#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train's evaluation and progress off a terminal: with --eval-interval 4 over 12 steps, the
# held-out bits per byte is measured after steps 4, 8 and 12 (metrics.jsonl carries it on exactly
# those lines), and the log gets one progress line per interval with no carriage return; an
# --eval-iters that covers every held-out window measures what the default (every window) does,
# one that covers fewer measures something else; --sample-bytes sets the sample's length (0: none);
# a negative interval is an error.
#   evaluation.sh MEGAMOE_TRAIN CORPUS WORKDIR
set -euo pipefail
train=$(realpath "$1") corpus=$(realpath "$2") work=$3
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset tiny --seq-len 32 --micro-batch 4 --steps 12 --eval-interval 4)
fail() { echo "FAILED: $*"; exit 1; }
final() { grep -a '"final"' "$1" | sed -E 's/.*"heldout_bpb":([^,]+),.*/\1/'; }
# The bytes between "sample:" and the final line, less the line end printed after the sample.
sample_bytes() { LC_ALL=C sed -n '/^sample:$/,/^{"final"/p' "$1" | LC_ALL=C sed '1d;$d' | head -c -1 | wc -c; }

"$train" "${common[@]}" --out all >all.log 2>&1 || { cat all.log; fail "default --eval-iters"; }
"$train" "${common[@]}" --eval-iters 100000 --out many >many.log 2>&1 ||
  { cat many.log; fail "--eval-iters 100000"; }
"$train" "${common[@]}" --eval-iters 1 --sample-bytes 0 --out one >one.log 2>&1 ||
  { cat one.log; fail "--eval-iters 1"; }
"$train" "${common[@]}" --eval-iters 1 --sample-bytes 5 --out five >five.log 2>&1 ||
  { cat five.log; fail "--sample-bytes 5"; }

# The progress part of the log (the generated sample after it may hold any byte).
sed '/^sample:/q' all.log >progress.log
if grep -q $'\r' progress.log; then fail "carriage returns in a log"; fi
progress=$(grep -aE '^step [0-9]+/12 \[' progress.log | sed -E 's/^step ([0-9]+)\/.*/\1/' | tr '\n' ' ')
[ "$progress" = "4 8 12 " ] || fail "progress lines after steps '$progress', expected '4 8 12 '"
[ "$(grep -ac '^  held-out .* bits/byte (unigram' progress.log)" = 3 ] || fail "not three held-out lines"
[ "$(wc -l <all/metrics.jsonl)" = 12 ] || fail "metrics.jsonl does not hold 12 lines"
evaluated=$(grep -a '"heldout_bpb"' all/metrics.jsonl | sed -E 's/^\{"step":([0-9]+),.*/\1/' |
  tr '\n' ' ')
[ "$evaluated" = "4 8 12 " ] || fail "held-out in metrics.jsonl at steps '$evaluated'"

[ "$(sample_bytes all.log)" = 204 ] || fail "the default sample is not the prompt and 200 bytes"
[ "$(sample_bytes five.log)" = 9 ] || fail "--sample-bytes 5 wrote $(sample_bytes five.log) bytes, not 4 + 5"
if grep -aq '^sample:' one.log; then fail "--sample-bytes 0 wrote a sample"; fi
grep -aq '^{"final":' one.log || fail "no final line with --sample-bytes 0"

a=$(final all.log) m=$(final many.log) o=$(final one.log)
echo "held-out bits/byte: every window $a, --eval-iters 100000 $m, --eval-iters 1 $o"
[ "$a" = "$m" ] || fail "--eval-iters beyond every window measures $m, not $a"
[ "$a" != "$o" ] || fail "--eval-iters 1 measures what every window does"

if "$train" --data "$corpus" --preset tiny --steps 2 --eval-interval=-1 --out bad >bad.log 2>&1; then
  fail "--eval-interval -1 ran"
fi
grep -aq -- "--eval-interval, --eval-iters and --sample-bytes cannot be negative" bad.log ||
  fail "no error message"
if "$train" --data "$corpus" --preset tiny --steps 2 --sample-bytes=-1 --out bad >bad.log 2>&1; then
  fail "--sample-bytes -1 ran"
fi
grep -aq -- "--sample-bytes cannot be negative" bad.log || fail "no error message for --sample-bytes"
echo "evaluation: passed"
