"""Times the decode loop's weight products: the Pallas kernel's cuts against XLA's GEMM.

Run on a GPU: ``python tools/products_bench.py --out bench/results/h200_products.json``.
Every (rows, N, K) product is timed as the wall time of one executable that runs it over
``copies`` distinct weights (together past twice the L2, so every weight comes from HBM)
and distinct inputs (so XLA cannot merge the products), divided by ``copies``; the
figure is the median of ``--repeats`` runs. Both implementations are timed the same way
in the same run. Phase ``sweep`` tries cuts on a few shapes; phase ``check`` times the
default cut (``plan_product``) and XLA on every Qwen3-4B/8B shape.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.launch_options import KERNEL_COMPILER_OPTIONS
from wts_jax.specdecode import products

HBM = {"NVIDIA H200": 4.8e12, "NVIDIA H100 80GB HBM3": 3.35e12}
# (N, K) of every product of Qwen3-4B and Qwen3-8B: q, k/v, o, gate/up, down, LM head.
SHAPES = {"qwen3_4b": [(4096, 2560), (1024, 2560), (2560, 4096), (9728, 2560),
                       (2560, 9728), (151936, 2560)],
          "qwen3_8b": [(4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288),
                       (151936, 4096)]}
SWEEP_SHAPES = [(4096, 2560), (1024, 2560), (9728, 2560), (2560, 9728)]


def _copies(n, k, floor_bytes=240e6):
  return max(4, int(np.ceil(floor_bytes / (n * k * 2))))


def _executable(impl, rows, n, k, plan, copies):
  def run(xs, ws):
    outs = []
    for i in range(copies):
      if impl == "xla":
        y = jnp.einsum("ri,oi->ro", xs[i], ws[i], preferred_element_type=jnp.float32)
      else:
        y = products.product_pallas(xs[i], ws[i], plan)
      outs.append(y.astype(jnp.bfloat16))
    return outs
  xs = [jax.ShapeDtypeStruct((rows, k), jnp.bfloat16)] * copies
  ws = [jax.ShapeDtypeStruct((n, k), jnp.bfloat16)] * copies
  return jax.jit(run, compiler_options=dict(KERNEL_COMPILER_OPTIONS)).lower(xs, ws)


def _time(compiled, xs, ws, repeats):
  jax.block_until_ready(compiled(xs, ws))
  samples = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(compiled(xs, ws))
    samples.append(time.perf_counter() - t)
  return float(np.median(samples))


def run_cases(cases, repeats, hbm):
  """cases: list of (label, impl, rows, n, k, plan). Compiles in a pool, times in turn."""
  pool = concurrent.futures.ThreadPoolExecutor(16)
  lowered = []
  for case in cases:
    _, impl, rows, n, k, plan = case
    lowered.append(_executable(impl, rows, n, k, plan, _copies(n, k)))
  futures = [pool.submit(low.compile) for low in lowered]
  results, arrays = [], {}
  for case, future in zip(cases, futures):
    label, impl, rows, n, k, plan = case
    try:
      compiled = future.result()
    except Exception as err:   # a cut Triton cannot compile: recorded, not fatal
      results.append(dict(label=label, impl=impl, rows=rows, n=n, k=k,
                          error=str(err).splitlines()[0][:200]))
      print(f"{label} rows={rows} n={n} k={k}: {results[-1]['error']}", flush=True)
      continue
    copies = _copies(n, k)
    key = (rows, n, k)
    if key not in arrays:
      arrays.clear()
      rng = jax.random.key(rows * 7 + n + k)
      kx, kw = jax.random.split(rng)
      ws = [jax.random.normal(jax.random.fold_in(kw, i), (n, k), jnp.bfloat16)
            for i in range(copies)]
      xs = [jax.random.normal(jax.random.fold_in(kx, i), (rows, k), jnp.bfloat16)
            for i in range(copies)]
      ref = jnp.einsum("ri,oi->ro", xs[0], ws[0], preferred_element_type=jnp.float32,
                       precision=jax.lax.Precision.HIGHEST)
      arrays[key] = (xs, ws, ref)
    xs, ws, ref = arrays[key]
    err = float(jnp.max(jnp.abs(compiled(xs, ws)[0].astype(jnp.float32) - ref))
                / (jnp.max(jnp.abs(ref)) + 1e-9))
    seconds = _time(compiled, xs, ws, repeats) / copies
    results.append(dict(label=label, impl=impl, rows=rows, n=n, k=k,
                        plan=None if plan is None else plan.__dict__,
                        seconds=seconds, tb_per_s=n * k * 2 / seconds / 1e12,
                        of_hbm=n * k * 2 / seconds / hbm, rel_err=err))
    r = results[-1]
    print(f"{label:24s} {impl:6s} rows={rows:<3d} n={n:<6d} k={k:<5d} "
          f"{seconds * 1e6:8.1f} us {r['of_hbm']:.2f} of HBM err {err:.0e}", flush=True)
  return results


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--phases", default="sweep,check")
  parser.add_argument("--rows", default="1,8,16,64,128")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  kind = jax.devices()[0].device_kind
  hbm = HBM.get(kind, 4.8e12)
  report = dict(benchmark="products", device_kind=kind, jax_version=jax.__version__,
                hbm_bytes_per_s=hbm, method=__doc__)
  t0 = time.time()
  if "check" in args.phases:
    cases = []
    for model, shapes in SHAPES.items():
      for (n, k), rows in itertools.product(shapes, [int(r) for r in args.rows.split(",")]):
        cases.append((model, "xla", rows, n, k, None))
        plan = products.plan_product(rows, n, k)
        if plan is not None:
          cases.append((model, "pallas", rows, n, k, plan))
    report["check"] = run_cases(cases, args.repeats, hbm)
    print(f"check done {time.time() - t0:.0f} s", flush=True)
    with open(args.out, "w") as f:
      json.dump(report, f, indent=1)
  if "sweep" in args.phases:
    cases = []
    for (n, k), rows in itertools.product(SWEEP_SHAPES, (8, 128)):
      cases.append(("xla", "xla", rows, n, k, None))
      seen = set()
      for bn, bk, target, warps, stages in itertools.product(
          (32, 64, 128), (128, 256), (264, 528), (4,), (3, 5)):
        plan = products.plan_product(rows, n, k, block_n=bn, block_k=bk, num_warps=warps,
                                     num_stages=stages, target_programs=target)
        if plan is not None and plan not in seen:
          seen.add(plan)
          cases.append((f"bn{bn}_bk{bk}_s{plan.splits}_w{warps}_st{stages}", "pallas",
                        rows, n, k, plan))
    report["sweep"] = run_cases(cases, args.repeats, hbm)
    print(f"sweep done {time.time() - t0:.0f} s", flush=True)
    with open(args.out, "w") as f:
      json.dump(report, f, indent=1)
  report["elapsed_s"] = time.time() - t0
  with open(args.out, "w") as f:
    json.dump(report, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
