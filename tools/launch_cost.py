"""What one Mosaic GPU launch costs the host: minimal ``plgpu.kernel``s with one feature
each, chained N times in one executable, wall time per launch against device time.

  python tools/launch_cost.py [--launches 50]

Variants: ``plain`` (132 blocks, one store), ``tma`` (+ one TMA copy: a descriptor
encoded on the host), ``tma4`` (+ four descriptors), ``semaphore`` (+ a global
semaphore from ``pl.get_global``), ``smem`` (+ 150 KB of shared memory per block),
``all`` (everything). Prints wall µs per launch (chained, one block at the end) and the
device busy µs per launch from a CUPTI trace.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, os.path.dirname(__file__))
from device_time import _device_ops, _trace_events  # noqa: E402

BLOCKS = 132
ROWS = 64


def _kernel(features):
  tma, descriptors = "tma" in features, (4 if "tma4" in features else 1)
  semaphore, smem = "semaphore" in features, "smem" in features

  def body(*refs):
    srcs, out = refs[:descriptors], refs[descriptors]
    scratch = list(refs[descriptors + 1:])
    block = jax.lax.axis_index("blocks")
    total = jnp.float32(0)
    if tma:
      tile, bar = scratch[:2]
      for i, src in enumerate(srcs):
        plgpu.copy_gmem_to_smem(src.at[pl.ds(block * ROWS, ROWS)], tile.at[i], bar)
      plgpu.barrier_wait(bar)
      total = tile[0, 0, 0].astype(jnp.float32)
    if semaphore:
      sem = pl.get_global(plgpu.SemaphoreType.REGULAR(()))
      plgpu.semaphore_signal(sem, 1, memory_scope="gpu")
    out[block] = total

  scratch = []
  if tma:
    scratch += [plgpu.SMEM((descriptors, ROWS, 256), jnp.int8),
                plgpu.Barrier(num_arrivals=descriptors, num_barriers=1)]
  if smem:
    scratch += [plgpu.SMEM((150 * 1024,), jnp.int8)]
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((BLOCKS,), jnp.float32),
      grid=(BLOCKS,), grid_names=("blocks",), scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Lane)), descriptors


def measure(features: str, launches: int) -> dict:
  kernel, descriptors = _kernel(features)
  srcs = [jnp.ones((BLOCKS * ROWS, 256), jnp.int8) * (i + 1) for i in range(descriptors)]

  @jax.jit
  def chain(*srcs):
    acc = jnp.float32(0)
    for _ in range(launches):
      acc = acc + kernel(*srcs)[0]
    return acc

  jax.block_until_ready(chain(*srcs))
  start = time.perf_counter()
  jax.block_until_ready(chain(*srcs))
  wall = (time.perf_counter() - start) / launches * 1e6
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      jax.block_until_ready(chain(*srcs))
    ops = _device_ops(_trace_events(trace_dir))
  busy = sum(e["dur"] for e in ops) / launches
  return {"variant": features, "wall_us_per_launch": wall, "device_us_per_launch": busy}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--launches", type=int, default=50)
  args = parser.parse_args(argv)
  for features in ("plain", "tma", "tma4", "semaphore", "smem", "tma4+semaphore+smem"):
    row = measure(features, args.launches)
    print(f"{row['variant']:22s} wall {row['wall_us_per_launch']:7.1f} µs/launch   "
          f"device {row['device_us_per_launch']:6.1f}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
