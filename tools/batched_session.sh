#!/usr/bin/env bash
# One device call for the batched Mosaic walk: GPU tests, build variants checked and
# timed (tools/profile_batched.py: VARIANTS, PROFILE), then wts-bench side by side with
# torch-graph and the Triton kernel over B and the kernel's splits.
# bash tools/batched_session.sh   (SECTIONS=tests,variants,bench[,stacked,noise,floor,ncu,l2prio,wgmma,sparse,sanitizer]; logs and JSON
# under $OUT; SANITIZER_CASES, SANITIZER_TOOLS, SANITIZER_SPIN pick the sanitizer's runs)
set -u
export PYTHONPATH=$PWD WTS_GPU_TESTS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SECTIONS=${SECTIONS:-tests,variants,bench}
has() { [[ ",$SECTIONS," == *",$1,"* ]]; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
python -c "import jax; print('jax', jax.__version__, jax.devices())"
if has tests; then
  stamp tests
  timeout ${TESTS_S:-240} python -m pytest -m gpu ${TESTS:-tests/test_batched_walk_gpu.py} \
    ${PYTEST_X--x} -q -p no:warnings -k "${TESTS_K:-}" 2>&1 | tee "$OUT/batched_gpu_tests.log" | tail -30
fi
if has variants; then
  stamp variants
  timeout ${VARIANTS_S:-250} python tools/profile_batched.py --out "$OUT/variants" \
    --variants "${VARIANTS:-bf16:16:greedy,bf16:64:greedy,int8p:64:greedy}" \
    --profile "${PROFILE:-}" --dump "${DUMP:-}" 2>&1 | grep -v -i warn | tail -40
fi
if has bench; then
  stamp bench
  timeout ${BENCH_S:-300} python tools/bench_variants.py --shape qwen3_4b \
    --head ${BENCH_HEADS:-vanilla} --batch ${BENCH_BATCH:-16,64} --k 7 \
    --mode ${BENCH_MODE:-greedy,sample} --l2 cold --dtype ${BENCH_DTYPE:-bf16} \
    --repeats ${BENCH_REPEATS:-5} --walks-per-repeat ${BENCH_WALKS:-10} \
    --paths ${BENCH_PATHS:-torch-graph,wts-triton,wts-mb,wts-mb-r0s2,wts-mb-r4s2} \
    --out "$OUT/${BENCH_NAME:-batched_bench}.json" 2>&1 | grep -v -i warn | tee "$OUT/batched_bench.log" | tail -40
fi
if has stacked; then   # the stacked int8-planes walk (tools/stacked_probe.py) beside the plan
  stamp stacked
  timeout ${STACKED_S:-250} python tools/stacked_probe.py --out "$OUT/stacked" \
    --batches "${STACKED_BATCHES:-5,16,32,64}" --variants "${STACKED_VARIANTS:-}" \
    --compare "${STACKED_COMPARE-a}" --profile "${STACKED_PROFILE:-}" \
    --dump "${STACKED_DUMP:-}" --special-variant "${STACKED_SPECIAL:-}" 2>&1 | grep -v -i warn | cut -c1-600 | tail -40
fi
if has noise; then   # the sampled epilogue's noise, stage by stage (tools/noise_microbench.py)
  stamp noise
  timeout ${NOISE_S:-120} python tools/noise_microbench.py --out "$OUT/noise_microbench.json" \
    2>&1 | grep -v -i warn | tee "$OUT/noise_microbench.log"
fi
if has floor; then   # the harness's ceilings source by source (tools/floor_microbench.py)
  stamp floor
  timeout ${FLOOR_S:-120} python tools/floor_microbench.py --out "$OUT/floor_microbench.json" \
    2>&1 | grep -v -i warn | tee "$OUT/floor_microbench.log"
fi
if has ncu; then   # a walk's HBM bytes and L2 hit rate (tools/walk_dram_bytes.py)
  stamp ncu
  for dtype in ${NCU_DTYPES:-bf16 int8p}; do
    timeout -k 10 ${NCU_S:-150} ncu --kernel-name regex:mosaic --launch-skip 2 \
      --launch-count ${NCU_COUNT:-3} --csv --metrics \
      dram__bytes_read.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
      python tools/walk_dram_bytes.py --dtype $dtype --batch ${NCU_BATCH:-16} \
      > "$OUT/ncu_$dtype.csv" 2>&1
    echo "(exit status $?)" >> "$OUT/ncu_$dtype.csv"
    grep -v -i warn "$OUT/ncu_$dtype.csv" | tail -12
  done
fi
if has l2prio; then   # whether L2 eviction priorities keep part of a streamed W2 on chip
  stamp l2prio
  nvcc -O3 -arch=sm_90a -o /tmp/l2prio tools/l2_priority_microbench.cu || echo "(nvcc failed)"
  for set_aside in ${L2PRIO_SET_ASIDE:-0 39}; do   # MB of L2 set aside for persisting lines
    timeout ${L2PRIO_S:-60} /tmp/l2prio ${L2PRIO_STEPS:-7} $set_aside \
      | tee -a "$OUT/l2_priority.jsonl"
    echo "(exit status $?)"
  done
fi
if has sparse; then   # a 2:4-sparse int8 WGMMA's layout against the host's products
  stamp sparse
  nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_sparse \
    tools/wgmma_sparse_layout_probe.cu || echo "(nvcc failed)"
  timeout 30 /tmp/wgmma_sparse | tee "$OUT/wgmma_sparse_layout.jsonl"
  echo "(exit status $?)"
fi
if has wgmma; then   # chained WGMMAs' rate: dense vs 2:4-sparse int8, bf16, 1-4 warpgroups
  stamp wgmma
  nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_rate tools/wgmma_rate_probe.cu \
    || echo "(nvcc failed)"
  timeout ${WGMMA_S:-60} /tmp/wgmma_rate ${WGMMA_ITERS:-2000} | tee "$OUT/wgmma_rate.jsonl"
  echo "(exit status $?)"
fi
if has sanitizer; then   # memcheck and racecheck on 4-block batched walks
  stamp sanitizer
  for case in ${SANITIZER_CASES:-batched batched-wg2}; do
    for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
      echo "== $case $tool" | tee -a "$OUT/batched_sanitizer.log"
      # Into a file, not a pipe (a pipe stayed open past the limit while the instrumented
      # python ran on); what outlives the limit is killed before the next tool starts.
      # (No autotuning under the tool: XLA's autotuner times candidates with a delay
      # kernel, which timed out under racecheck in the run where the tool segfaulted.)
      XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_autotune_level=0" \
      timeout -k 10 ${SANITIZER_S:-200} compute-sanitizer --tool $tool python \
        tools/sanitizer_case.py $case 1 ${SANITIZER_SPIN:-16384} > /tmp/sanitizer_case.log 2>&1
      echo "(exit status $?)" >> /tmp/sanitizer_case.log
      pkill -9 -f sanitizer_case.py; sleep 2
      grep -E -v -i "warning:|warnings.warn" /tmp/sanitizer_case.log | tail -6 | tee -a "$OUT/batched_sanitizer.log"
    done
  done
fi
stamp done
