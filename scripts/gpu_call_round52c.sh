#!/usr/bin/env bash
# Round 52, call 3 (#29, #21): --moe-down-lean (the ranked MoE down + sum in 96 registers, its
# act values loaded as used, so the next layer's norm + qkv blocks fit beside it and load their
# weights before their wait) and --norm-preload (the 1-2-row block norm's weights loaded before
# the wait: the qkv of 1.7B and the 30B-A3B shape) against the defaults: the 30B-A3B shape (8
# layers, batches 1 and 8), 1.7B (batches 1 and 2); kernel_check --model-only (the lean down +
# sum bit for bit against the ranked one, and its time alone) and --gemv-only (the preloaded
# norms bit for bit against the plain ones); graph_check's stress run with both on the 8-layer
# model.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round52c.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
moe_model 8; echo "models t=$((SECONDS - T0))"
sweep moe8 120 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1,8 --new 128" "" "--moe-down-lean" \
  "--norm-preload" "--moe-down-lean --norm-preload"
left && model 1.7b
sweep d17 80 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128" "" "--norm-preload"
left && mix_model
kc kcm 120 --model-only --model-dir /tmp/m-mix
echo "lean checks: $(grep -c "lean = ranked" "$OUT/kcm.log"), failed: $(grep "lean = ranked" "$OUT/kcm.log" | grep -c FAIL)"
grep "moe timing" "$OUT/kcm.log"
left && model 0.6b
kc kcg 100 --gemv-only --model-dir /tmp/m-0.6b
echo "preload checks: $(grep -c "preload" "$OUT/kcg.log"), failed: $(grep "preload" "$OUT/kcg.log" | grep -c FAIL)"
left && { timeout "$(cap 100)" .gpu/graph_check --model-dir /tmp/m-moe8 --stress-steps 200 --moe-down-lean \
  --norm-preload > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
