export PYTHONPATH=$PWD WTS_GPU_TESTS=1; O=${OUT:-/tmp/out}; mkdir -p $O; t0=$(date +%s)
timeout 70 python tools/sanitizer_case.py batched-producer-64n 20 2>&1 | grep -c DIFFER | sed 's/^/small 64n differ count: /' | tee -a $O/probe.log
timeout 40 python tools/sanitizer_case.py batched-producer 10 2>&1 | grep -c DIFFER | sed 's/^/small 32n differ count: /' | tee -a $O/probe.log
echo "[$(( $(date +%s)-t0 )) s]"
timeout 110 python - <<'PY' 2>&1 | grep -v -i warn | tee -a $O/probe.log
import jax, numpy as np, wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.pallas import mosaic_batched_plan
from wts_jax.walk_config import MosaicConfig
mosaic_batched_plan.PRODUCER_MAX_ROWS_ON_N = 64
head = wts_jax.make_head(HeadConfig.qwen3_4b("vanilla", confidence=False), seed=0)
for batch, wgs in ((64, 2), (64, 1), (48, 2), (40, 2)):
  cfg = MosaicConfig(kernel="batched", batch_axis="n", warpgroups=wgs, producer=True)
  walk = jax.jit(lambda h, b, f: wts_jax.walk(h, b, f, impl="mosaic", config=cfg).tokens)
  bad = []
  for seed in range(4):
    base, first, _ = random_inputs(head.config, batch, 7, jax.random.key(100 + seed))
    got = np.asarray(walk(head, base, first)); want = np.asarray(wts_jax.walk(head, base, first, impl="xla").tokens)
    bad.append(int((got != want).sum()))
  print(f"qwen3 B{batch} N wg{wgs}+P: mismatched tokens per seed {bad}", flush=True)
PY
echo "[$(( $(date +%s)-t0 )) s]"
timeout 90 compute-sanitizer --tool racecheck python tools/sanitizer_case.py batched-producer-64n 1 2>&1 | grep -v -i warn | tail -6 | tee -a $O/probe.log
echo "[$(( $(date +%s)-t0 )) s]"
