#!/usr/bin/env bash
# On the GPU machine (#24): verify steps on the decode graphs against eager one-step decoding
# (graph_check --verify-only), then speculative decoding's speed against its acceptance
# (bench --spec-ks: drafts replayed from the model's own greedy continuation with a fraction
# of positions corrupted), per shape, K and batch, next to plain decode in the same engine.
# SHAPES (default "0.6b 1.7b"), KS (2,4,8), BATCHES (1,8,64), SPEC_MAX_BATCH (8), BACKOFF=1 (K 4
# with --spec-backoff at batch 1 and 8), HTTP=1 adds
# scripts/gpu_spec.sh (greedy answers over HTTP with and without n-gram speculation).
set -u
source scripts/gpu_lib.sh
for shape in ${SHAPES:-0.6b 1.7b}; do
  model $shape
  if [ $shape = 0.6b ]; then
    echo "== graph_check --verify-only ($shape)" | tee -a "$S"
    timeout 120 .gpu/graph_check --model-dir /tmp/m-$shape --verify-only > "$OUT/verify-$shape.log" 2>&1
    echo "exit $?" >> "$OUT/verify-$shape.log"
    grep -E "^\||graph-check|exit|Error|error" "$OUT/verify-$shape.log" | tee -a "$S"
  fi
  echo "== bench --spec-ks ${KS:-2,4,8} ($shape)" | tee -a "$S"
  timeout 300 .gpu/bench --model-dir /tmp/m-$shape --no-peer --batches ${BATCHES:-1,8,64} \
    --prompt 512 --new 128 --spec-ks ${KS:-2,4,8} --spec-max-batch ${SPEC_MAX_BATCH:-8} \
    > "$OUT/spec-$shape.log" 2>&1
  echo "exit $?" >> "$OUT/spec-$shape.log"
  grep -E "^\||^#|exit|Error|error" "$OUT/spec-$shape.log" | tee -a "$S"
  if [ "${BACKOFF:-1}" = 1 ]; then
    echo "== bench --spec-ks 4 --spec-backoff ($shape)" | tee -a "$S"
    timeout 200 .gpu/bench --model-dir /tmp/m-$shape --no-peer --batches 1,8 \
      --prompt 512 --new 128 --spec-ks 4 --spec-backoff > "$OUT/spec-backoff-$shape.log" 2>&1
    echo "exit $?" >> "$OUT/spec-backoff-$shape.log"
    grep -E "^\||^#|exit|Error|error" "$OUT/spec-backoff-$shape.log" | tee -a "$S"
  fi
done
if [ "${HTTP:-0}" = 1 ]; then
  SHAPE=0.6b bash scripts/gpu_spec.sh
  echo "== sampled, temperature 0.3, seeded" | tee -a "$S"
  SHAPE=0.6b TEMPERATURE=0.3 bash scripts/gpu_spec.sh
fi
