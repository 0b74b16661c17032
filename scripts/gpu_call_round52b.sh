#!/usr/bin/env bash
# Round 52, call 2 (#21, #29): the graph feed (now on by default) against --no-graph-feed;
# --graph-advance with the engine's count of replays whose inputs were kept (`inputs kept` on
# each sweep line: 0 means the upload was never skipped); --fused-hoist (the fused attention's
# RoPE angles and norm weights before its wait) on 0.6B batches 1 and 8, 1.7B and the 30B-A3B
# shape (8 layers) at batch 1; kernel_check --model-only (the fused attention's hoist cases bit
# for bit); graph_check's stress run on the new defaults.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round52b.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; echo "models t=$((SECONDS - T0))"
sweep d06 110 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "" "--no-graph-feed" \
  "--graph-advance" "--fused-hoist" "--fused-hoist --graph-advance"
left && { timeout "$(cap 100)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 400 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
left && mix_model
kc kcm 120 --model-only --model-dir /tmp/m-mix
echo "hoist checks: $(grep -c "hoist" "$OUT/kcm.log"), failed: $(grep "hoist" "$OUT/kcm.log" | grep -c FAIL)"
left && model 1.7b
sweep d17 70 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128" "" "--fused-hoist"
left && moe_model 8
sweep moe8 80 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128" "" "--fused-hoist"
echo "done t=$((SECONDS - T0))"
