#!/usr/bin/env bash
# On the GPU machine, one call (#21, #29): the streamed-rows skinny matmuls (--gemv-stream N)
# and the MoE gate|up with eight loads in flight (--moe-wide-gate-up). Checks first (the new
# kernels against the default ones bit for bit, the model-level checks, graphs vs eager), then
# the batch-1 step's ops (graph_check --profile 1), then decode at batches 1, 2, 8 for both
# dense shapes with each grid size, then the MoE checks and the experts' timings.
set -u
source scripts/gpu_lib.sh; model 0.6b; model 1.7b
G=${G:-2}
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --gemv-only --gemv-stream $G > $OUT/kc-gemv.log 2>&1
echo "kc gemv rc $?"; grep -E "^kernel-check|FAILED" $OUT/kc-gemv.log | head -8
grep -c "streamed.* ok$" $OUT/kc-gemv.log
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 --gemv-stream $G > $OUT/gc.log 2>&1
echo "gc rc $?"; grep -E "graph-check|FAIL|mismatch" $OUT/gc.log | head -5
for m in 0.6b 1.7b; do for v in "" "--gemv-stream 1" "--gemv-stream 2"; do
  timeout 60 .gpu/graph_check --model-dir /tmp/m-$m --profile 1 $v > "$OUT/prof-$m-${v// /}.log" 2>&1
  echo "== prof $m [$v] rc $?"; grep -E "^\| (add|o_proj \(ours|down \(ours|fused decode attention \(|lm_head|gate_up\+silu \(ours)|^sum of ops|graph replay" "$OUT/prof-$m-${v// /}.log" | head -12
done; done
for m in 0.6b 1.7b; do for v in "" "--gemv-stream 1" "--gemv-stream 2" "--gemv-stream 4"; do
  timeout 80 .gpu/bench --no-peer --model-dir /tmp/m-$m --batches 1,2,8 $v > "$OUT/b-$m.log" 2>&1
  echo "== $m [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b-$m.log" | sed 's/ (.*//' | paste -sd' '
done; done
timeout 200 .gpu/kernel_check --model-dir /tmp/m-0.6b --model-only > $OUT/kc-moe.log 2>&1
echo "kc moe rc $?"; grep -E "^kernel-check|FAILED|moe timing|8 loads" $OUT/kc-moe.log | cut -c1-160 | head -20
