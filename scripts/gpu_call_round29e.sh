#!/usr/bin/env bash
# On the GPU machine, one call (#29): the one-warp routing of one-token MoE steps
# (moe_route_one, on by default). kernel_check --model-only on the mixed 3-layer 30B-A3B-shape
# model (the experts' output against the block routing's bit for bit at every one-token tile
# kind, the routing timed both ways, and every MoE and model check with it on), then decode at
# batches 1 and 2 on LAYERS layers (default 4), default and --no-moe-route-one.
set -u
source scripts/gpu_lib.sh
CFG=tests/fixtures/qwen3/config-30b-a3b.json
L=${LAYERS:-4}
python3 - "$CFG" > /tmp/cfg-mix.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 3; c["mlp_only_layers"] = [1]
print(json.dumps(c))
PY
[ -d /tmp/m-mix ] || timeout 200 .gpu/bench --config /tmp/cfg-mix.json --write-model /tmp/m-mix > /dev/null 2>&1
timeout 200 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kernel_check.log" 2>&1
echo "kc model rc $?"; grep -E "^kernel-check|FAILED|Error" "$OUT/kernel_check.log" | head -8
grep -cE "one warp = block.* ok$" "$OUT/kernel_check.log"; grep -E "moe timing T1 routing" "$OUT/kernel_check.log"
[ -d /tmp/m-moe$L ] || timeout 200 .gpu/bench --config $CFG --layers $L --write-model /tmp/m-moe$L > /dev/null 2>&1
for r in 1 2; do for v in "" "--no-moe-route-one"; do
  timeout 60 .gpu/bench --model-dir /tmp/m-moe$L --no-peer --new 64 --prompt 256 --batches 1,2 $v > "$OUT/b.log" 2>&1
  echo "== moe $L layers run $r [$v] rc $?"; grep -E "^ours decode|Error" "$OUT/b.log" | sed 's/ (.*//; s/ours decode batch //' | paste -sd' '
done; done
