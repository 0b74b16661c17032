#!/usr/bin/env bash
# Runs examples/bench on the GPU machine (see BENCHMARKS.md). Expects .gpu/bench.gz built
# here with `cargo build --release --features cuda --example bench`; logs go to $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
bash scripts/gpu_unpack.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
for cfg in "$@"; do
  name=$(basename "$cfg" .json)
  echo "== $name" | tee -a "$OUT/summary.txt"
  timeout 280 .gpu/bench --config "tests/fixtures/qwen3/$cfg.json" ${BENCH_ARGS:-} > "$OUT/$name.log" 2>&1
  echo "exit $?" >> "$OUT/$name.log"
  grep -E "^(ours|peer|check|agent|#)" "$OUT/$name.log" | tee -a "$OUT/summary.txt"
  tail -5 "$OUT/$name.log"
done
