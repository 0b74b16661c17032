#!/usr/bin/env bash
# Round 61, call 3 (#21): the 1-2-row plain matmuls' input copied into shared memory right after
# their wait (`--gemv-x-shared`, the gemv_ef_xs build: 1.7B's o and down, 0.6B's at 2 rows),
# where their loop loaded it chunk by chunk, each load behind the chunk before. kernel_check
# --gemv-only (its bits against the evict-first build), then 1.7B and 0.6B batches 1 / 2 with it
# beside the defaults (three interleaved rounds), graph_check's stress run with it.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round61c.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-1.7b --gemv-only
counted "$OUT/gemv.log" "shared" "shared input"
grep "shared" "$OUT/gemv.log" | grep -v " ok$" | head
sweep s17 120 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,2 --new 128 --variant-rounds 3" "" "--gemv-x-shared"
sweep s06 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 --variant-rounds 3" "" "--gemv-x-shared"
left 420 && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-1.7b --stress-steps 300 \
  --gemv-x-shared > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
