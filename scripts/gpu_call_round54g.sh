#!/usr/bin/env bash
# Round 54, call 8 (#21): the block timeline of a 1-row decode step (graph_check --timeline,
# the `timeline` feature's profiling build, .gpu/graph_check_tl): when each block of each
# launch started and when its wait was released, on 0.6B and 1.7B (context 600). The CSVs
# come back xz'd.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round54g.sh`.
set -u
source scripts/gpu_lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for m in 0.6b 1.7b; do
  left 200 || break
  timeout "$(cap 90)" .gpu/graph_check_tl --model-dir "/tmp/m-$m" --timeline "/tmp/tl-$m.csv" \
    > "$OUT/tl-$m.log" 2>&1
  echo "== timeline $m rc $? t=$((SECONDS - T0))"
  grep -v "^|" "$OUT/tl-$m.log" | tail -3
  grep "^| " "$OUT/tl-$m.log" | tail -12
  [ -f "/tmp/tl-$m.csv" ] && xz -c "/tmp/tl-$m.csv" > "$OUT/tl-$m.csv.xz"
done
echo "done t=$((SECONDS - T0))"
