#!/usr/bin/env bash
# Round 65 (#21; run once, with 0e895fd's build: the fold measured flat and removed): the final
# add+RMSNorm inside the greedy graphs' one-launch head
# (--gemv-tma-head-norm, built in round 64, off). 0.6B / 1.7B batch 1 beside the defaults, three
# interleaved rounds, first (on an H200 these are also the floors' rows, then with batch 8);
# then kernel_check --gemv-only (its head_norm_checks: the folded launch's logits bit for bit and
# its token against add_rmsnorm then the one-launch head; and the default head's checks), and
# graph_check with the fold (graphs, which fold, against eager steps, which do not).
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round65.sh`.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
case $gpu in *H200*) B=1,8 ;; *) B=1 ;; esac
sweep n06 120 "--model-dir /tmp/m-0.6b --prompt 512 --batches $B --new 128 --variant-rounds 3" "" \
  "--gemv-tma-head-norm"
sweep n17 90 "--model-dir /tmp/m-1.7b --prompt 512 --batches $B --new 128 --variant-rounds 3" "" \
  "--gemv-tma-head-norm"
kc kcg 120 --model-dir /tmp/m-0.6b --gemv-only && counted "$OUT/kcg.log" "lm_head" "lm_head"
left && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 \
  --gemv-tma-head-norm > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic|equal" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
