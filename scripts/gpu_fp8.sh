#!/usr/bin/env bash
# On the GPU machine (#27): fp8 (e4m3) KV. PARTS (default: check bench parity http; full: every
# kernel_check, bf16 included):
#  check   kernel_check --fp8-only on the 0.6B random model: every fp8 kernel against a
#          dequantized reference, then the engine over fp8 KV (graphs = eager, vs bf16 KV);
#  mma     kernel_check --mma-only: the tensor-core decode attention against an f32 reference
#          and the CUDA-core kernel, the engine with it (32 greedy sequences), both timed;
#  bench   capacity (the engine line: kv_dtype, kv_blocks) and decode tok/s, bf16 vs fp8 KV
#          in one run per shape: 0.6B at BATCHES06 (1,64,256,512), 1.7B at BATCHES17 (64,256);
#          for each of VARIANTS ("default": the default flags, the tensor-core decode attention;
#          "cores": the CUDA-core one, `--no-mma-decode`; "mmaN": the tensor-core one of N
#          shared-memory stages, `--mma-decode-stages N`); shapes BENCH_SHAPES (0.6b 1.7b);
#  parity  logits with bf16 KV and with fp8 KV (one prefill chunk; chunks of 64) against HF
#          transformers (torch f32 math reference, torch bf16 beside) on transformers-initialised
#          0.6B and 1.7B checkpoints (scripts/hf_init_model.py) at 203 and LONG (4096) tokens
#          (last 256 positions);
#  http    the 500-request HTTP run (scripts/gpu_defaults.sh HTTP=1) with --kv-cache-dtype fp8.
set -u
source scripts/gpu_lib.sh
PARTS=${PARTS:-check bench parity http}
has() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

if has check; then
  model 0.6b
  echo "== kernel_check --fp8-only (0.6B)" | tee -a "$S"
  timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b --fp8-only > "$OUT/kernel_check_fp8.log" 2>&1
  echo "exit $?" | tee -a "$S"
  grep -E "FAIL|kernel-check|skipped|fp8 vs bf16" "$OUT/kernel_check_fp8.log" | tee -a "$S"
fi

if has mma; then
  model 0.6b
  echo "== kernel_check --mma-only (0.6B)" | tee -a "$S"
  timeout 300 .gpu/kernel_check --model-dir /tmp/m-0.6b --mma-only > "$OUT/kernel_check_mma.log" 2>&1
  echo "exit $?" | tee -a "$S"
  grep -E "FAIL|kernel-check|skipped|^\||before divergence" "$OUT/kernel_check_mma.log" | tee -a "$S"
fi

if has full; then
  model 0.6b
  echo "== kernel_check (every check, 0.6B)" | tee -a "$S"
  timeout 400 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check_full.log" 2>&1
  echo "exit $?" | tee -a "$S"
  grep -E "FAIL|kernel-check" "$OUT/kernel_check_full.log" | tee -a "$S"
fi

if has bench; then
  for shape in ${BENCH_SHAPES:-0.6b 1.7b}; do
    model $shape
    b=$([ $shape = 0.6b ] && echo "${BATCHES06:-1,64,256,512}" || echo "${BATCHES17:-64,256}")
    for v in ${VARIANTS:-default}; do
      case $v in
        default) flag= ;;
        cores) flag=--no-mma-decode ;;
        *) flag="--mma-decode-stages ${v#mma}" ;;
      esac
      for kv in auto fp8; do
        echo "== bench $shape $v kv $kv batches $b" | tee -a "$S"
        timeout 200 .gpu/bench --no-peer --model-dir /tmp/m-$shape --batches $b --kv-cache-dtype $kv \
          $flag > "$OUT/bench-$shape-$v-$kv.log" 2>&1
        grep -oE "kv_dtype: [A-Z0-9a-z]+, num_blocks: [0-9]+" "$OUT/bench-$shape-$v-$kv.log" | tee -a "$S"
        grep -E "^ours" "$OUT/bench-$shape-$v-$kv.log" | tee -a "$S"
      done
    done
  done
fi

if has parity; then
  LONG=${LONG:-4096}
  for shape in ${SHAPES:-0.6b 1.7b}; do
    dir=/tmp/hf-$shape
    [ -d $dir ] || python3 scripts/hf_init_model.py tests/fixtures/qwen3/config-$shape.json tests/fixtures/qwen3 $dir 2>&1 | tail -1
    for n in 203 $LONG; do
      python3 -c "
import numpy as np
r = np.random.RandomState($n)
print(','.join(str(x) for x in [151644, 8948, 198] + list(r.randint(0, 151643, $n - 3))))" > /tmp/ids-$n.txt
      last=$([ $n -gt 256 ] && echo 256 || echo $n)
      # fp8: the prompt in one chunk (its own K/V attended unrounded), and in chunks of 64
      # (every later chunk attends over a prefix read back from the fp8 cache).
      for run in bf16:4096 fp8:4096 fp8:64; do
        kv=${run%%:*}; chunk=${run##*:}
        timeout 120 .gpu/policy-serve logits --model-dir $dir --ids "$(cat /tmp/ids-$n.txt)" --last $last \
          --out /tmp/ours-$shape-$n-$kv-$chunk.npy --device cuda --dtype bf16 --kv-cache-dtype $kv \
          --prefill-chunk $chunk > "$OUT/logits-$shape-$n-$kv-$chunk.log" 2>&1 \
          || tail -3 "$OUT/logits-$shape-$n-$kv-$chunk.log" | tee -a "$S"
      done
      echo "== parity $shape hf-init $n tokens" | tee -a "$S"
      LAST=$last timeout 200 python3 scripts/hf_logits_check.py $dir @/tmp/ids-$n.txt \
        ours-bf16=/tmp/ours-$shape-$n-bf16-4096.npy ours-fp8kv=/tmp/ours-$shape-$n-fp8-4096.npy \
        ours-fp8kv-c64=/tmp/ours-$shape-$n-fp8-64.npy 2>&1 | grep -E "hf-check|Error|error" | tee -a "$S"
    done
  done
fi

if has http; then
  echo "== HTTP, --kv-cache-dtype fp8" | tee -a "$S"
  SHAPES= HTTP=1 SERVE_ARGS="--kv-cache-dtype fp8 ${SERVE_ARGS:-}" bash scripts/gpu_defaults.sh > /dev/null 2>&1
fi
