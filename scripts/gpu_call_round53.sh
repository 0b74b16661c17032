#!/usr/bin/env bash
# Round 53, call 1 (#21, #29): the floors on the defaults (the graph feed on), with
# --fused-merge-weights (the fused attention's cluster merge with its weights formed once a
# partial: the same bits) and --no-graph-feed beside them, on whatever GPU is lent (the floors
# are stated on the H200: say which card gave each row): 0.6B and 1.7B at batches 1 and 8 after
# 512-token prompts, the 30B-A3B shape at 8 layers (batch 1); kernel_check --model-only with
# the merge weights (its fused cases must equal the unfused kernels' bits); graph_check's
# stress run on the 8-layer MoE model with the like-with-like probe (c478cdb).
# The 48-layer row is call 2 (gpu_call_round53b.sh).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round53.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; moe_model 8; echo "models t=$((SECONDS - T0))"
sweep d06 110 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "" "--fused-merge-weights" "--no-graph-feed"
sweep d17 100 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128" "" "--fused-merge-weights"
left && kc kcmw 100 --model-dir /tmp/m-0.6b --model-only --fused-merge-weights
left && echo "fused checks: $(grep -ci "fused" "$OUT/kcmw.log"), failed: $(grep -i "fused" "$OUT/kcmw.log" | grep -c FAIL)"
sweep moe8 70 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128" "" "--fused-merge-weights"
left && { timeout "$(cap 100)" .gpu/graph_check --model-dir /tmp/m-moe8 --stress-steps 200 > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic|stress|probe" "$OUT/gc.log" | cut -c1-400 | head; }
echo "done t=$((SECONDS - T0))"
