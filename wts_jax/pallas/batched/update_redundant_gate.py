"""The gated head's update computed whole by every block (``plan.gate_chunks``: neither
split nor from a table): the leader streams G_e's 64-row chunks through its W2 ring ahead
of each step's W2 chunks (``rings.Rings.lead_of``), computes the gate as WGMMAs with the
batch on M (e, a bf16 W1 row, is exact), and stores z as a hi + lo bf16 pair; each W2
chunk is then two WGMMAs into one accumulator (z to 2^-17 of each element)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.head_update import HeadUpdate
from wts_jax.pallas.batched.plan import BATCH_TILE
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS
from wts_jax.pallas.tile_math import make_operand


class RedundantGate(HeadUpdate):

  def staging_tiles(self):
    return [self.walk.refs.za_s.at[1]]   # e: the gate's operand, then z's lo half

  def from_tiles(self, step):
    """z = σ(hoisted_k + G_e e) ⊙ e (fp32, ``GatedMarkovHead.advance``) of every staged
    row, stored as the hi + lo bf16 pair the W2 WGMMAs read (``za_s[0]``, ``za_s[1]``):
    per G_e chunk from the ring a WGMMA with the batch on M ([64 rows, r] x [r, 64 gate
    rows]) reads e from ``za_s[1]``, so the lo halves wait in registers until the last of
    them has completed."""
    walk = self.walk
    refs, stages = walk.refs, walk.stages
    e_tile, hi_tile = refs.za_s.at[1], refs.za_s.at[0]
    lo_parts = []
    for c in range(walk.gate_chunks):
      index = step * walk.stream_length(0) + c
      ring = gpu.rem(index, stages)
      hoisted = gpu.load(refs.gate_hoisted_g.at[step, c], gpu.WGMMA, optimized=False)
      plgpu.barrier_wait(walk.ring_barrier(ring, 0))
      def product(acc_ref, ring=ring):
        plgpu.wgmma(acc_ref, e_tile, refs.w_s.at[walk.slot_base(0) + walk.res + ring].T)
        return acc_ref[...]
      pre = pl.run_scoped(product, plgpu.ACC((BATCH_TILE, CHUNK_ROWS), jnp.float32))
      # (The WGMMA's reads of the slot completed when its accumulator was read.)
      gpu.when(index + stages < walk.stream_total(0),
               functools.partial(walk.copy_stream, index + stages, 0))
      columns = pl.ds(c * CHUNK_ROWS, CHUNK_ROWS)
      e = gpu.load(refs.z_s.at[:, columns], gpu.WGMMA).astype(jnp.float32)
      z = make_operand(jax.nn.sigmoid(hoisted + pre) * e, exact_in_bf16=False)
      hi_tile[:, columns] = z.hi
      lo_parts.append(z.lo)
    for c, z_lo in enumerate(lo_parts):
      e_tile[:, pl.ds(c * CHUNK_ROWS, CHUNK_ROWS)] = z_lo
    plgpu.commit_smem()   # the pair stored before the W2 WGMMAs' async-proxy reads
