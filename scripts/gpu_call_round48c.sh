#!/usr/bin/env bash
# Round 48, call 3: what calls 1-2 left open. (1) 0.6B after 8k-token prompts, the defaults
# twice around --attn-kv-prefetch 128 (call 1 ran one round with the defaults as the process's
# first engine: 2,359 against 2,765 tok/s at batch 8, the same at 128 and 512 tokens, where the
# unfused attention should run and the option should do nothing). (2) The MoE gate|up's
# evict-first loads alone (--moe-down-prefetch 0, +2% at batch 1 in call 2) with the ranked
# down + sum (+1.7% / +2.2% / +5.1% at batches 1 / 2 / 8), and at batches 2 and 8.
set -u
source scripts/gpu_lib.sh
model 0.6b; moe_model 4; echo "models t=$((SECONDS - T0))"
sweep 06b-8k 120 "--model-dir /tmp/m-0.6b --prompt 8000 --batches 1,8 --new 64" "" \
  "--attn-kv-prefetch 128" "" "--no-fused-decode"
sweep moe4 120 "--model-dir /tmp/m-moe4 --prompt 512 --batches 1,2,8 --new 128" "" \
  "--moe-down-prefetch 0" "--moe-rank-sort" "--moe-rank-sort --moe-down-prefetch 0"
sweep 06b 80 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "" "--attn-kv-prefetch 128"
echo "done t=$((SECONDS - T0))"
