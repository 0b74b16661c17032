#!/usr/bin/env bash
# One device call: kernel checks, HF logits check, cold start and the decode/prefill bench on
# the H200. Expects .gpu/{bench,kernel_check,policy-serve}.gz built here with
#   cargo build --release --features cuda --example bench --example kernel_check --bin policy-serve
# Logs go to $OUT; a short summary is printed last.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
S="$OUT/summary.txt"
cat "$OUT/gpu.txt" | tee -a "$S"
for c in 0.6b 1.7b; do
  .gpu/bench --config tests/fixtures/qwen3/config-$c.json --write-model /tmp/m-$c > "$OUT/write-$c.log" 2>&1
done
if [ "${SKIP_CHECK:-0}" != 1 ]; then
  timeout 240 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1; echo "kernel_check exit $?" >> "$OUT/kernel_check.log"
  grep -E "FAIL|kernel-check|greedy|exit" "$OUT/kernel_check.log" | tee -a "$S"
  timeout 120 bash scripts/gpu_check.sh /tmp/m-0.6b /tmp/m-1.7b > "$OUT/hf.log" 2>&1
fi
# Cold start: a fresh process with the driver's JIT cache disabled, then with it on.
export CUDA_CACHE_PATH=/tmp/jit-$$
for mode in disabled fresh warm; do
  if [ $mode = disabled ]; then export CUDA_CACHE_DISABLE=1; else unset CUDA_CACHE_DISABLE; fi
  t0=$(date +%s.%N)
  timeout 120 .gpu/policy-serve generate --model-dir /tmp/m-0.6b --prompt "hello there" --max-new-tokens 1 --device cuda > "$OUT/cold-$mode.log" 2>&1
  t1=$(date +%s.%N)
  echo "start ($mode JIT cache): process start to first token $(python3 -c "print(f'{$t1-$t0:.2f}')") s; $(tail -1 "$OUT/cold-$mode.log" | cut -c1-120)" | tee -a "$S"
done
unset CUDA_CACHE_DISABLE
for c in ${CONFIGS:-0.6b 1.7b}; do
  batches=${BATCHES:-1,8,64,256}
  timeout ${BENCH_TIMEOUT:-200} .gpu/bench --model-dir /tmp/m-$c --batches $batches ${BENCH_ARGS:-} > "$OUT/bench-$c.log" 2>&1
  echo "== bench $c (exit $?)" | tee -a "$S"
  grep -E "^(ours|peer|check)" "$OUT/bench-$c.log" | tee -a "$S"
done
echo "==== summary"; cat "$S"
