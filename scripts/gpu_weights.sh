#!/usr/bin/env bash
# On the GPU machine (#22, #23): new weights into a running server.
# - Disk: POST /v1/models/m/weights with a transformers-initialised checkpoint, timed, for the
#   shapes in SHAPES (default 0.6b 1.7b), alone and under a running GRPO-shaped load.
# - NCCL (needs two GPUs; with one, only the rendezvous is exercised and NCCL refuses two
#   ranks on one GPU): scripts/trainer_push.py on GPU 0 pushes the checkpoint to the server on
#   GPU 1 three times; then the updated server's greedy tokens are compared with a server
#   started on those weights from disk (equal) and with transformers (teacher-forced argmax).
# Needs .gpu/serve.xz and .gpu/bench.xz built with --features nccl.
set -u
source scripts/gpu_lib.sh
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH NCCL_NVLS_ENABLE=0
GPUS=$(nvidia-smi -L | wc -l)
echo "gpus: $GPUS" | tee -a "$S"
SERVER_GPU=$(( GPUS > 1 ? 1 : 0 ))

serve_up() { # PORT DEVICE DIR LOG [ARGS...]
  local port=$1 dev=$2 dir=$3 log=$4; shift 4
  .gpu/serve --addr 127.0.0.1:$port --device $dev --models m --model-dir m=$dir \
    --max-tokens-cap 4096 --max-body-bytes 67108864 "$@" > "$log" 2>&1 &
  for i in $(seq 1 180); do
    curl -s localhost:$port/server_info | grep -q '"loaded":true' && return 0; sleep 1
  done
  echo "server on $port never came up" | tee -a "$S"; tail -5 "$log"
}

for shape in ${SHAPES:-0.6b 1.7b}; do
  model $shape
  B=/tmp/hf-$shape
  [ -d $B ] || python3 scripts/hf_init_model.py tests/fixtures/qwen3/config-$shape.json \
    tests/fixtures/qwen3 $B > "$OUT/hfinit-$shape.log" 2>&1
  echo "== $shape disk" | tee -a "$S"
  serve_up 18200 cuda:$SERVER_GPU /tmp/m-$shape "$OUT/serve-disk-$shape.log" --allow-weight-updates
  pid=$!
  for i in 1 2 3; do
    d=$([ $((i % 2)) = 1 ] && echo $B || echo /tmp/m-$shape)
    /usr/bin/time -f "disk update $i ($d): %e s" curl -s -X POST localhost:18200/v1/models/m/weights \
      -H 'content-type: application/json' -d "{\"path\": \"$d\"}" 2>&1 | tail -c 300 | tee -a "$S"; echo
  done
  # Under load: the GRPO load runs while an update is asked halfway.
  (timeout 200 python3 scripts/grpo_load.py http://127.0.0.1:18200 m > "$OUT/grpo-during-update-$shape.log" 2>&1) &
  lp=$!
  sleep 8
  /usr/bin/time -f "update during load: %e s" curl -s -X POST localhost:18200/v1/models/m/weights \
    -H 'content-type: application/json' -d "{\"path\": \"$B\"}" 2>&1 | tail -c 300 | tee -a "$S"; echo
  wait $lp; tail -3 "$OUT/grpo-during-update-$shape.log" | tee -a "$S"
  grep -E "weights updated|weight update" "$OUT/serve-disk-$shape.log" | tail -4 | tee -a "$S"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null

  echo "== $shape nccl" | tee -a "$S"
  serve_up 18201 cuda:$SERVER_GPU /tmp/m-$shape "$OUT/serve-nccl-$shape.log" --allow-weight-updates
  pid=$!
  CUDA_VISIBLE_DEVICES=0 timeout $(( GPUS > 1 ? 400 : 90 )) python3 scripts/trainer_push.py http://127.0.0.1:18201 $B 29600 3 \
    > "$OUT/trainer-$shape.log" 2>&1
  echo "trainer exit $?" | tee -a "$S"
  grep -E "^(init|push|greedy:)|Error|error" "$OUT/trainer-$shape.log" | tail -8 | tee -a "$S"
  grep -E "joined|weights updated|refused|NCCL|store" "$OUT/serve-nccl-$shape.log" | tail -5 | tee -a "$S"
  if [ "$GPUS" -gt 1 ]; then
    serve_up 18202 cuda:0 $B "$OUT/serve-b-$shape.log"
    pid2=$!
    python3 - <<'PY' 2>&1 | tee -a "$S"
import requests, torch
g = torch.Generator().manual_seed(1)
same = 0
for k in range(4):
    prompt = torch.randint(100, 150000, (64,), generator=g).tolist()
    body = {"model": "m", "prompt": prompt, "max_tokens": 32, "temperature": 0, "return_token_ids": True}
    a = requests.post("http://127.0.0.1:18201/v1/completions", json=body).json()["choices"][0]["token_ids"]
    b = requests.post("http://127.0.0.1:18202/v1/completions", json=body).json()["choices"][0]["token_ids"]
    same += a == b
print(f"pushed server vs server loaded from the same weights on disk: {same}/4 greedy answers equal")
PY
    kill $pid2 2>/dev/null; wait $pid2 2>/dev/null
  fi
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
done
