#!/usr/bin/env bash
# On the two-GPU machine: tensor-parallel Qwen3 (1.7B shape, random bf16 weights) over NCCL,
# head on cuda:0 (examples/bench) and one worker on cuda:1 (policy-serve worker), against the
# one-GPU run. Needs .gpu/bench.gz and .gpu/policy-serve.gz built with --features nccl.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
bash scripts/gpu_unpack.sh
nvidia-smi -L > "$OUT/gpus.txt" 2>&1
M=/tmp/m17
BATCHES=${BATCHES:-1,64}
.gpu/bench --config tests/fixtures/qwen3/config-1.7b.json --write-model $M > "$OUT/write.log" 2>&1

echo "== one GPU"
timeout 200 .gpu/bench --model-dir $M --nccl-selftest --greedy-check --batches $BATCHES --no-peer --device cuda:0 > "$OUT/one.log" 2>&1
echo "exit $?" >> "$OUT/one.log"
grep -E "^(ours|nccl|#)|exit" "$OUT/one.log"

echo "== two GPUs (tensor parallel)"
timeout 250 .gpu/policy-serve worker --rank 1 --world-size 2 --rendezvous 127.0.0.1:29511 --model qwen3-1.7b --model-dir $M --device cuda:1 > "$OUT/worker.log" 2>&1 &
timeout 250 .gpu/bench --model-dir $M --greedy-check --batches $BATCHES --no-peer --device cuda:0 --world-size 2 --rendezvous 127.0.0.1:29511 > "$OUT/tp2.log" 2>&1
echo "exit $?" >> "$OUT/tp2.log"
wait
grep -E "^(ours|#)|exit" "$OUT/tp2.log"; tail -2 "$OUT/worker.log"

echo "== two GPUs, decode steps on CUDA graphs on both ranks (--tp-graphs)"
timeout 250 .gpu/policy-serve worker --rank 1 --world-size 2 --rendezvous 127.0.0.1:29513 --model qwen3-1.7b --model-dir $M --device cuda:1 > "$OUT/worker-g.log" 2>&1 &
timeout 250 .gpu/bench --model-dir $M --greedy-check --batches $BATCHES --no-peer --device cuda:0 --world-size 2 --rendezvous 127.0.0.1:29513 --tp-graphs > "$OUT/tp2g.log" 2>&1
echo "exit $?" >> "$OUT/tp2g.log"
wait
grep -E "^(ours|#)|exit|graphs|capture" "$OUT/tp2g.log"; grep -E "graphs|capture|ERROR|WARN" "$OUT/worker-g.log" | tail -4
diff <(grep "^greedy prompt" "$OUT/tp2.log") <(grep "^greedy prompt" "$OUT/tp2g.log") > /dev/null && echo "greedy tokens, tp-graphs vs eager TP: equal" || echo "greedy tokens, tp-graphs vs eager TP: DIFFER"

echo "== compare"
diff <(grep "^greedy prompt" "$OUT/one.log") <(grep "^greedy prompt" "$OUT/tp2.log") > /dev/null && echo "greedy tokens: equal for 8 prompts x 24 tokens" || echo "greedy tokens: DIFFER"
python3 - <<'PY'
import numpy as np
a = np.fromfile("/tmp/policy-serve-logits-ws1.bin", dtype="<f4").reshape(64, -1)
b = np.fromfile("/tmp/policy-serve-logits-ws2.bin", dtype="<f4").reshape(64, -1)
d = np.abs(a - b)
print(f"logits tp2 vs one GPU: max_abs {d.max():.4f} max|logit| {np.abs(a).max():.2f} rel {d.max()/np.abs(a).max():.2e} mean_abs {d.mean():.4f} argmax_agree {(a.argmax(-1)==b.argmax(-1)).mean():.3f}")
PY

echo "== kill the worker"
rm -f /tmp/policy-serve-killed
timeout 200 .gpu/policy-serve worker --rank 1 --world-size 2 --rendezvous 127.0.0.1:29512 --model qwen3-1.7b --model-dir $M --device cuda:1 > "$OUT/worker2.log" 2>&1 &
WPID=$!
timeout 200 .gpu/bench --model-dir $M --kill-test --batches 1 --new 16 --no-peer --device cuda:0 --world-size 2 --rendezvous 127.0.0.1:29512 > "$OUT/kill.log" 2>&1 &
BPID=$!
for i in $(seq 1 1200); do grep -q READY_FOR_KILL "$OUT/kill.log" 2>/dev/null && break; sleep 0.1; done
pkill -9 -f "rendezvous 127.0.0.1:29512 --model" ; kill -9 $WPID 2>/dev/null
touch /tmp/policy-serve-killed
wait $BPID; echo "exit $?" >> "$OUT/kill.log"
grep -E "after kill|exit" "$OUT/kill.log"
