"""The gated or rnn head's update split over the blocks (``plan.split``): block p owns the
units [8p, 8p + 8) (at r = 256 on 132 blocks), keeps its rows of the head's weights
resident (G_e; for the rnn head J_s and J_e of the gate, candidate and output), computes
its units for every row with WGMMAs of N = 8 (the rnn head's three parts side by side,
N = 24), publishes z (and the rnn head's state s) as a hi + lo bf16 pair in a global
buffer, and meets the others at a second grid barrier; every block then copies the whole
pair into its WGMMA tiles by TMA (the rnn owners copy s's halves in likewise, one at a
time, and keep their own units' s in fp32)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.output import STATUS_SYNC_TIMEOUT
from wts_jax.pallas import grid_sync
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.head_update import HeadUpdate
from wts_jax.pallas.batched.plan import BATCH_TILE
from wts_jax.pallas.tile_math import make_operand


class SplitUpdate(HeadUpdate):

  has_resident_rows = True

  def staging_tiles(self):
    # e: the gate's operand (then z's lo half), or the rnn update's (then z's hi half).
    refs = self.walk.refs
    return [refs.za_s.at[0]] if self.walk.plan.recurrent else [refs.za_s.at[1]]

  def copy_resident_rows(self, first_unit):
    """[J_s; J_e] rows of (gate, candidate, output) for the rnn head, G_e's for the
    gated head."""
    walk = self.walk
    refs, rank, units = walk.refs, walk.rank, walk.plan.update_units
    if walk.plan.recurrent:
      for part in range(6):
        plgpu.copy_gmem_to_smem(
            refs.joint_w_g.at[pl.ds((part % 3) * rank + first_unit, units),
                              pl.ds((part // 3) * rank, rank)],
            refs.update_w_s.at[part // 3].at[pl.ds((part % 3) * units, units)],
            refs.update_w_bar)
    else:
      plgpu.copy_gmem_to_smem(
          refs.gate_w_g.at[pl.ds(first_unit, units), pl.ds(refs.gate_w_g.shape[1] - rank, rank)],
          refs.update_w_s, refs.update_w_bar)

  def from_tiles(self, step):
    """A block owning units [block · U, block · U + U) computes their z for every row
    (``gate_slice`` or ``recurrent_slice``) and publishes it to ``zpub_g[step]`` as the
    hi + lo pair; after a second grid barrier every block copies the whole pair into
    ``za_s``."""
    walk = self.walk
    refs, plan = walk.refs, walk.plan
    units = plan.update_units
    owns = self.recurrent_slice if plan.recurrent else self.gate_slice
    with jax.named_scope("update_slice"):   # (profile regions: where the update's time goes)
      gpu.when(walk.block * units < walk.rank, functools.partial(owns, step))
      # Every thread's stores before the release (a warpgroup barrier) — and, in one
      # block, before its own threads read them back.
      plgpu.commit_smem()
    if walk.multi_block:
      with jax.named_scope("update_sync"):
        timed_out = grid_sync.signal_and_poll(walk.update_sem, walk.blocks, step,
                                              spin_limit=walk.spec.spin_limit)
        refs.update_flag_s[0] = refs.update_flag_s[0] | timed_out
    with jax.named_scope("update_readback"):
      self.copy_published(refs.zpub_g, step, tuple(enumerate(self.pair_destinations())),
                          refs.pub_bar)
      plgpu.barrier_wait(refs.pub_bar)

  def timeout_flag(self):
    """The leader's time-out bit of the update's own barrier."""
    walk = self.walk
    return jnp.where(walk.leader & (walk.refs.update_flag_s[0] > 0), STATUS_SYNC_TIMEOUT, 0)

  def pair_destinations(self):
    """Where the published hi and lo halves are copied: two tiles, or with ``pair_on_n``
    the lo rows right below the hi rows of ``za_s[0]``."""
    walk = self.walk
    za_s, rows = walk.refs.za_s, walk.published_rows
    hi = za_s.at[0].at[pl.ds(0, rows)]
    if walk.plan.pair_on_n:
      return hi, za_s.at[0].at[pl.ds(walk.plan.lo_offset, rows)]
    return hi, za_s.at[1].at[pl.ds(0, rows)]

  def copy_published(self, pub_g, step, halves, barrier):
    """A published pair's halves (``pub_g[step, half]``, bf16) into rows of WGMMA tiles by
    bulk copies, which swizzle on the way: the rows the W2 WGMMAs read (the batch rows on
    N, 64 on M)."""
    walk = self.walk
    if not walk.spec.interpret:
      grid_sync.global_writes_to_bulk_copies()
    for half, rows_ref in halves:
      plgpu.copy_gmem_to_smem(pub_g.at[step, half, pl.ds(0, walk.published_rows)], rows_ref,
                              barrier)

  @staticmethod
  def publish(pub_g, step, columns, value):
    """This block's units of an fp32 [64 rows, units] value as the hi + lo bf16 pair the
    readers' WGMMAs take (``pub_g[step]``)."""
    pair = make_operand(value, exact_in_bf16=False)
    gpu.store(pub_g.at[step, 0, :, columns], pair.hi)
    gpu.store(pub_g.at[step, 1, :, columns], pair.lo)

  def hoisted_columns(self, step, columns):
    """The hoisted terms of a step, its 64 rows by ``columns``."""
    return self.walk.refs.gate_hoisted_g.at[:, step, columns]

  def gate_slice(self, step):
    """A split gate's slice: z = σ(hoisted + G_e e) ⊙ e of this block's units (a WGMMA
    of the e tile ``za_s[1]`` against its resident G_e rows), to ``zpub_g[step]``."""
    walk = self.walk
    refs = walk.refs
    units = walk.plan.update_units
    columns = pl.ds(walk.block * units, units)
    def product(acc_ref):
      plgpu.wgmma(acc_ref, refs.za_s.at[1], refs.update_w_s.T)
      return acc_ref[...]
    pre = pl.run_scoped(product, plgpu.ACC((BATCH_TILE, units), jnp.float32))
    hoisted = gpu.load(self.hoisted_columns(step, columns), gpu.WGMMA, optimized=False)
    e = gpu.load(refs.z_s.at[:, columns], gpu.WGMMA, optimized=False).astype(jnp.float32)
    self.publish(refs.zpub_g, step, columns, jax.nn.sigmoid(hoisted + pre) * e)

  def stage_state_half(self, step, first, half):
    """The last state's published ``half`` into ``za_s[1]`` (zeros before the first
    step: ``first``)."""
    walk = self.walk
    refs = walk.refs
    state_tile = refs.za_s.at[1]
    def zeros():
      walk.zero_tile(state_tile)
      plgpu.commit_smem()   # before the WGMMAs' async-proxy reads
    def published():
      self.copy_published(refs.spub_g, jnp.maximum(step - 1, 0),
                          ((half, state_tile.at[pl.ds(0, walk.published_rows)]),),
                          refs.state_bar)
      plgpu.barrier_wait(refs.state_bar)
    gpu.when(first, zeros)
    gpu.when(jnp.logical_not(first), published)

  def recurrent_slice(self, step):
    """The rnn head's slice (``RecurrentHead.advance``) for this block's units, every
    row: [a ; c ; o] = hoisted + J_s s + J_e e as WGMMAs against its resident rows of J_s
    and J_e (e in ``za_s[0]``; the last state's published hi then lo halves through
    ``za_s[1]``), u = σ(a), s' = u ⊙ s + (1 − u) ⊙ tanh(c) (its own units' s kept in
    fp32 in ``state_s``) and z = tanh(o), both published (``spub_g``, ``zpub_g``). s is
    zero before the first step."""
    walk = self.walk
    refs, rank = walk.refs, walk.rank
    units = walk.plan.update_units
    own = pl.ds(walk.block * units, units)
    e_tile, state_tile = refs.za_s.at[0], refs.za_s.at[1]
    first = step == 0
    # (Loaded before the state's copies are waited for, so their latencies overlap.)
    hoisted = [gpu.load(self.hoisted_columns(step, pl.ds(part * rank + walk.block * units,
                                                          units)),
                        gpu.WGMMA, optimized=False) for part in range(3)]
    with jax.named_scope("state_half"):
      self.stage_state_half(step, first, 0)
    # The parts' weight rows side by side on N ([J_s; J_e] of gate, candidate, output;
    # 3 · units <= WGMMA_MAX_N, ``plan_batched``): one WGMMA an operand tile for all
    # three, so each tile is read once, not once a part.
    def weights(operand):   # 0: J_s, 1: J_e
      return refs.update_w_s.at[operand].T
    # The lo half's product in an accumulator of its own, zeroed after the half is
    # staged: an accumulator live across the staging's branches makes ptxas fence the
    # WGMMA inside the leader's branch, which serializes every WGMMA of the kernel (its
    # C7520 report, two warpgroups) or injects a warpgroup arrive (C7519, one).
    def products_hi(acc):
      with jax.named_scope("update_mma_hi"):
        plgpu.wgmma(acc, e_tile, weights(1))       # J_e e
        plgpu.wgmma(acc, state_tile, weights(0))   # J_s s_hi
        plgpu.wgmma_wait(0)   # the hi half read before the lo half overwrites it
        return acc[...]
    def products_lo(acc):
      with jax.named_scope("update_mma_lo"):
        plgpu.wgmma(acc, state_tile, weights(0))   # J_s s_lo
        return acc[...]
    update_acc = plgpu.ACC((BATCH_TILE, 3 * units), jnp.float32)
    sums_hi = pl.run_scoped(products_hi, update_acc)
    with jax.named_scope("state_half"):
      self.stage_state_half(step, first, 1)
    sums = sums_hi + pl.run_scoped(products_lo, update_acc)
    gate_pre, candidate, output = (sums[:, part * units:(part + 1) * units] + hoisted[part]
                                   for part in range(3))
    with jax.named_scope("update_activation"):
      update = jax.nn.sigmoid(gate_pre)
      last = jnp.where(first, 0.0, gpu.load(refs.state_s, gpu.WGMMA, optimized=False))
      state = update * last + (1.0 - update) * jnp.tanh(candidate)
      refs.state_s[...] = state   # (each thread reads back only what it stored)
      output = jnp.tanh(output)
    with jax.named_scope("update_publish"):
      self.publish(refs.spub_g, step, own, state)
      self.publish(refs.zpub_g, step, own, output)
