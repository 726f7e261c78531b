#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# megamoe-train with Adam's moments in BF16 (the reference's --use-precision-aware-optimizer
# --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16), against the same run with fp32 moments:
#   - the final JSON reports half the moments' bytes, and that half as saved;
#   - the rounding is felt (some step's loss differs) but the held-out bits per byte after 30 steps
#     stay within 1 % of fp32's;
#   - saved at iteration 4 of 8 and resumed (the dtype from the checkpoint, where the moments are
#     BF16 tensors), every loss and the final weights equal the uninterrupted run's, bit for bit;
#   - a checkpoint of fp32 moments resumes with BF16 ones, and one of BF16 moments with fp32 ones
#     (converted, and said so).
#   - megamoe-checkpoint exports such a checkpoint with its BF16 moments and imports it back to one
#     that resumes with the same bits.
#   bf16_moments.sh MEGAMOE_TRAIN CORPUS WORKDIR MEGAMOE_CHECKPOINT
set -euo pipefail
train=$(realpath "$1") corpus=$(realpath "$2") work=$3 tool=$(realpath "$4")
rm -rf "$work"
mkdir -p "$work"
cd "$work"
common=(--data "$corpus" --preset small --seq-len 32 --micro-batch 4 --eval-iters 2)
bf16=(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16)
losses() { sed -E 's/^\{"step":([0-9]+),"loss":([^,]+),.*/\1 \2/' "$1"; }
final() { grep -a '^{"final"' "$1" | grep -o "\"$2\":[^,}]*" | cut -d: -f2; }
fail() { echo "FAILED: $*"; exit 1; }

"$train" --sample-bytes 0 "${common[@]}" --steps 30 --out fp32 >fp32.log 2>&1 || { cat fp32.log; fail "fp32 moments"; }
"$train" --sample-bytes 0 "${common[@]}" --steps 30 "${bf16[@]}" --out bf16 >bf16.log 2>&1 ||
  { cat bf16.log; fail "bf16 moments"; }
grep -aq 'Adam moments bf16' bf16.log || fail "the start-up line does not name bf16 moments"
fp32_bytes=$(final fp32.log optimizer_state_bytes) bf16_bytes=$(final bf16.log optimizer_state_bytes)
bf16_saved=$(final bf16.log optimizer_state_bytes_saved) fp32_saved=$(final fp32.log optimizer_state_bytes_saved)
echo "moments: fp32 $fp32_bytes bytes, bf16 $bf16_bytes bytes ($bf16_saved saved)"
awk -v a="$fp32_bytes" -v b="$bf16_bytes" -v s="$bf16_saved" -v z="$fp32_saved" \
  'BEGIN { exit !(a > 0 && 2 * b == a && s == b && z == 0) }' ||
  fail "the moments' bytes are not halved, or the bytes saved are wrong"
cmp -s <(losses fp32/metrics.jsonl) <(losses bf16/metrics.jsonl) &&
  fail "bf16 moments gave the fp32 moments' losses: no rounding"
fp32_bpb=$(final fp32.log heldout_bpb) bf16_bpb=$(final bf16.log heldout_bpb)
echo "held-out after 30 steps: fp32 moments $fp32_bpb, bf16 moments $bf16_bpb bits per byte"
awk -v a="$fp32_bpb" -v b="$bf16_bpb" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d < 0.01) }' ||
  fail "bf16 moments' held-out differs from fp32's by 1 % or more"

# Bit-for-bit resume, the dtype taken from the checkpoint.
"$train" --sample-bytes 0 "${common[@]}" --steps 8 "${bf16[@]}" --out whole >whole.log 2>&1 || fail "8 steps"
"$train" --sample-bytes 0 "${common[@]}" --steps 8 "${bf16[@]}" --out run --save ckpt --save-interval 4 >run.log 2>&1 ||
  fail "the run that saves"
echo 4 >ckpt/latest_checkpointed_iteration.txt
# In the index each tensor's "dtype" is the line after its name.
index=ckpt/iter_0000004/index.json
moments=$(grep -c '^ *"optimizer.exp_avg[_a-z]*\.' "$index")
bf16_moments=$(grep -A1 '^ *"optimizer.exp_avg[_a-z]*\.' "$index" | grep -c '"dtype": "BF16"')
[ "$moments" -gt 0 ] && [ "$moments" = "$bf16_moments" ] &&
  grep -A1 '^ *"decoder.layers.0.self_attention.linear_qkv.weight"' "$index" | grep -q '"F32"' ||
  fail "the checkpoint's moments are not BF16 tensors beside F32 weights"
"$train" --sample-bytes 0 --data "$corpus" --out run --load ckpt >resume.log 2>&1 || { cat resume.log; fail "resume"; }
grep -aq 'Adam moments bf16' resume.log || fail "the resumed run did not keep bf16 moments"
cmp -s <(losses whole/metrics.jsonl) <(losses run/metrics.jsonl) ||
  fail "the resumed losses differ from the uninterrupted run's"
cmp -s whole/model.safetensors run/model.safetensors || fail "the final weights differ"
echo "resumed with bf16 moments: 8 losses and the final weights equal, bit for bit"
"$tool" export ckpt all.safetensors --optimizer >/dev/null || fail "export --optimizer"
"$tool" import all.safetensors imported >/dev/null || fail "import"
"$train" --sample-bytes 0 --data "$corpus" --out from-import --load imported >from-import.log 2>&1 ||
  { cat from-import.log; fail "resume from the imported checkpoint"; }
cmp -s whole/model.safetensors from-import/model.safetensors ||
  fail "export and import changed the training state"
echo "exported and imported with bf16 moments: the same final weights"

# fp32 moments saved, bf16 moments loaded.
"$train" --sample-bytes 0 "${common[@]}" --steps 8 --out fp32-run --save fp32-ckpt --save-interval 4 >fp32-run.log 2>&1 ||
  fail "the fp32 run that saves"
echo 4 >fp32-ckpt/latest_checkpointed_iteration.txt
"$train" --sample-bytes 0 --data "$corpus" "${bf16[@]}" --out converted --load fp32-ckpt >converted.log 2>&1 ||
  { cat converted.log; fail "resuming fp32 moments as bf16"; }
grep -aq 'Adam moments converted from fp32 to bf16' converted.log || fail "no conversion reported"
# And back: the bf16 checkpoint's moments widened into fp32 ones.
"$train" --sample-bytes 0 --data "$corpus" --exp-avg-dtype fp32 --exp-avg-sq-dtype fp32 --out widened --load ckpt \
  >widened.log 2>&1 || { cat widened.log; fail "resuming bf16 moments as fp32"; }
grep -aq 'Adam moments converted from bf16 to fp32' widened.log || fail "no widening reported"
echo "bf16 moments: passed"
