#!/usr/bin/env bash
# The wts-bench grid on the H200, one device call per chunk of heads:
#
#   bash tools/bench_grid.sh vanilla,gated "$OUT"    # both heads' grids in one call
#   bash tools/bench_grid.sh rnn "$OUT"              # one head's grid
#
# Each call runs, for its heads, B 1,4,16,64 x K 4,7,16 x greedy,sample x L2 cold,warm
# on the Qwen3-4B shape, for every registered path (--paths all: xla, pallas-stepwise,
# torch-eager, torch-graph, wts and its variants), and writes $OUT/h200_<heads>.json
# (rewritten after every point and mode), .log and .png. Merge the calls' JSON here
# afterwards: python -m wts_jax.bench.cli --merge a.json b.json --out all.json.
#
# Guards: the run starts no point once the seconds since its start plus its longest
# point so far would pass BUDGET_S; `timeout` sends SIGTERM at LIMIT_S (the run then
# writes its JSON, lists the points it did not run and exits), SIGKILL 15 s later.
# Environment knobs: LIMIT_S (default 540, for a 600 s call), BUDGET_S (default
# LIMIT_S - 60), AHEAD (points compiled together, default 3: one K sweep), JOBS
# (compile threads, default 16), PATHS, BATCH, K, MODES, L2, PYTHON (default python3);
# more wts-bench flags may follow OUT (e.g. --walks-per-repeat 20: less noise, more time).
#
# Time (H200, 2026-11-29, five paths, AHEAD=1): vanilla,gated 352 s; rnn 462 s, in two
# calls. Compilation was 70-80 % of it (per point, the longest single compile: the
# pallas-stepwise walk builds one Triton kernel per step); AHEAD=3 overlaps a K sweep's
# compilations, expected about 260 s and 310 s. --paths all adds the wts variants.
set -uo pipefail
if [ $# -lt 2 ]; then
  awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"
  exit 2
fi
heads=$1
out=$2
shift 2
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
limit=${LIMIT_S:-540}
budget=${BUDGET_S:-$((limit - 60))}
name="h200_${heads//,/_}"
echo "[bench_grid] $(date -u +%FT%TZ) heads=$heads limit=${limit}s budget=${budget}s" \
     "-> $out/$name.{json,log,png}"
timeout -k 15 "$limit" "${PYTHON:-python3}" -m wts_jax.bench.cli --shape qwen3_4b \
  --head "$heads" --batch "${BATCH:-1,4,16,64}" --k "${K:-4,7,16}" \
  --mode "${MODES:-greedy,sample}" --l2 "${L2:-cold,warm}" --paths "${PATHS:-all}" \
  --compile-ahead "${AHEAD:-3}" --jobs "${JOBS:-16}" --time-budget-s "$budget" \
  --out "$out/$name.json" --plot "$out/$name.png" "$@" 2>&1 | tee "$out/$name.log"
rc=${PIPESTATUS[0]}
echo "[bench_grid] $(date -u +%FT%TZ) exit $rc (124: stopped by timeout; the JSON" \
     "holds every finished point and lists the rest)" | tee -a "$out/$name.log"
exit "$rc"
