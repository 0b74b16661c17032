#!/usr/bin/env bash
# Round 54, call 2 (#21): room on the SMs for the next kernel's early blocks. 0.6B's qkv (one
# row a warp: 512 blocks of 64 registers, ~97% of the GPU's registers) leaves the fused
# attention's clusters no room to start (PDL) while it runs; the streamed gate|up (2 blocks an
# SM of 120 registers) leaves down's streamed kernel none. --norm-gemv-rows 2/4 (the qkv with 2
# or 4 rows a warp: 256 / 128 blocks, the same bits) and --gemv-stream 1 (gate|up at one block
# an SM, an existing switch) open that room. kernel_check --gemv-only (the several-rows kernels
# against one row a warp, bit for bit), the sweep at batches 1 and 2 after 512-token prompts
# (three interleaved rounds), the chain shares of qkv and the attention with and without R 4,
# and 1.7B batch 1 with --gemv-stream 1 (its qkv is not on the deferred norm).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round54b.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kcg 100 --model-dir /tmp/m-0.6b --gemv-only
echo "rows checks: $(grep -c "rows a warp" "$OUT/kcg.log"), failed: $(grep "rows a warp" "$OUT/kcg.log" | grep -c FAIL)"
sweep d06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,2 --new 128 --variant-rounds 3" "" \
  "--norm-gemv-rows 2" "--norm-gemv-rows 4" "--gemv-stream 1" "--norm-gemv-rows 4 --gemv-stream 1"
for r in 1 4; do
  left 420 || break
  v=""; [ "$r" = 4 ] && v="--norm-gemv-rows 4"
  # shellcheck disable=SC2086 # the flags are words
  timeout "$(cap 60)" .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 --profile-skip 1,2,3 $v \
    > "$OUT/skip-r$r.log" 2>&1
  echo "== profile-skip [$v] rc $? t=$((SECONDS - T0))"
  grep -E "^batch .* graph_pdl (1|1, without)" "$OUT/skip-r$r.log" | sed 's/ back to back//; s/; with argmax.*//'
done
left 440 && model 1.7b && sweep d17 60 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128" "" "--gemv-stream 1"
echo "done t=$((SECONDS - T0))"
