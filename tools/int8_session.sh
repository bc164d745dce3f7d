#!/usr/bin/env bash
# One device call for the int8 x int8 Mosaic walk: GPU tests, device time (CUPTI) with
# the host cost beside it, a residency/ring sweep and the side by side with torch-graph.
# bash tools/int8_session.sh   (SECTIONS=tests,time,sweep,side; logs and JSON under $OUT)
set -u
export PYTHONPATH=$PWD WTS_GPU_TESTS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SECTIONS=${SECTIONS:-tests,time,sweep}
has() { [[ ",$SECTIONS," == *",$1,"* ]]; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
if has tests; then
  stamp tests
  timeout ${TESTS_S:-150} python -m pytest -m gpu tests/test_int8_planes.py -x -q -s \
    -k "${TESTS_K:-gpu}" 2>&1 | grep -v -i warn | tee "$OUT/int8_gpu_tests.log" | tail -25
fi
if has time; then
  stamp time
  for held in ${TIME_REGISTERS:-0}; do
    timeout ${TIME_S:-100} python tools/device_time.py --dtype ${TIME_DTYPES:-int8p} \
      --batch ${TIME_BATCH:-1} --k 1,7 --walks 20 --register-chunks $held --out "$OUT" \
      2>&1 | grep -v -i warn | tee -a "$OUT/device_time.log"
  done
fi
if has sweep; then
  stamp sweep
  timeout ${SWEEP_S:-220} python tools/bench_variants.py --shape qwen3_4b --head vanilla \
    --batch ${SWEEP_BATCH:-1} --k 7 --mode ${SWEEP_MODE:-greedy} --l2 cold \
    --dtype bf16,int8p --repeats 6 --walks-per-repeat 10 \
    --paths ${SWEEP_PATHS:-torch-graph,wts,wts-mw-r10s2h1,wts-mw-r10s2h10,wts-mw-r10s2g2h5,wts-mw-r10s2g2h10,wts-mw-r12s1h6,wts-mw-r12s1h12,wts-mw-r10s2h5x4,wts-mw-r12s0h6x6} \
    --out "$OUT/int8_sweep.json" 2>&1 | grep -v -i warn | tee "$OUT/int8_sweep.log" | tail -30
fi
if has profile; then
  stamp profile
  timeout ${PROFILE_S:-150} python tools/profile_mosaic.py --out /tmp/profile_int8p \
    --splits ${PROFILE_SPLITS:-10/2,2/2,12/0/1/6,10/2/1/4} --batch 1 --gemv wgmma \
    --dtype int8p 2>&1 | grep -v -i warn | tee "$OUT/profile_int8p.log"
fi
if has side; then
  stamp side
  timeout ${SIDE_S:-250} python tools/bench_variants.py --shape qwen3_4b --head vanilla \
    --batch 1,4 --k 7 --mode greedy,sample --l2 cold --dtype bf16,int8p \
    --paths ${SIDE_PATHS:-torch-graph,wts} \
    --out "$OUT/int8_side.json" 2>&1 | grep -v -i warn | tee "$OUT/int8_side.log" | tail -30
fi
stamp done
