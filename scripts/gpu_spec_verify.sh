#!/usr/bin/env bash
# On the GPU machine (#24, part 3): the shared-K/V verify attention and the acceptance on the
# device (kernel_check --verify-only; graph_check --verify-only --shared-kv-verify), then
# speculation's speed at 0% and ~100% acceptance with and without the shared-K/V verify (and
# with --gemv-mma: tensor-core matmuls for the 3-8-row steps), and the draft-model method:
# 0.6B drafting for 1.7B, and 1.7B drafting for itself (the mechanics' ceiling).
# SHAPES (default "0.6b 1.7b"), BATCHES (1,8,64), DRAFT=0 skips the draft-model rows.
set -u
source scripts/gpu_lib.sh
echo "== kernel_check --verify-only" | tee -a "$S"
model 0.6b
timeout 120 .gpu/kernel_check --model-dir /tmp/m-0.6b --verify-only > "$OUT/kcheck.log" 2>&1
echo "exit $?" >> "$OUT/kcheck.log"
grep -E "FAIL|kernel-check|exit|rror" "$OUT/kcheck.log" | tee -a "$S"
echo "== graph_check --verify-only --shared-kv-verify (0.6b)" | tee -a "$S"
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --verify-only --shared-kv-verify \
  > "$OUT/verify-0.6b.log" 2>&1
echo "exit $?" >> "$OUT/verify-0.6b.log"
grep -E "^\||graph-check|exit|rror" "$OUT/verify-0.6b.log" | tee -a "$S"
for shape in ${SHAPES:-0.6b 1.7b}; do
  model $shape
  for flags in "" "--shared-kv-verify" "--shared-kv-verify --gemv-mma"; do
    name=$(echo "$shape$flags" | tr -d ' -')
    echo "== bench --spec-ks 4 $flags ($shape)" | tee -a "$S"
    timeout 240 .gpu/bench --model-dir /tmp/m-$shape --no-peer --batches ${BATCHES:-1,8,64} \
      --prompt 512 --new 128 --spec-ks 4 --spec-corrupt 1,0 --spec-max-batch 8 $flags \
      > "$OUT/spec-$name.log" 2>&1
    echo "exit $?" >> "$OUT/spec-$name.log"
    grep -E "^\||^#|exit|rror" "$OUT/spec-$name.log" | tee -a "$S"
  done
done
if [ "${DRAFT:-1}" = 1 ]; then
  model 1.7b
  for d in 0.6b 1.7b; do
    echo "== bench 1.7b --spec-ks 4 --spec-draft $d --shared-kv-verify" | tee -a "$S"
    timeout 240 .gpu/bench --model-dir /tmp/m-1.7b --no-peer --batches 1,8 --prompt 512 \
      --new 128 --spec-ks 4 --spec-draft /tmp/m-$d --shared-kv-verify \
      > "$OUT/draft-$d.log" 2>&1
    echo "exit $?" >> "$OUT/draft-$d.log"
    grep -E "^\||^#|exit|rror" "$OUT/draft-$d.log" | tee -a "$S"
  done
fi
