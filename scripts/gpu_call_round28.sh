#!/usr/bin/env bash
# On the GPU machine, round 28 (#23): the LoRA shrinks as extra output columns of the base
# matmuls (KernelOptions::lora_wide, --lora-wide). PARTS picks (default "checks bench"):
# checks: kernel_check --lora-only (the wide model's logits against the f32 reference,
# graphs vs eager with the wide path on 12 and 32 requests); bench: decode with every row on
# one of 8 rank-16 adapters, for each shape of SHAPES (default 0.6b 1.7b) and each flag set
# of VARIANTS (';'-separated; default: the defaults, --lora-wide, twice alternating).
set -u
source scripts/gpu_lib.sh; model 0.6b
P=${PARTS:-checks bench}
if [[ $P == *checks* ]]; then
  timeout 300 .gpu/kernel_check --model-dir /tmp/m-0.6b --lora-only > $OUT/kc-lora.log 2>&1
  echo "kc rc $?"; grep -E "checks|FAILED|greedy" $OUT/kc-lora.log | cut -c1-140
  grep -E "^lora BF16.*wide" $OUT/kc-lora.log | cut -c1-140 | head -12
fi
if [[ $P == *bench* ]]; then
  PART=none SHAPES="${SHAPES:-0.6b 1.7b}" VARIANTS="${VARIANTS:-;--lora-wide;;--lora-wide}" \
    bash scripts/gpu_call_round26.sh
fi
