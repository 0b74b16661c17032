#!/usr/bin/env bash
# On the GPU machine (#26): kernel_check (mask_tokens_f32 among the rest; CHECK=0 skips it),
# then decode tok/s with every row constrained (tool_choice required over
# tests/fixtures/tools/nested.json) next to unconstrained in one bench run, and the host's
# time per mask per row (whole and split). PROFILE=1 adds a profiled run (0.6B, batches 1 and
# 64: where a constrained step's time goes). EXTRA: more bench flags (--grammar-mask-parts 1).
# COMPARE=1: each shape's bench again with --no-grammar-bounded-strings (masks walked as
# llguidance walks them), its lines tagged "walked". FF=1: again with --grammar-fast-forward
# (forced tokens as drafts; batches 1 and 8 only: speculation pauses above 8), tagged "ff".
set -u
source scripts/gpu_lib.sh
if [ "${CHECK:-1}" = 1 ]; then
  model 0.6b
  timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1
  grep -E "mask_tokens|checks|failed" "$OUT/kernel_check.log" | tail -4 | tee -a "$S"
fi
for shape in ${SHAPES:-0.6b}; do
  timeout 300 .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches ${BATCHES:-1,8,64,256} \
    --new ${NEW:-128} --prompt 256 --no-peer --constrained ${EXTRA:-} > "$OUT/bench-$shape.log" 2>&1
  grep -E "^(ours|constrained) decode|grammar|mask" "$OUT/bench-$shape.log" | sed "s/^/$shape /" | tee -a "$S"
  if [ "${COMPARE:-0}" = 1 ]; then
    timeout 300 .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches ${BATCHES:-1,8,64,256} \
      --new ${NEW:-128} --prompt 256 --no-peer --constrained --no-grammar-bounded-strings ${EXTRA:-} \
      > "$OUT/bench-$shape-walked.log" 2>&1
    grep -E "^(ours|constrained) decode|mask" "$OUT/bench-$shape-walked.log" | sed "s/^/$shape walked /" | tee -a "$S"
  fi
  if [ "${FF:-0}" = 1 ]; then
    timeout 300 .gpu/bench --config tests/fixtures/qwen3/config-$shape.json --batches 1,8 \
      --new ${NEW:-128} --prompt 256 --no-peer --constrained --grammar-fast-forward ${EXTRA:-} \
      > "$OUT/bench-$shape-ff.log" 2>&1
    grep -E "^(ours|constrained) decode" "$OUT/bench-$shape-ff.log" | sed "s/^/$shape ff /" | tee -a "$S"
  fi
done
if [ "${PROFILE:-0}" = 1 ]; then
  RUST_LOG=policy_serve::profile=info timeout 200 .gpu/bench --config tests/fixtures/qwen3/config-0.6b.json \
    --batches 1,64 --new 128 --prompt 256 --no-peer --constrained --profile-steps 100 ${EXTRA:-} \
    > "$OUT/bench-profile.log" 2>&1
  grep -E "^(ours|constrained) decode|step profile" "$OUT/bench-profile.log" | tee -a "$S"
fi
