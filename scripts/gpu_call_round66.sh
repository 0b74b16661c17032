#!/usr/bin/env bash
# Round 66 (#21): on an H200, the floors (`gpu_call_round64b.sh`, with `lean` the defaults
# alone); on any card, then, while time is left, the current build's checks: kernel_check
# --gemv-only (the lm_head and one-launch head checks among them; the round 65 review rewrote
# the head's host launch, lm_head_argmax_into, after the last GPU run) and graph_check with the
# defaults (graphs against eager steps, pipelined, lockstep, shrink/grow, a 300-step stress).
# On any other card the defaults' 0.6B batches 1 / 8 first (two rounds), against the last
# rows measured on that card.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round66.sh [lean]`.
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case $gpu in *H200*) bash scripts/gpu_call_round64b.sh "${1:-}" ;; *) echo "$gpu: no floors" ;; esac
export BUDGET=$(( ${BUDGET:-540} - SECONDS ))
source scripts/gpu_lib.sh
model 0.6b
case $gpu in *H200*) ;; *) sweep r06 60 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 \
  --new 128 --variant-rounds 2" "" ;; esac
kc kcg 120 --model-dir /tmp/m-0.6b --gemv-only && counted "$OUT/kcg.log" "lm_head" "lm_head"
left && { timeout "$(cap 90)" .gpu/graph_check --model-dir /tmp/m-0.6b --stress-steps 300 \
  > "$OUT/gc.log" 2>&1
  echo "== graph_check rc $? t=$((SECONDS - T0))"; grep -E "FAIL|graph-check|Error|panic|equal" "$OUT/gc.log" | head; }
echo "done t=$((SECONDS - T0))"
