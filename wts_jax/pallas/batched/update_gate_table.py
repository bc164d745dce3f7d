"""The gated head's update from its gate table (``plan.gate_table``, the batch on N): each
row's gather brings the token's e and G_e e (int16 words: e's bf16 bits and G_e e's fp32
bit halves, ``wts_jax.gate_table``), and the leader forms z = σ(hoisted_k + G_e e) ⊙ e
elementwise while staging it — the vanilla head's step but for that."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from wts_jax import gate_table
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.head_update import HeadUpdate
from wts_jax.pallas.tile_math import make_operand


class GateTable(HeadUpdate):

  def staging_tiles(self):
    return []   # (the gathered words are read by ``from_staging``)

  def preload(self, step):
    """The step's hoisted_k of the staged rows ([K, 2, rows, r] int16 halves of their
    fp32 bits in global memory), in the staging's layout."""
    walk = self.walk
    return gate_table.f32_from_halves(
        *(gpu.load(walk.refs.gate_hoisted_g.at[step, half], walk.z_layout, optimized=False)
          for half in range(2)))

  def from_staging(self, step, preloaded):
    """The gated head's z = σ(hoisted_k + G_e e) ⊙ e (fp32, ``GatedMarkovHead.advance``)
    of every staged row from its gathered gate table row (e, then G_e e as fp32 bit
    halves), stored as the hi + lo pair the W2 WGMMA reads (``plane_tiles``: hi rows
    above lo rows). ``preloaded``: the step's hoisted_k, in the staging's layout."""
    del step
    walk = self.walk
    rank = walk.rank
    def part(index):   # int16 words
      return gpu.load(walk.refs.z_s.at[:, pl.ds(index * rank, rank)], walk.z_layout)
    e = gate_table.bf16_from_bits(part(0)).astype(jnp.float32)
    z = make_operand(jax.nn.sigmoid(preloaded + gate_table.f32_from_halves(part(1), part(2)))
                     * e, exact_in_bf16=False)
    hi_tile, lo_tile = walk.plane_tiles()
    hi_tile[...] = z.hi
    lo_tile[...] = z.lo
