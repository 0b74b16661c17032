#!/usr/bin/env bash
# Round 51, the short form of gpu_call_round51a.sh for little device time: the step's copies
# timed (tools/pdl_chain_bench.cu), --graph-feed and --graph-advance swept on 0.6B (batches 1
# and 8, two rounds in one process; their tokens against the defaults'), then kernel_check
# --gemv-only's greedy cases with the feed and the layout moved on, then the 30B-A3B shape on
# 4 layers if time is left.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round51b.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "$(cap 40)" .gpu/pdl_chain_bench s 2>&1 | tee "$OUT/steps.md"
model 0.6b; echo "models t=$((SECONDS - T0))"
sweep d06 90 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "" "--graph-feed" "--graph-feed --graph-advance"
left && kc kcg 90 --gemv-only --model-dir /tmp/m-0.6b
echo "fed checks: $(grep -c "fed tokens" "$OUT/kcg.log" 2>/dev/null), failed: $(grep "fed tokens" "$OUT/kcg.log" 2>/dev/null | grep -c FAIL)"
echo "moved-on checks: $(grep -c "moved on" "$OUT/kcg.log" 2>/dev/null), failed: $(grep "moved on" "$OUT/kcg.log" 2>/dev/null | grep -c FAIL)"
left && moe_model 4
sweep moe4 80 "--model-dir /tmp/m-moe4 --prompt 512 --batches 1 --new 128" "" "--graph-feed" "--graph-feed --graph-advance"
echo "done t=$((SECONDS - T0))"
