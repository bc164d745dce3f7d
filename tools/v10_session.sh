#!/usr/bin/env bash
# One device call: GPU tests of the rolled kernels, then the batched variants timed.
set -u
export PYTHONPATH=$PWD WTS_GPU_TESTS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stamp tests
timeout ${TESTS_S:-300} python -m pytest -m gpu ${TESTS:-tests/test_batched_walk_gpu.py} -q -x \
  -k "${TESTS_K:-}" 2>&1 | grep -v -i warn | tee "$OUT/gpu_tests.log" | tail -15
stamp variants
timeout ${VARIANTS_S:-250} python tools/profile_batched.py --out "$OUT/variants" \
  --variants "${VARIANTS}" --profile "${PROFILE:-}" 2>&1 | grep -v -i warn | tail -40
stamp done
