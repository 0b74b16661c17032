#!/usr/bin/env bash
# On the GPU machine, one call (#29): why graphs and eager steps of the 30B-A3B shape differ
# (graph_check --rows-check: does each cuBLAS matmul of the model's shapes give a row the same
# bits at an eager step's row count as inside its graph bucket?) on the MoE, 1.7B and 0.6B
# shapes; then kernel_check --model-only with the committed defaults (gqa8_split on).
set -u
source scripts/gpu_lib.sh
CFG=tests/fixtures/qwen3/config-30b-a3b.json
[ -d /tmp/m-moe4 ] || timeout 300 .gpu/bench --config $CFG --layers 4 --write-model /tmp/m-moe4 > /dev/null 2>&1
model 0.6b; model 1.7b
for m in moe4 1.7b 0.6b; do
  timeout 150 .gpu/graph_check --model-dir /tmp/m-$m --rows-check > "$OUT/rows-$m.log" 2>&1
  echo "== rows $m rc $?"; grep -E "^\| [a-z]|graph-check|Error" "$OUT/rows-$m.log"
done
python3 - "$CFG" > /tmp/cfg-mix.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 3; c["mlp_only_layers"] = [1]
print(json.dumps(c))
PY
[ -d /tmp/m-mix ] || timeout 200 .gpu/bench --config /tmp/cfg-mix.json --write-model /tmp/m-mix > /dev/null 2>&1
timeout 240 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kc.log" 2>&1
echo "kc rc $?"; grep -E "^kernel-check|FAILED|Error|panic" "$OUT/kc.log" | head -8; grep -c "decode_fused whole" "$OUT/kc.log"
