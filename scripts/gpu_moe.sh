#!/usr/bin/env bash
# On the GPU machine (#29): Qwen3-MoE in the Qwen3-30B-A3B shape with fewer layers.
#  1. a checkpoint transformers initialised itself (scripts/hf_init_model.py, LAYERS_HF layers):
#     our bf16 logits vs transformers (f32 math reference, torch bf16 beside ours);
#  2. kernel_check --model-only on a random model with a dense layer among sparse ones
#     (kernels vs candle ops: prefill, chunk, decode 8/2/1 rows; greedy tokens of two engines);
#  3. bench: decode tok/s at batch 1, 8, 64, 256 and prefill, LAYERS_BENCH layers; then once
#     more per kernel variant in VARIANTS (';'-separated flag sets, e.g.
#     VARIANTS="--no-moe-tile-one;--moe-norm-router"), with VARIANT_ARGS (default: the same).
set -u
source scripts/gpu_lib.sh
LAYERS_HF=${LAYERS_HF:-4}
LAYERS_BENCH=${LAYERS_BENCH:-12}
CFG=tests/fixtures/qwen3/config-30b-a3b.json
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee -a "$S"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" | tee -a "$S"
if [ -z "${SKIP_HF:-}" ]; then
  python3 - "$CFG" "$LAYERS_HF" > /tmp/cfg-hf.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = int(sys.argv[2]); c["max_window_layers"] = int(sys.argv[2])
print(json.dumps(c))
PY
  dir=/tmp/hf-moe
  [ -d $dir ] || timeout 240 python3 scripts/hf_init_model.py /tmp/cfg-hf.json tests/fixtures/qwen3 $dir 2>&1 | tail -2 | tee -a "$S"
  python3 -c "import json; c = json.load(open('$dir/config.json')); print('hf-init config', {k: c.get(k) for k in ['model_type', 'num_experts', 'num_local_experts', 'num_experts_per_tok', 'moe_intermediate_size', 'norm_topk_prob', 'decoder_sparse_step', 'mlp_only_layers']})" | tee -a "$S"
  python3 -c "
import json; from safetensors import safe_open; import glob
names = [n for f in glob.glob('$dir/*.safetensors') for n in safe_open(f, 'pt').keys()]
print('hf-init tensors', len(names), [n for n in names if 'layers.0.mlp' in n][:4])" 2>&1 | tee -a "$S"
  for n in 203 1024; do
    python3 -c "
import numpy as np
r = np.random.RandomState($n)
print(','.join(str(x) for x in [151644, 8948, 198] + list(r.randint(0, 151643, $n - 3))))" > /tmp/ids-$n.txt
    last=$([ $n -gt 256 ] && echo 256 || echo $n)
    timeout 120 .gpu/policy-serve logits --model-dir $dir --ids "$(cat /tmp/ids-$n.txt)" --last $last --out /tmp/ours-$n.npy --device cuda --dtype bf16 > "$OUT/logits-$n.log" 2>&1
    tail -2 "$OUT/logits-$n.log"
    echo "== moe hf-init $n tokens" | tee -a "$S"
    LAST=$last timeout 180 python3 scripts/hf_logits_check.py $dir @/tmp/ids-$n.txt ours-bf16=/tmp/ours-$n.npy 2>&1 | grep -E "hf-check|Error|error" | tail -5 | tee -a "$S"
  done
fi
if [ -z "${SKIP_CHECK:-}" ]; then
  python3 - "$CFG" > /tmp/cfg-mix.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 3; c["mlp_only_layers"] = [1]
print(json.dumps(c))
PY
  [ -d /tmp/m-mix ] || timeout 200 .gpu/bench --config /tmp/cfg-mix.json --write-model /tmp/m-mix 2>&1 | tail -1
  echo "== kernel_check --model-only (3 layers, layer 1 dense)" | tee -a "$S"
  timeout 240 .gpu/kernel_check --model-dir /tmp/m-mix --model-only > "$OUT/kernel_check.log" 2>&1
  echo "rc $?" | tee -a "$S"
  grep -E "rel_err|kernel-check|FAILED|not checked|moe timing|Error" "$OUT/kernel_check.log" | grep -v " ok$" | tail -40 | tee -a "$S"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  echo "== bench 30b-a3b shape, $LAYERS_BENCH of 48 layers ${BENCH_ARGS:-}" | tee -a "$S"
  [ -d /tmp/m-moe$LAYERS_BENCH ] || timeout 200 .gpu/bench --config $CFG --layers $LAYERS_BENCH --write-model /tmp/m-moe$LAYERS_BENCH 2>&1 | tail -1
  timeout 420 .gpu/bench --model-dir /tmp/m-moe$LAYERS_BENCH --no-peer --new 64 ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "rc $?" | tee -a "$S"
  grep -E "^ours|^# engine|^#|Error|error" "$OUT/bench.log" | tail -30 | tee -a "$S"
  IFS=';' read -ra vs <<< "${VARIANTS:-}"
  for v in "${vs[@]}"; do
    echo "== bench variant $v" | tee -a "$S"
    timeout 300 .gpu/bench --model-dir /tmp/m-moe$LAYERS_BENCH --no-peer --new 64 ${VARIANT_ARGS:-${BENCH_ARGS:-}} $v \
      > "$OUT/bench-variant.log" 2>&1
    grep -E "^ours decode|Error|error" "$OUT/bench-variant.log" | sed "s/^/[$v] /" | tee -a "$S"
  done
fi
if [ -n "${HTTP:-}" ]; then
  # The HTTP host on the same model: N streamed chat completions, 512 in / 128 out, at once.
  echo "== HTTP ${N:-500} x 512/128, 30b-a3b shape, $LAYERS_BENCH layers" | tee -a "$S"
  SHAPE=moe$LAYERS_BENCH AGENT=0 N=${N:-500} T1=${T1:-200} bash scripts/gpu_serve.sh > "$OUT/http.log" 2>&1
  grep -E "engine ready|req/s|tok/s|TTFT|TPOT|fail|error" "$OUT/http.log" | cut -c1-300 | tail -12 | tee -a "$S"
fi
