# Sourced by the prefill scripts (scripts/gpu_prefill*.sh, gpu_split_kv.sh) on the GPU machine:
# $OUT and the summary file $S, the CUDA libraries on the path, the binaries of .gpu/ unpacked,
# and two helpers.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh

# model SHAPE: a random model of tests/fixtures/qwen3/config-SHAPE.json in /tmp/m-SHAPE (once).
model() {
  [ -d "/tmp/m-$1" ] || timeout 300 .gpu/bench --config "tests/fixtures/qwen3/config-$1.json" \
    --write-model "/tmp/m-$1" > /dev/null 2>&1
}

# run NAME ARGS...: one bench of a single sequence (8 new tokens); its prefill/mixed rows into
# the summary, prefixed by NAME.
run() {
  local name=$1; shift
  timeout 100 .gpu/bench --no-peer --batches 1 --new 8 "$@" > "$OUT/bench-$name.log" 2>&1
  grep -E "^ours (prefill|batched|mixed)" "$OUT/bench-$name.log" | sed "s/^/$name /" | tee -a "$S"
}
