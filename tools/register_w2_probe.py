"""Timing probe for a walk kernel at B <= 4 that keeps a block's whole W2 share on chip:
W2's 64-row tiles on the WGMMA's M (``register`` tiles held in each warpgroup's registers
as the A operand for the whole walk, the rest in shared memory), z on N (4 requests x 2
int8 planes = 8 columns, in shared memory), one m64n8k32 chain a tile — an eighth of the
stacked kernel's products at B = 1 and no W2 streamed from the L2 — a running maximum of
the accumulators, and the grid barrier every step (``grid_sync.signal_and_poll``).

Not a walk: z stays the same every step and nothing is exchanged but the barrier. What it
measures is the step such a kernel cannot go below (its tile loop and its barrier), and
whether Mosaic keeps that many registers without spilling. The maxima are checked against
numpy, so a build that drops its products fails.

  python tools/register_w2_probe.py --out $OUT/register_w2 [--register 3,4,5] [--check-only]
      (--check-only: lower each build for CUDA and stop — runs on a CPU machine)
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, os.path.dirname(__file__))

import profile_batched as pb  # noqa: E402

from wts_jax.pallas import grid_sync  # noqa: E402
from wts_jax.pallas import mosaic_gpu_helpers as gpu  # noqa: E402
from wts_jax.pallas.stacked.threads import warpgroup_sync  # noqa: E402

TILE = 64
WARPGROUPS = 2
COLUMNS = 8           # 4 requests x 2 planes
BLOCK_TILES = 18      # Qwen3's 151 936 rows over 132 blocks: 1 152 rows, 18 tiles
SPIN_LIMIT = 1 << 22


def probe(*, register: int, steps: int, blocks: int, rank: int = 256,
          from_global: bool = False):
  """The probe's kernel: (W2 [blocks * 18 * 64, r] int8, z [8, r] int8) -> (maxima
  [blocks, 2, 64, 8] int32, timed out [blocks] int32). ``from_global``: the register
  tiles loaded straight from global memory while the shared tiles' copies run, else
  staged through the shared slots first."""
  per_wg = BLOCK_TILES // WARPGROUPS
  shared = per_wg - register            # a warpgroup's tiles in shared memory
  if not 0 <= register <= per_wg:
    raise ValueError(f"register={register} outside [0, {per_wg}]")
  slots = shared if from_global else max(shared, register)   # a warpgroup's slots
  transforms = gpu.w2_transforms(1, rank)

  def body(w2_g, z_g, out_g, sync_g, w_s, z_s, out_s, reg_bar, shm_bar, step_bar, go_bar):
    block = lax.axis_index("blocks")
    wg = lax.axis_index("wg")
    first = (block * BLOCK_TILES + wg * per_wg) * TILE
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR(()))

    slot0 = wg * slots
    if from_global:
      # Every tile at once: the shared tiles by TMA, the register tiles by the threads'
      # own loads from global memory (no slot, no wait between the two).
      for j in range(shared):
        plgpu.copy_gmem_to_smem(w2_g.at[pl.ds(first + (register + j) * TILE, TILE)],
                                w_s.at[slot0 + j], shm_bar.at[wg])
      plgpu.copy_gmem_to_smem(z_g, z_s.at[wg], reg_bar.at[wg])
      held = tuple(gpu.load(w2_g.at[pl.ds(first + t * TILE, TILE)],
                            plgpu.Layout.WGMMA_8BIT, optimized=False)
                   for t in range(register))
      plgpu.barrier_wait(reg_bar.at[wg])
    else:
      # The register tiles and z through this warpgroup's slots, read into registers;
      # then (every thread's reads done) its shared tiles into the same slots.
      for t in range(register):
        plgpu.copy_gmem_to_smem(w2_g.at[pl.ds(first + t * TILE, TILE)], w_s.at[slot0 + t],
                                reg_bar.at[wg])
      plgpu.copy_gmem_to_smem(z_g, z_s.at[wg], reg_bar.at[wg])
      plgpu.barrier_wait(reg_bar.at[wg])
      held = tuple(gpu.load(w_s.at[slot0 + t], plgpu.Layout.WGMMA_8BIT)
                   for t in range(register))
      warpgroup_sync()
      plgpu.commit_smem()   # (the reads before the copies that overwrite them)
      for j in range(shared):
        plgpu.copy_gmem_to_smem(w2_g.at[pl.ds(first + (register + j) * TILE, TILE)],
                                w_s.at[slot0 + j], shm_bar.at[wg])
    if shared:
      plgpu.barrier_wait(shm_bar.at[wg])

    def step(k, carry):
      best, timed_out = carry

      def products(*accs):
        for t, acc in enumerate(accs):
          a = held[t] if t < register else w_s.at[slot0 + t - register]
          plgpu.wgmma(acc, a, z_s.at[wg].T)
        values = [plgpu.wgmma_accumulator_load(acc) for acc in accs]
        return functools.reduce(jnp.maximum, values)
      best = jnp.maximum(best, pl.run_scoped(
          products, *[plgpu.ACC((TILE, COLUMNS), jnp.int32)] * per_wg))
      plgpu.barrier_arrive(step_bar)

      @pl.when(wg == 0)
      def _():
        plgpu.barrier_wait(step_bar)
      late = lax.cond(wg == 0,
                      lambda: grid_sync.signal_and_poll(sem, blocks, k, SPIN_LIMIT),
                      lambda: jnp.int32(0))

      @pl.when(wg == 0)
      def _():
        plgpu.barrier_arrive(go_bar)

      @pl.when(wg != 0)
      def _():
        plgpu.barrier_wait(go_bar)
      return best, timed_out | late

    init = plgpu.layout_cast(jnp.full((TILE, COLUMNS), jnp.iinfo(jnp.int32).min, jnp.int32),
                             plgpu.Layout.WGMMA)
    best, timed_out = lax.fori_loop(0, steps, step, (init, jnp.int32(0)))
    out_s[wg] = best
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_s.at[wg], out_g.at[block, wg])

    @pl.when(wg == 0)
    def _():
      sync_g[block] = timed_out
    plgpu.wait_smem_to_gmem(0)

  kernel = plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((blocks, WARPGROUPS, TILE, COLUMNS), jnp.int32),
                jax.ShapeDtypeStruct((blocks,), jnp.int32)),
      grid=(blocks,), grid_names=("blocks",), num_threads=WARPGROUPS, thread_name="wg",
      scratch_types=[
          plgpu.SMEM((WARPGROUPS * slots, TILE, rank), jnp.int8, transforms=transforms),
          plgpu.SMEM((WARPGROUPS, COLUMNS, rank), jnp.int8, transforms=transforms),
          plgpu.SMEM((WARPGROUPS, TILE, COLUMNS), jnp.int32),
          # (z's copy, and the staged register tiles' where they are staged)
          plgpu.Barrier(num_arrivals=1 if from_global else register + 1,
                        num_barriers=WARPGROUPS),
          plgpu.Barrier(num_arrivals=max(shared, 1), num_barriers=WARPGROUPS),
          plgpu.Barrier(num_arrivals=WARPGROUPS, num_barriers=1),
          plgpu.Barrier(num_arrivals=1, num_barriers=1),
      ],
      compiler_params=gpu.compiler_params())
  return kernel


def expected(w2, z, blocks):
  """The maxima numpy computes: every tile's products, max over a warpgroup's tiles (z
  is the same every step, so any number of steps gives these)."""
  per_wg = BLOCK_TILES // WARPGROUPS
  tiles = w2.astype(np.int32).reshape(blocks, WARPGROUPS, per_wg, TILE, -1)
  products = np.einsum("bwtmk,nk->bwtmn", tiles, z.astype(np.int32))
  return products.max(axis=2)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--register", default="3,4,5")
  parser.add_argument("--blocks", type=int, default=132)
  parser.add_argument("--walks", type=int, default=20)
  parser.add_argument("--loads", default="shared,global",
                      help="how the register tiles arrive: staged in shared memory, or "
                           "straight from global memory")
  parser.add_argument("--check-only", action="store_true")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  rank = 256
  rng = np.random.default_rng(0)
  w2 = rng.integers(-127, 128, (args.blocks * BLOCK_TILES * TILE, rank), dtype=np.int8)
  z = rng.integers(-127, 128, (COLUMNS, rank), dtype=np.int8)
  want = expected(w2, z, args.blocks)
  results = {"jax": jax.__version__, "blocks": args.blocks, "points": []}
  builds = [(register, loads, steps) for loads in args.loads.split(",")
            for register in (int(r) for r in args.register.split(",")) for steps in (1, 7)]
  for register, loads, steps in builds:
    record = {"register": register, "loads": loads, "steps": steps}
    try:
      kernel = probe(register=register, steps=steps, blocks=args.blocks, rank=rank,
                     from_global=loads == "global")
      fn = jax.jit(kernel)
      if args.check_only:
        from lower_for_gpu import cuda_target  # pylint: disable=import-outside-toplevel
        with cuda_target():
          fn.trace(jax.ShapeDtypeStruct(w2.shape, jnp.int8),
                   jax.ShapeDtypeStruct(z.shape, jnp.int8)).lower(
                       lowering_platforms=("cuda",))
        record["lowered"] = True
      else:
        w2_d, z_d = jnp.asarray(w2), jnp.asarray(z)
        best, late = jax.block_until_ready(fn(w2_d, z_d))
        record["equal"] = bool((np.asarray(best) == want).all())
        record["timed_out"] = int(np.asarray(late).max())
        _, kernel_us, _, _ = pb.time_walks(fn, (w2_d, z_d), args.walks)
        record["kernel_us_median"] = round(float(kernel_us), 1)
    except Exception as err:   # a build's failure is a result too
      record["error"] = f"{type(err).__name__}: {str(err)[:1500]}"
    pb.recorded(results, record)
  pb.write_results(args.out, results)


if __name__ == "__main__":
  main()
