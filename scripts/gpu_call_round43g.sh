#!/usr/bin/env bash
# Round 43, call 7: where the streamed step's time goes: --layer-stream-mode 16 prints each
# layer's phases (SM cycles) on blocks 0 and 77 at positions 512, 544, ...; the averages over
# layers and steps by field, 0.6B and 1.7B, 8 pieces a warp.
set -u
source scripts/gpu_lib.sh
model 0.6b; model 1.7b; echo "models t=$((SECONDS - T0))"
for m in 0.6b 1.7b; do
  timeout 100 .gpu/bench --no-peer --model-dir /tmp/m-$m --prompt 512 --batches 1 --new 128 \
    --layer-stream 8 --layer-stream-mode 16 > "$OUT/trace-$m.log" 2>&1
  echo "== $m rc $? lines $(grep -c '^stream pos' "$OUT/trace-$m.log")"
  grep "^stream pos" "$OUT/trace-$m.log" | head -2 | cut -c1-250
  for b in b0 b77; do
    grep "^stream pos" "$OUT/trace-$m.log" | grep " $b " | awk -v b=$b '{
      n++; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/ || $i ~ /^\(?[0-9]+\)?$/) { v = $i; gsub(/[()]/, "", v); s[i] += v }
      if (n == 1) for (i = 1; i <= NF; i++) w[i] = $i
    } END {
      printf "%s avg of %d:", b, n; for (i = 1; i <= NF; i++) if (i in s && i > 5) printf " %s=%.0f", w[i-1], s[i] / n; printf "\n"
    }'
  done
done
echo "done t=$((SECONDS - T0))"
