#!/usr/bin/env bash
# Round 54, call 4 (#21): the streamed 1-row matmul's copy warp asleep while its ring is full.
# Call 2 found 0.6B's qkv on 4 rows a warp faster alone (3.1 against 3.8 us) but the step
# slower, the attention's share of the chain +70 us: a likely cause is o's streamed kernel,
# launched (PDL) once the attention's blocks have started, whose copy warp fills its ring and
# then polls through the attention's whole run on the same SMs. --gemv-tma-backoff NS puts it to
# sleep (32 ns doubling up to NS) instead; the same bits. kernel_check --gemv-only (tma_bits
# with the sleeps), then 0.6B batch 1 after 512-token prompts, three interleaved rounds, with
# the backoff alone and beside --norm-gemv-rows 4 and --gemv-stream 1 (down's streamed kernel
# beside the gate|up), and the chain shares of qkv, the attention and o with the backoff.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round54c.sh`.
set -u
source scripts/gpu_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
model 0.6b; echo "models t=$((SECONDS - T0))"
kc kcg 100 --model-dir /tmp/m-0.6b --gemv-only
echo "tma checks: $(grep -c "gemv_tma" "$OUT/kcg.log"), failed: $(grep "gemv_tma" "$OUT/kcg.log" | grep -c FAIL)"
sweep d06 150 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 --variant-rounds 3" "" \
  "--gemv-tma-backoff 256" "--gemv-tma-backoff 1024" "--gemv-tma-backoff 256 --norm-gemv-rows 4" \
  "--gemv-tma-backoff 256 --gemv-stream 1"
for r in 0 256; do
  left 300 || break
  v=""; [ "$r" != 0 ] && v="--gemv-tma-backoff $r"
  # shellcheck disable=SC2086 # the flags are words
  timeout "$(cap 60)" .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1 --profile-skip 2,4,6 $v \
    > "$OUT/skip-b$r.log" 2>&1
  echo "== profile-skip [$v] rc $? t=$((SECONDS - T0))"
  grep -E "^batch .* graph_pdl (1|1, without)" "$OUT/skip-b$r.log" | sed 's/ back to back//; s/; with argmax.*//'
done
echo "done t=$((SECONDS - T0))"
