#!/usr/bin/env bash
# One device call for the end-to-end loop: its GPU tests, then wts-e2e-bench, then
# (SECTIONS=attention) the cached-attention variants alone, then (SECTIONS=tabletune)
# TableTune's cost table measured through the loop, (SECTIONS=overhead) the controller's
# cost per iteration, (SECTIONS=agreement) the loop's greedy tokens against the target's
# own decode in fp32 (where bf16 near-ties cannot round apart), (SECTIONS=unfused) the
# bench with the layer's head norms, rotation and cache write outside its attention kernel,
# (SECTIONS=options) the bench with XLA options added to the loop's executables.
#   SECTIONS=tests,bench MODELS=qwen3_4b BATCHES=1,16,64 bash tools/e2e_session.sh
#   SECTIONS=bench BATCHES=1,16 WALKS=pallas ITERS=4 OUT=/tmp/out4 bash tools/e2e_session.sh
#   SECTIONS=options BATCHES=1,16 WALKS=pallas XLA_OPTS='{"...": "..."}' bash tools/e2e_session.sh
#   SECTIONS=attention BATCHES=1,4,16,64 bash tools/e2e_session.sh
#   SECTIONS=attention BATCHES=16,64 SPLITS= LAUNCHES=64x4x2,64x4x3,128x8x2 bash tools/e2e_session.sh
#   SECTIONS=tabletune TARGET=qwen3-4b bash tools/e2e_session.sh
#   SECTIONS=overhead,agreement bash tools/e2e_session.sh
#   SECTIONS=bench,unfused MODELS=qwen3_4b BATCHES=1,16 WALKS=pallas bash tools/e2e_session.sh
# Writes logs and JSON under $OUT.
set -u
export PYTHONPATH=$PWD WTS_GPU_TESTS=1 PYTHONUNBUFFERED=1
# Calls on the same warm machine reuse what earlier ones compiled.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jax_cache}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SECTIONS=${SECTIONS:-tests,bench}
has() { [[ ",$SECTIONS," == *",$1,"* ]]; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
if has tests; then
  stamp tests
  timeout ${TESTS_S:-240} python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_specdecode_gpu.py ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -25 | tee "$OUT/e2e_gpu_tests.log"
fi
# wts-e2e-bench as NAME (writes $OUT/NAME.json and .log) with the Python lines PATCH run
# before it, the rest of the arguments added to the shared ones.
bench_run() {
  local name=$1 patch=$2; shift 2
  timeout ${BENCH_S:-420} python3 -c "
import sys
$patch
from wts_jax.specdecode import bench_e2e
sys.exit(bench_e2e.main(sys.argv[1:]))" --models ${MODELS:-qwen3_4b} \
    --batches ${BATCHES:-1,16,64} --walks ${WALKS:-pallas,xla,none} \
    --repeats ${REPEATS:-3} --chain ${CHAIN:-4} --method ${METHOD:-generate} --new-tokens ${NEW:-64} \
    --iterations-per-check ${ITERS:-1} --time-budget ${BUDGET:-360} "$@" \
    --out "$OUT/$name.json" 2>&1 | grep -v Warning | tee "$OUT/$name.log"
}
# The Perfetto trace of profile folder $1 (its first), back as $OUT/$2.
trace_back() {
  local f
  f=$(find "$1" -name perfetto_trace.json.gz 2>/dev/null | head -1)
  [ -n "$f" ] && cp "$f" "$OUT/$2"
}
if has bench; then
  stamp bench
  bench_run e2e "" --profile /tmp/e2e_profile ${AGREEMENT:+--agreement}
fi
if has unfused; then   # the same bench with the layer's norms, rotation and cache write
  # outside the attention kernel (the alternative of docs/decisions.md's choice)
  stamp unfused
  bench_run e2e_unfused "from wts_jax.specdecode import qkv_attention
qkv_attention.supported = lambda *args: False"
fi
if has options; then   # the same bench with XLA options added to the loop's executables
  # (XLA_OPTS, a JSON object), e.g. no command buffers at all:
  # XLA_OPTS='{"xla_gpu_enable_command_buffer": ""}' (every op a stream launch; docs/decisions.md)
  stamp "options ${XLA_OPTS:-}"
  # A cache of their own: jax keeps XLA's per-fusion autotune results in the compilation
  # cache's folder, keyed by the fusion alone, so an option that changes the autotuning
  # (e.g. xla_gpu_exhaustive_tiling_search) would be answered by the baseline's results.
  JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR}_options_$(echo "${XLA_OPTS:-}" | md5sum | cut -c1-12) \
  bench_run e2e_options "import json, os
from wts_jax.specdecode import loop
extra, base = json.loads(os.environ.get('XLA_OPTS') or '{}'), loop.gpu_compiler_options
loop.gpu_compiler_options = lambda **kw: {**base(**kw), **extra}" --profile /tmp/e2e_profile_options
  trace_back /tmp/e2e_profile_options/B1_pallas trace_options_B1_pallas.json.gz
fi
if has bench; then   # the traces back: the autoregressive decodes' (each step's time is
  # theirs, recomputable with phase_profile.device_time) and one of the loop's
  for d in /tmp/e2e_profile/*; do
    case "$(basename "$d")" in
      *_autoregressive_*|B1_pallas) trace_back "$d" "trace_$(basename "$d").json.gz" ;;
    esac
  done
fi
if has attention; then   # the cache-attention kernel beside JAX's shipped one and XLA
  stamp attention
  timeout ${ATTENTION_S:-300} python3 tools/attention_bench.py --batches ${BATCHES:-1,4,16,64} \
    --splits "${SPLITS-1,2,4,8,16}" --launches "${LAUNCHES:-}" \
    --out "$OUT/attention_bench.json" 2>&1 | grep -v Warning | tee "$OUT/attention_bench.log"
fi
if has tabletune; then
  stamp tabletune
  target=${TARGET:-qwen3-4b}
  timeout ${TABLETUNE_S:-420} python3 -m wts_jax.tabletune.cli profile --cost loop \
    --target "$target" --draft-lens ${DRAFT_LENS:-0,1,2,3,5,7} \
    --batches ${TT_BATCHES:-1,4,16,32,64,128} --budget-s ${TT_BUDGET:-300} \
    --out "$OUT/${target//-/_}_tabletune_costs.json" 2>&1 | tee "$OUT/tabletune_profile.log"
fi
if has overhead; then
  stamp overhead
  batches=${OVERHEAD_BATCHES:-1,16,64}
  for b in ${batches//,/ }; do
    timeout 120 python3 -m wts_jax.tabletune.cli overhead --batch "$b" \
      --costs ${COSTS:-bench/results/h200_qwen3_4b_tabletune_costs.json} 2>&1 | grep '^{'
  done | tee "$OUT/tabletune_overhead.jsonl"
fi
if has agreement; then
  stamp agreement
  timeout ${AGREEMENT_S:-300} python3 -m wts_jax.specdecode.bench_e2e \
    --models ${AGREEMENT_MODELS:-qwen3_8b} --batches ${AGREEMENT_BATCHES:-16} --walks pallas \
    --dtype float32 --repeats 1 --chain 1 --new-tokens ${NEW:-64} --time-budget 240 \
    --profile /tmp/e2e_profile_fp32 --out "$OUT/e2e_fp32_agreement.json" 2>&1 \
    | grep -v Warning | tee "$OUT/e2e_fp32_agreement.log"
fi
stamp done
