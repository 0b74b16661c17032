#!/usr/bin/env bash
# On the GPU machine (#21): our bf16 logits against HF transformers (f32 math reference, torch
# bf16 beside ours) on checkpoints transformers initialised itself (scripts/hf_init_model.py),
# in the shapes given (default 0.6b 1.7b), at 203 tokens (`<|im_start|>system\n` + random ids)
# and at LONG tokens (default 2048; last 256 positions), then the per-layer trace of both
# (scripts/hf_trace_check.py) at 203 tokens (TRACE_ONLY=1: only that).
set -u
source scripts/gpu_lib.sh
LONG=${LONG:-2048}
for shape in ${SHAPES:-0.6b 1.7b}; do
  dir=/tmp/hf-$shape
  [ -d $dir ] || python3 scripts/hf_init_model.py tests/fixtures/qwen3/config-$shape.json tests/fixtures/qwen3 $dir 2>&1 | tail -1
  for n in 203 $LONG; do
    [ -n "${TRACE_ONLY:-}" ] && [ $n != 203 ] && continue
    python3 -c "
import numpy as np
r = np.random.RandomState($n)
print(','.join(str(x) for x in [151644, 8948, 198] + list(r.randint(0, 151643, $n - 3))))" > /tmp/ids-$n.txt
    [ -n "${TRACE_ONLY:-}" ] && continue
    last=$([ $n -gt 256 ] && echo 256 || echo $n)
    .gpu/policy-serve logits --model-dir $dir --ids "$(cat /tmp/ids-$n.txt)" --last $last --out /tmp/ours-$shape-$n.npy --device cuda --dtype bf16 2>&1 | tail -1
    echo "== $shape hf-init $n tokens" | tee -a "$S"
    REQUIRE=1 LAST=$last python3 scripts/hf_logits_check.py $dir @/tmp/ids-$n.txt ours-bf16=/tmp/ours-$shape-$n.npy 2>&1 | grep -E "hf-check|Error|error" | tee -a "$S"
  done
  if [ -z "${NO_TRACE:-}" ]; then
    .gpu/kernel_check --model-dir $dir --trace-ids /tmp/ids-203.txt --trace-out /tmp/trace-$shape.npz 2>&1 | tail -1
    echo "== $shape trace" | tee -a "$S"
    python3 scripts/hf_trace_check.py $dir /tmp/ids-203.txt /tmp/trace-$shape.npz 2>&1 | grep -E "^trace|Error|error" | tee -a "$S"
  fi
done
