"""The rnn head's update from its joint table (``plan.joint_table``, the batch on N, one
warpgroup): each row's gather brings the token's J_e e (fp32 bit halves,
``wts_jax.joint_table``); the leader loads the step's hoisted terms and the J_s s_{k−1}
that the blocks owning the state's units published during the last step (``ppub_g``:
global memory, generic stores released by that step's grid signal and read after its
acquire), and advances the whole state for every row itself, elementwise, keeping s in
fp32 in shared memory. Then each owner computes J_s s_k for its units (two WGMMAs, s's
hi and lo halves with the batch on M, against its resident J_s rows) and publishes it
for the next step: one grid barrier a step, where the split update has two."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import gate_table
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.head_update import HeadUpdate
from wts_jax.pallas.batched.plan import BATCH_TILE
from wts_jax.pallas.tile_math import make_operand


class JointTable(HeadUpdate):

  has_resident_rows = True

  def staging_tiles(self):
    return []   # (the gathered words are read by ``from_staging``)

  def copy_resident_rows(self, first_unit):
    """J_s rows of (gate, candidate, output); the owners' operand tile zeroed (its rows
    past the staged ones stay zero)."""
    walk = self.walk
    refs, rank, units = walk.refs, walk.rank, walk.plan.update_units
    for part in range(3):
      plgpu.copy_gmem_to_smem(
          refs.joint_w_g.at[pl.ds(part * rank + first_unit, units), pl.ds(0, rank)],
          refs.update_w_s.at[pl.ds(part * units, units)], refs.update_w_bar)
    walk.zero_tile(refs.state_tile_s)
    plgpu.commit_smem()

  def terms(self, halves_g):
    """A step's three parts (gate, candidate, output) of fp32 terms stored as int16
    halves ([2, 3, rows, r] in global memory: the hoisted terms, or the published J_s s),
    each [staged rows, r] in the staging's layout."""
    walk = self.walk
    staged = pl.ds(0, walk.plan.staged_rows)
    return [gate_table.f32_from_halves(
        *(gpu.load(halves_g.at[half, part, staged], walk.z_layout, optimized=False)
          for half in range(2))) for part in range(3)]

  def preload(self, step):
    """The step's hoisted terms, and J_s s_{k-1} as published at step k - 1 (a step 0's
    slot is never written: masked there, s_{-1} = 0)."""
    refs = self.walk.refs
    return self.terms(refs.gate_hoisted_g.at[step]), self.terms(refs.ppub_g.at[step])

  def from_staging(self, step, preloaded):
    """The rnn head's step (``RecurrentHead.advance``) for every staged row:
    [a ; c ; o] = (hoisted + J_s s_{k-1}) + J_e e, J_e e gathered (the row's T[x]: fp32
    upper halves of the three parts, then lower) and J_s s_{k-1} as published
    (``publish_state_terms``); u = σ(a), s_k = u ⊙ s_{k-1} + (1 − u) ⊙ tanh(c) kept in
    fp32 (``state_s``, each thread reading back what it stored), z = tanh(o) stored as
    the hi + lo pair the W2 WGMMA reads. Then, in the blocks that own units, J_s s_k for
    the next step."""
    walk = self.walk
    refs, rank = walk.refs, walk.rank
    hoisted, published = preloaded
    def part(index):   # int16 words
      return gpu.load(refs.z_s.at[:, pl.ds(index * rank, rank)], walk.z_layout)
    first = step == 0
    gate_pre, candidate, output = (
        hoisted[p] + jnp.where(first, 0.0, published[p])
        + gate_table.f32_from_halves(part(p), part(3 + p)) for p in range(3))
    update = jax.nn.sigmoid(gate_pre)
    last = jnp.where(first, 0.0, gpu.load(refs.state_s, walk.z_layout, optimized=False))
    state = update * last + (1.0 - update) * jnp.tanh(candidate)
    gpu.store(refs.state_s, state)
    z = make_operand(jnp.tanh(output), exact_in_bf16=False)
    hi_tile, lo_tile = walk.plane_tiles()
    hi_tile[...] = z.hi
    lo_tile[...] = z.lo
    gpu.when(self.publish_due(step), functools.partial(self.publish_state_terms, step, state))

  def publish_due(self, step):
    """Whether this block publishes J_s s_k at ``step``: it owns units, and a step
    follows."""
    walk = self.walk
    return gpu.and_(walk.block * walk.plan.update_units < walk.rank,
                    step + 1 < walk.spec.steps)

  def publish_state_terms(self, step, state):
    """An owner's J_s s_k for its units (of the gate, candidate and output), every row:
    s_k's hi then lo half through ``state_tile_s`` (the batch on M) against its resident
    J_s rows, summed in fp32, published as int16 halves to ``ppub_g[step + 1]`` for the
    next step's readers (released by this step's grid signal)."""
    walk = self.walk
    refs, plan = walk.refs, walk.plan
    units = plan.update_units
    pair = make_operand(state, exact_in_bf16=False)
    tile = refs.state_tile_s
    def product(half):
      tile.at[pl.ds(0, plan.staged_rows)][...] = half
      plgpu.commit_smem()   # before the WGMMA's async-proxy reads
      def run(acc_ref):
        plgpu.wgmma(acc_ref, tile, refs.update_w_s.T)
        plgpu.wgmma_wait(0)   # read before the next half overwrites the tile
        return acc_ref[...]
      return pl.run_scoped(run, plgpu.ACC((BATCH_TILE, 3 * units), jnp.float32))
    sums = product(pair.hi)
    sums = sums + product(pair.lo)
    halves = gate_table.f32_halves(sums)
    columns = pl.ds(walk.block * units, units)
    for half, words in enumerate(halves):
      for p in range(3):
        part = words[:, p * units:(p + 1) * units]
        gpu.store(refs.ppub_g.at[step + 1, half, p, :, columns], part)
