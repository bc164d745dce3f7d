"""Can the batched walk's z go straight from W1 into the WGMMA's A registers? A probe.

The public persistent int8 kernel (NOTES v28) gathers each request's two W1 planes from
global memory into the WGMMA's A fragments by per-thread loads, the planes stacked on M
(M row 16w + g is request 8w + g's hi plane, row 16w + g + 8 its lo plane, so one thread
holds both of a request's products and combines them exactly in int32), and multiplies
them against a W2 tile in shared memory as the B operand: no z staging in shared memory,
no staging-to-tile round trip, one WGMMA for 32 requests' two planes. Mosaic GPU takes
an int8 A operand in registers (``WGMMA_LAYOUT_8BIT``); what Pallas does not have is a
gather into that layout: ``wts_jax.pallas.z_registers.gather_planes`` builds it (each
register, 4 int8 along K at one (row, k), loaded by ``ld.global.nc`` from the row's
token's plane).

  python tools/registers_operand_probe.py [--out results.json]

Checks the accumulators against numpy (exact int32), then times a chain of gather →
WGMMA → wait per block on 132 blocks (a token table per iteration, so each gather reads
fresh rows): the difference of two chain lengths' wall times, per link; then the same
with z gathered the batched walk's way (bulk copies into shared memory, then loaded),
with 16-byte loads from rows in fragment order, and with no gather at all (the chain's
other links).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas.mosaic_gpu_helpers import load as _load
from wts_jax.pallas.mosaic_gpu_helpers import w2_transforms as _w2_transforms
from wts_jax.int8_state import fragment_ordered
from wts_jax.pallas.z_registers import gather_planes, stacked_row

RANK = 256
REQUESTS = 32          # a WGMMA's M of 64 holds 32 requests' two planes
TILE_ROWS = 64         # W2 rows a tile (the WGMMA's N)
BLOCKS = 132


def probe_kernel(iterations: int, blocks: int, gather: str = "registers"):
  """Per block: the W2 tile into shared memory once, then ``iterations`` times: the
  iteration's tokens into shared memory, z gathered into registers, one WGMMA
  [64, r] x [r, 64] and its wait; the last accumulator and the iterations run out.
  ``gather`` "staged": z gathered the batched walk's way instead — a bulk copy a row and
  plane into a [64, r] shared-memory tile (the stacked order), then loaded from there in
  the same register layout; "fixed": no gather (the tile loaded as it is: the chain's
  other links alone); "registers16": into registers from ``fragment_ordered`` rows by
  16-byte loads."""

  def body(w1_g, w2_g, tok_g, acc_g, count_g, w_s, tok_s, z_s, bar, tok_bar, z_bar):
    block = jax.lax.axis_index("blocks")
    plgpu.copy_gmem_to_smem(w2_g, w_s, bar)
    plgpu.barrier_wait(bar)

    def iteration(i, count):
      plgpu.copy_gmem_to_smem(tok_g.at[i, block], tok_s, tok_bar)
      plgpu.barrier_wait(tok_bar)
      if gather == "staged":
        for m in range(2 * REQUESTS):
          request, plane = stacked_row(m)
          plgpu.copy_gmem_to_smem(w1_g.at[tok_s[request], pl.ds(plane * RANK, RANK)],
                                  z_s.at[m], z_bar)
        plgpu.barrier_wait(z_bar)
        z = _load(z_s, plgpu.Layout.WGMMA_8BIT, optimized=False)
      elif gather == "fixed":
        z = _load(z_s, plgpu.Layout.WGMMA_8BIT, optimized=False)
      else:
        z = gather_planes(tok_s, w1_g, rank=RANK, stacked=True,
                          fragment_order=gather == "registers16")

      def mma(acc_ref):
        plgpu.wgmma(acc_ref, z, w_s.T)
        plgpu.wgmma_wait(0)
        return acc_ref[...]
      acc = pl.run_scoped(mma, plgpu.ACC((2 * REQUESTS, TILE_ROWS), jnp.int32))

      @pl.when(i == iterations - 1)
      def _():
        acc_g[block] = acc
      return count + 1
    count_g[block] = jax.lax.fori_loop(0, iterations, iteration, jnp.int32(0))

  return plgpu.kernel(
      body,
      out_type=(jax.ShapeDtypeStruct((blocks, 2 * REQUESTS, TILE_ROWS), jnp.int32),
                jax.ShapeDtypeStruct((blocks,), jnp.int32)),
      grid=(blocks,), grid_names=("blocks",),
      scratch_types=[plgpu.SMEM((TILE_ROWS, RANK), jnp.int8, transforms=_w2_transforms(1, RANK)),
                     plgpu.SMEM((REQUESTS,), jnp.int32),
                     plgpu.SMEM((2 * REQUESTS, RANK), jnp.int8),
                     plgpu.Barrier(num_arrivals=1, num_barriers=1),
                     plgpu.Barrier(num_arrivals=1, num_barriers=1),
                     plgpu.Barrier(num_arrivals=2 * REQUESTS, num_barriers=1)],
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Lane))


def expected(w1, w2, tokens):
  """numpy: acc[m, n] = sum_k A[m, k] w2[n, k], A row m the stacked (request, plane)."""
  a = np.empty((2 * REQUESTS, RANK), np.int64)
  for m in range(2 * REQUESTS):
    request, plane = stacked_row(m)
    a[m] = w1[tokens[request], plane * RANK:(plane + 1) * RANK]
  return (a @ w2[:TILE_ROWS].astype(np.int64).T).astype(np.int64)


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default=None)
  parser.add_argument("--vocab", type=int, default=151936)
  parser.add_argument("--iterations", type=int, default=2000)
  args = parser.parse_args(argv)
  rng = np.random.default_rng(0)
  w1 = rng.integers(-127, 128, (args.vocab, 2 * RANK), dtype=np.int8)
  w2 = rng.integers(-127, 128, (TILE_ROWS, RANK), dtype=np.int8)
  results = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind)}

  ordered = fragment_ordered(w1)
  for form in ("registers", "registers16", "staged", "fixed"):
    table_w1 = ordered if form == "registers16" else w1
    try:
      # Correctness: one iteration, one block.
      tokens = rng.integers(0, args.vocab, (1, 1, REQUESTS), dtype=np.int32)
      if form != "fixed":
        run = jax.jit(probe_kernel(1, 1, form))
        acc, _ = run(jnp.asarray(table_w1), jnp.asarray(w2), jnp.asarray(tokens))
        want = expected(w1, w2, tokens[0, 0])
        got = np.asarray(acc[0]).astype(np.int64)
        results[f"{form}_mismatches"] = int((got != want).sum())
        print(form, "mismatches:", results[f"{form}_mismatches"], flush=True)
      # Timing: a chain of gather -> WGMMA -> wait, fresh tokens each iteration.
      walls = {}
      for iterations in (args.iterations // 10, args.iterations):
        table = rng.integers(0, args.vocab, (iterations, BLOCKS, REQUESTS), dtype=np.int32)
        run = jax.jit(probe_kernel(iterations, BLOCKS, form))
        operands = (jnp.asarray(table_w1), jnp.asarray(w2), jnp.asarray(table))
        jax.block_until_ready(run(*operands))
        times = []
        for _ in range(5):
          start = time.perf_counter()
          jax.block_until_ready(run(*operands))
          times.append(time.perf_counter() - start)
        walls[iterations] = float(np.median(times))
      short, long = walls[args.iterations // 10], walls[args.iterations]
      results[f"{form}_us_per_link"] = (long - short) / (
          args.iterations - args.iterations // 10) * 1e6
      print(form, "us per link:", results[f"{form}_us_per_link"], flush=True)
    except Exception as err:   # (report the other form regardless)
      results[f"{form}_error"] = f"{type(err).__name__}: {str(err)[:2000]}"
      print(form, "error:", results[f"{form}_error"], flush=True)
  print(json.dumps(results, indent=1))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(results, f, indent=1)
  return 0 if results.get("registers_mismatches") == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
