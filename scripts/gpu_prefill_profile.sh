#!/usr/bin/env bash
# Where a 32k-token prefill of 0.6B spends its time: nsys's kernel summary when the machine has
# nsys, and the engine's own step profile (--profile-steps 1: GPU busy and idle per step).
set -u
source scripts/gpu_lib.sh
model 0.6b
NSYS=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}" | tee -a "$S"
if [ -n "$NSYS" ]; then
  timeout 200 "$NSYS" profile -o /tmp/p --force-overwrite true --stats=false .gpu/bench --no-peer --batches 1 --new 2 --model-dir /tmp/m-0.6b --prompt 32000 --prefill-chunk 4096 > "$OUT/nsys-run.log" 2>&1
  timeout 120 "$NSYS" stats --report cuda_gpu_kern_sum --format csv /tmp/p.nsys-rep > "$OUT/kern.csv" 2>&1
  head -25 "$OUT/kern.csv" | cut -c1-220 | tee -a "$S"
fi
RUST_LOG=warn,policy_serve::profile=info timeout 100 .gpu/bench --no-peer --batches 1 --new 2 --model-dir /tmp/m-0.6b --prompt 32000 --prefill-chunk 4096 --profile-steps 1 > "$OUT/profile.log" 2>&1
grep -E "profile|ours prefill" "$OUT/profile.log" | tail -12 | cut -c1-400 | tee -a "$S"
