#!/usr/bin/env bash
# On the GPU machine: our logits (policy-serve logits, CUDA) vs HF transformers (torch, CUDA)
# on a random checkpoint in a real Qwen3 shape written by examples/bench (--keep).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
gunzip -kf .gpu/policy-serve.gz && chmod +x .gpu/policy-serve
dir=/tmp/check-model
IDS=$(python3 -c "print(','.join(str((i*7919+13)%150000) for i in range(96)))")
for dt in f32 bf16; do
  .gpu/policy-serve logits --model-dir $dir --ids "$IDS" --out "$OUT/ours-$dt.npy" --device cuda --dtype $dt 2>&1 | tail -1
  py=$([ $dt = f32 ] && echo float32 || echo bfloat16)
  python3 scripts/hf_logits_check.py $dir "$IDS" "$OUT/ours-$dt.npy" $py 2>&1 | grep -v Warning | tail -2 | tee -a "$OUT/summary.txt"
  rm -f "$OUT/ours-$dt.npy"
done
