#!/usr/bin/env bash
# On the GPU machine: our logits (policy-serve logits, CUDA, f32 and bf16) against HF
# transformers in f32 math on the same bf16 weights, with torch's own bf16 error beside ours,
# for the checkpoints given (directories written by `bench --write-model`), then on checkpoints
# transformers initialised itself in the shapes of HF_INIT (default 0.6b 1.7b; empty: none) at
# 203 and 2,048 tokens, where ours must be at least as close as torch's bf16
# (scripts/gpu_accuracy.sh; exit status 1 otherwise).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
IDS=$(python3 -c "print(','.join(str((i*7919+13)%150000) for i in range(203)))")
for dir in "$@"; do
  echo "== $dir" | tee -a "$OUT/summary.txt"
  args=()
  for dt in f32 bf16; do
    .gpu/policy-serve logits --model-dir "$dir" --ids "$IDS" --out "/tmp/ours-$dt.npy" --device cuda --dtype $dt 2>&1 | tail -1
    args+=("ours-$dt=/tmp/ours-$dt.npy")
  done
  python3 scripts/hf_logits_check.py "$dir" "$IDS" "${args[@]}" 2>&1 | grep hf-check | tee -a "$OUT/summary.txt"
done
status=0
if [ -n "${HF_INIT-0.6b 1.7b}" ]; then
  SHAPES="${HF_INIT-0.6b 1.7b}" NO_TRACE=1 OUT="$OUT" bash scripts/gpu_accuracy.sh
  grep -q "hf-check FAIL" "$OUT/summary.txt" && status=1
fi
exit $status
