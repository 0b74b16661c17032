#!/usr/bin/env bash
# Round 43, call 8: the streamed step's weight copies evict-first in L2 (so the K/V pages
# prefetched for the next layer's attention stay): the phase timer on blocks 0, 5 and 77 with
# the hint and without it (--layer-stream-mode 16 / 48), graph_check --stream-check, then
# batch 1 after 512-token prompts on both shapes.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
summ() {
  grep -E "^stream pos (5[1-9][0-9]|6[0-9][0-9])" "$1" | python3 -c "
import sys, re
names = 'Anorm qkv qkvwait barA att merged ostage o owait barD Enorm gu guwait barE F Fwait barF'.split()
by = {}
for l in sys.stdin:
    b = l.split()[4]
    by.setdefault(b, []).append(list(map(int, re.findall(r'(?<![A-Za-z])(\d+)(?![A-Za-z])', l.split('|', 1)[1]))))
for b, rows in sorted(by.items()):
    n = len(rows); avg = [sum(r[i] for r in rows) / n / 1980 for i in range(len(names))]
    print(b, n, ' '.join(f'{k}={v:.2f}' for k, v in zip(names, avg)))
"
}
for mode in 16 48; do
  timeout 100 .gpu/bench --no-peer --model-dir /tmp/m-0.6b --prompt 512 --batches 1 --new 128 \
    --layer-stream 8 --layer-stream-mode $mode > "$OUT/trace-$mode.log" 2>&1
  echo "== 0.6b mode $mode rc $?"; summ "$OUT/trace-$mode.log"
done
timeout 150 .gpu/graph_check --model-dir /tmp/m-0.6b --stream-check --layer-stream 8 > "$OUT/sc.log" 2>&1
echo "== stream-check 0.6b rc $? t=$((SECONDS - T0))"
grep -E "^\||graph-check|Error|panic" "$OUT/sc.log" | cut -c1-150 | head -10
for m in 0.6b 1.7b; do
  for v in "" "--layer-stream 8" "--layer-stream 8 --layer-stream-mode 32"; do
    row "$m p512 b1 [$v]" --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 $v
  done
done
timeout 100 .gpu/bench --no-peer --model-dir /tmp/m-1.7b --prompt 512 --batches 1 --new 128 \
  --layer-stream 8 --layer-stream-mode 16 > "$OUT/trace-17.log" 2>&1
echo "== 1.7b mode 16 rc $?"; summ "$OUT/trace-17.log"
echo "done t=$((SECONDS - T0))"
