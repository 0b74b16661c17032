#!/usr/bin/env bash
# Round 49, call 2 (#21, #29): weights evict-first in L2. The MoE gate|up's evict-first loads
# gained and its L2-only loads at L2's normal priority did not (call 1), so the gain is L2's
# eviction priority. Here every skinny matmul (qkv, o, the dense MLP, the MoE router, the head
# of small steps) loads its weights evict-first in L2 (--weight-evict-first: gemv_ef /
# gemv_mma_ef), and the ranked MoE down + sum too (--moe-down-evict-first); the K/V cache and the
# activations may then stay in L2 from one step to the next. kernel_check --gemv-only and
# --model-only check both bit for bit; sweeps on 0.6B / 1.7B (batches 1, 8) and the 30B-A3B shape
# (8 layers at batch 1, 4 layers at 1 / 2 / 8), two rounds each. Then, if time and /dev/shm
# allow, the 30B-A3B shape at all 48 layers (~61 GB of random weights, written as 4 GiB shards
# to /dev/shm: this machine's disk is 64 GiB), defaults and both options, two rounds.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; moe_model 4; moe_model 8; mix_model; echo "models t=$((SECONDS - T0))"
kc gemv 130 --model-dir /tmp/m-0.6b --gemv-only
echo "gemv evict-first checks: $(grep -c "evict-first" "$OUT/gemv.log"), failed: $(grep "evict-first" "$OUT/gemv.log" | grep -c FAIL)"
kc kcm 120 --model-only --model-dir /tmp/m-mix --weight-evict-first --moe-down-evict-first
echo "moe down evict-first checks: $(grep -c "down+sum evict-first" "$OUT/kcm.log"), failed: $(grep "down+sum evict-first" "$OUT/kcm.log" | grep -c FAIL)"
grep -E "moe timing T. tile 1" "$OUT/kcm.log"
sweep d06 90 "--model-dir /tmp/m-0.6b --prompt 512 --batches 1,8 --new 128" "" "--weight-evict-first"
sweep d17 90 "--model-dir /tmp/m-1.7b --prompt 512 --batches 1,8 --new 128" "" "--weight-evict-first"
V=("" "--weight-evict-first" "--moe-down-evict-first" "--weight-evict-first --moe-down-evict-first")
sweep moe8 120 "--model-dir /tmp/m-moe8 --prompt 512 --batches 1 --new 128" "${V[@]}"
sweep moe4 120 "--model-dir /tmp/m-moe4 --prompt 512 --batches 1,2,8 --new 128" "${V[@]}"
df -h /dev/shm /tmp | tail -2
shm=$(df -BG --output=avail /dev/shm | tail -1 | tr -dc 0-9)
if [ "${shm:-0}" -ge 62 ] && left 330; then
  timeout 150 .gpu/bench --config tests/fixtures/qwen3/config-30b-a3b.json \
    --write-model /dev/shm/m-moe48 > "$OUT/w48.log" 2>&1
  echo "== write48 rc $? t=$((SECONDS - T0)): $(tail -1 "$OUT/w48.log")"
  sweep moe48 200 "--model-dir /dev/shm/m-moe48 --prompt 512 --batches 1 --new 128" "" \
    "--weight-evict-first --moe-down-evict-first"
  rm -rf /dev/shm/m-moe48
else
  echo "== moe48 skipped: /dev/shm ${shm:-?} GB free, t=$((SECONDS - T0))"
fi
echo "done t=$((SECONDS - T0))"
