# Sourced by the prefill scripts (scripts/gpu_prefill*.sh, gpu_split_kv.sh) on the GPU machine:
# $OUT and the summary file $S, the CUDA libraries on the path, the binaries of .gpu/ unpacked,
# and the helpers below.
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh

# model SHAPE: a random model of tests/fixtures/qwen3/config-SHAPE.json in /tmp/m-SHAPE (once).
model() {
  [ -d "/tmp/m-$1" ] || timeout 300 .gpu/bench --config "tests/fixtures/qwen3/config-$1.json" \
    --write-model "/tmp/m-$1" > /dev/null 2>&1
}

# moe48_sweep SECONDS "BENCH ARGS" VARIANT...: the 30B-A3B shape whole (48 layers, ~61 GB)
# written to /dev/shm, `sweep moe48` over it (BENCH ARGS after its --model-dir), then removed.
moe48_sweep() {
  local s=$1 args=$2; shift 2
  timeout "$(cap 200)" .gpu/bench --config tests/fixtures/qwen3/config-30b-a3b.json \
    --write-model /dev/shm/m-moe48 > "$OUT/w48.log" 2>&1
  echo "== write48 rc $? t=$((SECONDS - T0))"
  sweep moe48 "$s" "--model-dir /dev/shm/m-moe48 $args" "$@"
  rm -rf /dev/shm/m-moe48
}
# moe_model LAYERS: a random model of the 30B-A3B shape with LAYERS layers in /tmp/m-moeLAYERS;
# mix_model: its 3-layer variant with a dense layer among the sparse ones in /tmp/m-mix (once).
moe_model() {
  [ -d "/tmp/m-moe$1" ] || timeout 300 .gpu/bench --config tests/fixtures/qwen3/config-30b-a3b.json \
    --layers "$1" --write-model "/tmp/m-moe$1" > /dev/null 2>&1
}
mix_model() {
  [ -d /tmp/m-mix ] && return
  python3 - tests/fixtures/qwen3/config-30b-a3b.json > /tmp/cfg-mix.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 3; c["mlp_only_layers"] = [1]
print(json.dumps(c))
PY
  timeout 200 .gpu/bench --config /tmp/cfg-mix.json --write-model /tmp/m-mix > /dev/null 2>&1
}

# run NAME ARGS...: one bench of a single sequence (8 new tokens); its prefill/mixed rows into
# the summary, prefixed by NAME.
run() {
  local name=$1; shift
  timeout 100 .gpu/bench --no-peer --batches 1 --new 8 "$@" > "$OUT/bench-$name.log" 2>&1
  grep -E "^ours (prefill|batched|mixed)" "$OUT/bench-$name.log" | sed "s/^/$name /" | tee -a "$S"
}

# left [S]: whether this call has run less than S seconds (by default $BUDGET, else 540) since
# gpu_lib.sh was sourced (a call is cut at 600, or sooner when less device time is left: set
# BUDGET to what the call may spend, less a minute); cap S: S, or the seconds left before
# BUDGET + 30 if fewer (a command's timeout that ends before the call is cut).
T0=$SECONDS
left() { [ $((SECONDS - T0)) -lt "${1:-${BUDGET:-540}}" ]; }
cap() {
  local rem=$(( ${BUDGET:-540} + 30 - (SECONDS - T0) ))
  [ "$rem" -lt 5 ] && rem=5
  echo $(( $1 < rem ? $1 : rem ))
}

# row LABEL ARGS...: one `bench --no-peer ARGS` (not started once `left` says no), its decode
# and mixed rows (graphs and eager, with ms a step) on one line after LABEL and the call's time.
row() {
  local l=$1; shift
  left || { echo "== $l skipped (time)"; return; }
  timeout 120 .gpu/bench --no-peer "$@" > "$OUT/b.log" 2>&1
  echo "== $l rc $? t=$((SECONDS - T0)): $(grep -E "^ours(-eager)? (decode|mixed)|Error" "$OUT/b.log" \
    | sed 's/ours decode batch //; s/; prefill of batch/ pf/' | paste -sd' ')"
}

