#!/usr/bin/env bash
# Round 62, call 1 (#21): the 3-8-row tensor-core matmuls' input (and the presummed norm's
# weight) staged in shared memory by cp.async, one round of copies a batch (`--gemv-mma-x-stage`,
# the gemv_mma_ef_xs build), where their loop loaded each step's input behind the step before.
# kernel_check --gemv-only (its bits against the evict-first build, the presummed kernels' too),
# then 0.6B batches 3 / 4 / 8 and 1.7B batch 8 with it beside the defaults (three interleaved
# rounds), graph_check's stress run with it.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round62a.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
kc gemv 150 --model-dir /tmp/m-0.6b --gemv-only
counted "$OUT/gemv.log" "staged" "staged input"
grep "staged" "$OUT/gemv.log" | grep -v " ok$" | head
sweep s06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 3,4,8 --new 128 --variant-rounds 3" "" "--gemv-mma-x-stage"
sweep s17 80 "--model-dir /tmp/m-1.7b --prompt 512 --batches 8 --new 128 --variant-rounds 3" "" "--gemv-mma-x-stage"
left 440 && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 \
  --gemv-mma-x-stage > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
