#!/usr/bin/env bash
# Round 52, call 3 (#29): --moe-down-lean (the ranked MoE down + sum in 96 registers, its act
# values loaded as used, so the next layer's norm + qkv blocks fit beside it and load their
# weights before their wait) against the defaults on the 30B-A3B shape (8 layers, batches 1
# and 8; 4 layers, batches 1, 2, 8), kernel_check --model-only (the lean down + sum bit for
# bit against the ranked one, and its time alone), graph_check's stress run with it on the
# 8-layer model.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round52c.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
moe_model 8; echo "models t=$((SECONDS - T0))"
sweep moe8 110 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" "" "--moe-down-lean"
left && mix_model
kc kcm 120 --model-only --model-dir /tmp/m-mix
echo "lean checks: $(grep -c "lean = ranked" "$OUT/kcm.log"), failed: $(grep "lean = ranked" "$OUT/kcm.log" | grep -c FAIL)"
grep "moe timing" "$OUT/kcm.log"
left && { timeout "$(cap 100)" .gpu/graph_check --model-dir /tmp/m-moe8 --stress-steps 200 --moe-down-lean > "$OUT/gc.log" 2>&1;
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
left && moe_model 4
sweep moe4 80 "--model-dir /tmp/m-moe4 --prompt 512 --batches 1,2,8 --new 128" "" "--moe-down-lean"
echo "done t=$((SECONDS - T0))"