# sweep NAME SECONDS "BENCH ARGS" VARIANT...: one `bench --no-peer BENCH_ARGS` with each VARIANT
# (a string of kernel flags, "" for the defaults) as a `--variant` (log $OUT/sweep-NAME.log, cut
# at SECONDS; not started once `left` says no): the variants' engines one after another in one
# process, `--variant-rounds` (default 2) rounds interleaved; a line a variant, round and batch.
sweep() {
  local n=$1 s=$2 args=$3; shift 3
  left || { echo "== sweep $n skipped (time)"; return; }
  local v=() x
  for x in "$@"; do v+=(--variant "$x"); done
  # shellcheck disable=SC2086 # the bench's arguments are words
  timeout "$(cap "$s")" .gpu/bench --no-peer $args "${v[@]}" > "$OUT/sweep-$n.log" 2>&1
  echo "== sweep $n rc $? t=$((SECONDS - T0))"
  grep -E "^variant .* decode|^variant .* run 1 setup|Error|panic" "$OUT/sweep-$n.log" \
    | sed 's/^variant //; s/ decode batch / b/; s/; prefill of batch [0-9]* ms//'
}

# ab SHAPE BATCHES [PREV FLAGS]: .gpu/bench_prev (the build before a change, carried beside
# .gpu/bench; PREV FLAGS given to it alone) and .gpu/bench in turn, one process each, three
# rounds on /tmp/m-SHAPE (512-token prompts, 128 new tokens; not started once `left` says no):
# their decode rows, a line a binary and round (logs $OUT/ab-SHAPE-BIN-ROUND.log).
ab() {
  local r b extra
  chmod +x .gpu/bench_prev
  for r in 1 2 3; do
    for b in bench_prev bench; do
      left || return
      extra=""; [ "$b" = bench_prev ] && extra="${3:-}"
      # shellcheck disable=SC2086 # the flags are words or nothing
      timeout "$(cap 60)" .gpu/$b --no-peer --model-dir "/tmp/m-$1" --prompt 512 --batches "$2" \
        --new 128 $extra > "$OUT/ab-$1-$b-$r.log" 2>&1
      echo "$1 $b r$r: $(grep -E "^ours decode|Error|panic" "$OUT/ab-$1-$b-$r.log" \
        | sed 's/ours decode batch / b/; s/; prefill of batch.*//' | paste -sd' ')"
    done
  done
}

# kc NAME SECONDS ARGS...: one `kernel_check ARGS` (log $OUT/NAME.log, cut at SECONDS): its rc,
# the call's time and the summary and failure lines.
kc() {
  local n=$1 s=$2; shift 2
  timeout "$(cap "$s")" .gpu/kernel_check "$@" > "$OUT/$n.log" 2>&1
  echo "== $n rc $? t=$((SECONDS - T0))"
  grep -E "^kernel-check|FAIL|Error|panic" "$OUT/$n.log" | head -8
}

# counted LOG PATTERN LABEL: how many of LOG's lines match PATTERN, and how many of those failed.
counted() {
  echo "$3 checks: $(grep -c "$2" "$1"), failed: $(grep "$2" "$1" | grep -c FAIL)"
}

# timelines SHAPE FLAGS...: the block timeline of a decode step (.gpu/graph_check_tl
# --timeline, the `timeline` feature's build) on /tmp/m-SHAPE once for each string of kernel
# flags ("" for the defaults): log $OUT/tl-I.log, the fused attention's rows and the step's
# span printed, the CSV xz'd into $OUT/tl-I.csv.xz.
timelines() {
  local m=$1 i=0 v
  shift
  for v in "$@"; do
    i=$((i + 1))
    # shellcheck disable=SC2086 # the flags are words
    timeout "$(cap 60)" .gpu/graph_check_tl --model-dir "/tmp/m-$m" --timeline "/tmp/tl-$i.csv" \
      $v > "$OUT/tl-$i.log" 2>&1
    echo "== timeline $m [$v] rc $? t=$((SECONDS - T0))"
    grep "^| fused_decode" "$OUT/tl-$i.log" | tail -7
    grep "releases span" "$OUT/tl-$i.log"
    [ -f "/tmp/tl-$i.csv" ] && xz -c "/tmp/tl-$i.csv" > "$OUT/tl-$i.csv.xz"
  done
}

# tma_bits: kernel_check --gemv-only on /tmp/m-0.6b (log $OUT/gemv.log) and the count of its
# streamed 1-row matmul checks (tma_bits) and their failures.
tma_bits() {
  kc gemv 100 --model-dir /tmp/m-0.6b --gemv-only
  echo "gemv_tma checks: $(grep -c "gemv_tma" "$OUT/gemv.log"), failed: $(grep "gemv_tma" "$OUT/gemv.log" | grep -c FAIL)"
}
