set -u; OUT=${OUT:-/tmp/out}; S=$OUT/summary.txt
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash scripts/gpu_unpack.sh
for c in 0.6b 1.7b; do .gpu/bench --config tests/fixtures/qwen3/config-$c.json --write-model /tmp/m-$c > /dev/null 2>&1; done
timeout 150 .gpu/kernel_check --model-dir /tmp/m-0.6b > "$OUT/kernel_check.log" 2>&1; echo "kernel_check exit $?" | tee -a "$S"; grep -E "FAIL|kernel-check" "$OUT/kernel_check.log" | tee -a "$S"
for pdl in 1 0; do POLICY_SERVE_PDL=$pdl timeout 30 .gpu/graph_check --model-dir /tmp/m-0.6b --profile 1,2,8 2>&1 | grep -v WARN > "$OUT/profile-pdl$pdl.txt"; grep -E "graph replay" "$OUT/profile-pdl$pdl.txt" | sed "s/^/pdl=$pdl /" | tee -a "$S"; done
timeout 200 .gpu/graph_check --model-dir /tmp/m-0.6b > "$OUT/graph_check.log" 2>&1; echo "graph_check exit $?" | tee -a "$S"; grep -v WARN "$OUT/graph_check.log" | grep -E "shrink|engine|stress|graph-check|FAIL" | tee -a "$S"
timeout 90 .gpu/bench --model-dir /tmp/m-0.6b --no-peer --compare-eager --batches 1,2,4,8,16,64,256 > "$OUT/bench-0.6b.log" 2>&1; grep -E "^(ours|check)" "$OUT/bench-0.6b.log" | tee -a "$S"
timeout 60 .gpu/bench --model-dir /tmp/m-1.7b --no-peer --compare-eager --batches 1,8,64 > "$OUT/bench-1.7b.log" 2>&1; grep -E "^ours(-eager)? decode" "$OUT/bench-1.7b.log" | sed 's/^/1.7b /' | tee -a "$S"
echo "==== summary"; cat "$S"
