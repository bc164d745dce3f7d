#!/usr/bin/env bash
# One device call for the weight-product kernel: its check against XLA at every Qwen3
# shape, the decode loop with it (wts-e2e-bench), then the sweep of its cuts with the
# call's remaining time. Writes logs and JSON under $OUT.
#   LIMIT=560 bash tools/products_session.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s)
left() { echo $(( ${LIMIT:-560} - ($(date +%s) - t0) )); }
timeout ${CHECK_S:-150} python3 tools/products_bench.py --phases check --rows ${ROWS:-1,8,16,128} \
  --out "$OUT/products_check.json" 2>&1 | grep -v Warning | tee "$OUT/products_check.log"
echo "[$(( $(date +%s) - t0 )) s] e2e"
timeout ${E2E_S:-290} python3 -m wts_jax.specdecode.bench_e2e --models ${MODELS:-qwen3_4b} \
  --batches ${BATCHES:-1,16} --walks ${WALKS:-pallas,xla} --products ${PRODUCTS:-pallas} \
  --repeats 3 --chain 4 --method generate --new-tokens 64 --profile /tmp/e2e_profile \
  --time-budget $(( ${E2E_S:-290} - 20 )) --out "$OUT/e2e.json" 2>&1 | grep -v Warning | tee "$OUT/e2e.log"
echo "[$(( $(date +%s) - t0 )) s] sweep"
s=$(left); [ "$s" -gt 30 ] && timeout $s python3 tools/products_bench.py --phases sweep \
  --out "$OUT/products_sweep.json" 2>&1 | grep -v Warning > "$OUT/products_sweep.log"
echo "[$(( $(date +%s) - t0 )) s] done"
