#!/usr/bin/env bash
# Round 59, call 10 (#21): the block timeline of a 1-row 1.7B decode step (graph_check
# --timeline, the `timeline` feature's build, .gpu/graph_check_tl) with the staged gate|up (the
# default) and without it (`--no-gemv-stream-stage`): when each block of each launch started
# and when its wait was released. The CSVs come back xz'd.
# Run as `export OUT BUDGET=...; bash scripts/gpu_call_round59f.sh`.
set -u
source scripts/gpu_lib.sh
chmod +x .gpu/graph_check_tl
nvidia-smi --query-gpu=name --format=csv,noheader
model 1.7b; echo "models t=$((SECONDS - T0))"
timelines 1.7b "" "--no-gemv-stream-stage"
for i in 1 2; do echo "== tl-$i"; grep -A12 "^| launch kind" "$OUT/tl-$i.log"; done
echo "done t=$((SECONDS - T0))"
