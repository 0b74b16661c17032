#!/usr/bin/env bash
# Round 61, call 2 (#21): the skinny matmuls' inputs prefetched into L1 right after their wait
# (`--gemv-x-prefetch`, the gemv_ef_xp / gemv_mma_ef_xp builds: 1.7B's 1-2-row o and down, all
# four 3-8-row matmuls). kernel_check --gemv-only (its bits against the evict-first build and
# the presummed norm's), then 1.7B and 0.6B batches 1 / 2 / 8 with it beside the defaults
# (three interleaved rounds), graph_check's stress run with it.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round61b.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "prefetch" "input prefetch"
grep "prefetch" "$OUT/gemv.log" | grep -v " ok$" | head
sweep x17 150 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-x-prefetch"
sweep x06 120 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--gemv-x-prefetch"
left 450 && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --gemv-x-prefetch > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
