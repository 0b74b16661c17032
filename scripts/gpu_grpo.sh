#!/usr/bin/env bash
# On the GPU machine (#22): the GRPO-shaped load of scripts/grpo_load.py (64 prompts x n 8,
# 512 in / 256 out, as TRL's client sends it) against the HTTP host with default flags, for
# the shapes in SHAPES (default 0.6b 1.7b).
set -u
source scripts/gpu_lib.sh
for shape in ${SHAPES:-0.6b 1.7b}; do
  model $shape
  port=18100
  .gpu/serve --addr 127.0.0.1:$port --device cuda --models m --model-dir m=/tmp/m-$shape \
    --max-tokens-cap 4096 --max-body-bytes 40000000 > "$OUT/serve-grpo-$shape.log" 2>&1 &
  pid=$!
  for i in $(seq 1 120); do
    curl -s -o /dev/null localhost:$port/health && curl -s localhost:$port/get_world_size | grep -q world_size && break; sleep 1
  done
  echo "== $shape" | tee -a "$S"
  timeout ${GT:-200} python3 scripts/grpo_load.py http://127.0.0.1:$port m 2>&1 | tail -4 | tee -a "$S"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null
done
