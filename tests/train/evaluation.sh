#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train's evaluation and progress off a terminal: with --eval-interval 4 over 12 steps, the
# valid split is evaluated after steps 4, 8 and 12 (metrics.jsonl carries it on exactly those
# lines, with the loss per token and the perplexity), and the log gets one progress line per
# interval with no carriage return; --eval-iters 1 measures other samples than the default 10, and
# --eval-iters 0 none (the final line's held-out values null); --sample-bytes sets the sample's
# length, in whole tokens (0: none); a negative interval is an error.
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
"$train" "${common[@]}" --eval-iters 0 --sample-bytes 0 --out none >none.log 2>&1 ||
  { cat none.log; fail "--eval-iters 0"; }
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
[ "$(grep -ac '"heldout_loss":[0-9.]*,"heldout_ppl":[0-9.]*' all/metrics.jsonl)" = 3 ] ||
  fail "no loss per token and perplexity beside the bits per byte"
grep -aq '"heldout_bpb":null,"unigram_bpb":null' none.log || fail "--eval-iters 0 evaluated"
[ "$(grep -ac '"heldout_bpb"' none/metrics.jsonl)" = 0 ] || fail "--eval-iters 0 wrote held-out values"

# Bytes of whole tokens: at least the length asked for (an end of document ends it sooner), and
# with the byte tokenizer at most a replacement character (3 bytes) more.
all_bytes=$(sample_bytes all.log) five_bytes=$(sample_bytes five.log)
[ "$all_bytes" -ge 5 ] && [ "$all_bytes" -le 206 ] || fail "the default sample holds $all_bytes bytes"
[ "$five_bytes" -ge 5 ] && [ "$five_bytes" -le 11 ] || fail "--sample-bytes 5 wrote $five_bytes bytes"
if grep -aq '^sample:' one.log; then fail "--sample-bytes 0 wrote a sample"; fi
grep -aq '^{"final":' one.log || fail "no final line with --sample-bytes 0"

a=$(final all.log) o=$(final one.log)
echo "valid bits/byte: --eval-iters 10 $a, --eval-iters 1 $o"
[ "$a" != "$o" ] || fail "--eval-iters 1 measures what --eval-iters 10 does"

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
