#!/usr/bin/env bash
# The default side-by-side (Qwen3-4B vanilla, B = 1 and 4, greedy and sampled, K = 7,
# L2 flushed between walks; every path incl. the Triton kernel by name), run on this
# tree and, when BEFORE names another tree (e.g. an earlier commit unpacked with
# `git archive REV wts_jax tools | tar -x -C .before`), on that one too, one after the
# other in the same device call: a before/after comparison of a refactor.
#   bash tools/side_by_side.sh            # writes side_{before,after}.{json,log} to $OUT
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ARGS=(--shape qwen3_4b --head vanilla --batch 1,4 --k 7 --mode greedy,sample --l2 cold
      --paths "${SIDE_PATHS:-xla,pallas-stepwise,torch-eager,torch-graph,wts,wts-triton}")
run() {   # run TAG DIR
  (cd "$2" && PYTHONPATH=$PWD timeout "${SIDE_S:-110}" python tools/bench_variants.py \
     "${ARGS[@]}" --out "$OUT/side_$1.json" > "$OUT/side_$1.log" 2>&1)
  echo "== $1 (exit $?)"; grep -v -i warn "$OUT/side_$1.log" | tail -7
}
if [ -n "${BEFORE:-}" ]; then run before "$BEFORE"; fi
run after "$PWD"
