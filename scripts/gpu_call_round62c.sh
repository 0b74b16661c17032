#!/usr/bin/env bash
# Round 62, call 3 (#21): the streamed 1-row matmul's input copy (gemv_tma_sm90.cu, 0.6B's o and
# down at batch 1) with a thread's two chunks loaded before either is stored (a loop stored
# each before it loaded the next: the down's 3,072 inputs two round trips). kernel_check
# --gemv-only (its tma_bits against the skinny matmuls), this build against the one before it
# (.gpu/bench_prev, a8d43ec) on 0.6B batches 1 / 2, three interleaved rounds, one process each;
# the floors' rows on this build (0.6B with and without the staged tensor-core input, 1.7B);
# graph_check's stress run.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round62c.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
tma_bits
ab 0.6b 1,2
sweep f06 120 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2,8 --new 128 --variant-rounds 3" "" "--no-gemv-mma-x-stage"
sweep f17 80 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128 --variant-rounds 3" ""
left 480 && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 \
  > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
