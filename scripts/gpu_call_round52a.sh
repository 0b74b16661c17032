#!/usr/bin/env bash
# Round 52, call 1 (#21, #29): what a kernel boundary and a decode step's copies cost on the
# device (tools/pdl_chain_bench.cu, built with nvcc into .gpu/); the build without round 50's
# variants checked (kernel_check --model-only on the mixed MoE model, --gemv-only's greedy
# cases with the feed); --graph-feed swept on 0.6B (batches 1 and 8) and the 30B-A3B shape
# (8 layers, batch 1), two rounds in one process.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round51a.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "$(cap 60)" .gpu/pdl_chain_bench s 2>&1 | tee "$OUT/steps.md"
model 0.6b; echo "models t=$((SECONDS - T0))"
sweep d06 100 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "" "--graph-feed" "--graph-feed --graph-advance"
left && mix_model
kc kcm 120 --model-only --model-dir /tmp/m-mix
kc kcg 100 --gemv-only --model-dir /tmp/m-0.6b
echo "fed checks: $(grep -c "fed tokens" "$OUT/kcg.log"), failed: $(grep "fed tokens" "$OUT/kcg.log" | grep -c FAIL)"
echo "moved-on checks: $(grep -c "moved on" "$OUT/kcg.log" 2>/dev/null), failed: $(grep "moved on" "$OUT/kcg.log" 2>/dev/null | grep -c FAIL)"
left && model 1.7b
sweep d17 90 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128" "" "--graph-feed" "--graph-feed --graph-advance"
left && moe_model 8
sweep moe8 100 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128" "" "--graph-feed" "--graph-feed --graph-advance"
echo "done t=$((SECONDS - T0))"
