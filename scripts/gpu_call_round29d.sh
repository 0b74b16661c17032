#!/usr/bin/env bash
# On the GPU machine, one call (#21): the defaults with the deferred norm for norms over at most
# 1,024 inputs (0.6B's): every skinny-matmul check (the deferred kernels against f32 math too),
# the model-level checks and greedy tokens, the LoRA checks, graphs vs eager and the short
# stress run, then decode at batches 1-64 for both dense shapes, default and
# --no-norm-deferred alternating, two runs each.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --gemv-only > $OUT/kc-gemv.log 2>&1
echo "kc gemv rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc-gemv.log | head -8
grep -E "deferred" $OUT/kc-gemv.log | awk '{print $(NF-3)}' | sort -g | tail -1 | sed 's/^/worst deferred rel_err /'
grep -E "^norm_gemv.*k 1024 \(" $OUT/kc-gemv.log | grep -v "residual\|deferred\|warp" | awk '{print $(NF-3)}' | sort -g | tail -1 | sed 's/^/worst default k1024 rel_err /'
grep -cE "deferred.* ok$" $OUT/kc-gemv.log
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only > $OUT/kc-lora.log 2>&1
echo "kc lora rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc-lora.log | head -5
timeout 120 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 > $OUT/gc.log 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|mismatch" $OUT/gc.log | head -5
for m in 0.6b 1.7b; do for r in 1 2; do for v in "" "--no-norm-deferred"; do
  timeout 80 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,2,8,16,64 $v > "$OUT/b-$m.log" 2>&1
  echo "== $m run $r [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b-$m.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done; done
