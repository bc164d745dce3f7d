"""The batched kernel's epilogue: a chunk's base logits added and its greedy or Gumbel
top-1 (the generator of ``wts_jax.sampling``) folded into the warpgroup's bests — on M
per batch row (score, index), on N per accumulator element, reduced over the vocabulary
once a step; ties to the lower index, so chunk order does not matter — then at the
step's end warpgroup 1's bests merged into the leader's, whose exchange follows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import sampling
from wts_jax.output import STATUS_NAN_LOGITS
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.chunks import StepInputs


def better_of(value, index, other_value, other_index):
  """Where the other candidate wins: a higher score, or the same and a lower index (the
  walk's tie rule)."""
  return (other_value > value) | ((other_value == value) & (other_index < index))


class Epilogue:
  """The epilogue's part of ``kernel.BatchedWalk`` (a mixin over
  ``context.WalkContext`` and ``rings.Rings``)."""

  def fold(self, at: StepInputs, position, logits, carry):
    """Base logits added and the chunk folded into ``carry``, then its base slot and
    (streamed) ring slot refilled. Batch on M: the chunk's top-1 per row into the row's
    best (score, index); batch on N: every accumulator element into its own best (score,
    vocab row), reduced over the vocabulary once a step."""
    spec, refs, step = self.spec, self.refs, at.step
    best_value, best_index, nan_seen = carry
    resident, j, ring, _, c, _ = self.locate(step, position)
    base_slot = self.base_slot_of(step, position)
    if self.refill_before_epilogue:
      with jax.named_scope("refill"):
        if self.stages and not self.plan.producer:
          # Every warp past its wait for the WGMMA (a warpgroup barrier) before one
          # thread's copy overwrites the slot: a warp's wait completes its own part.
          # (After the epilogue the base slot's barrier is this one; a producer
          # waits for every thread's release.)
          plgpu.commit_smem()
        self.release_ring_slot(step, resident, j, ring)
    with jax.named_scope("epilogue"):
      with jax.named_scope("base_wait"):   # (profile region: the base copy's latency)
        plgpu.barrier_wait(refs.base_bar.at[base_slot])
      if self.n_major:   # the [rows, 64] tile read transposed
        base = gpu.load(refs.base_s.at[base_slot, pl.ds(0, self.rows)].T, gpu.WGMMA,
                        optimized=False)
      else:
        base = gpu.load(refs.base_s.at[base_slot], gpu.WGMMA)
      logits = logits + base.astype(jnp.float32)
      vocab_rows = self.chunk_start(c) + self.vocab_ids
      if spec.greedy:
        scores = logits
      else:
        noise = sampling.gumbel_from_uniform(
            sampling.uniform_from_stream(at.streams, vocab_rows))
        scores = logits * at.scale + jnp.where(at.noise_on, noise, 0.0)
      top, top_index, nan_seen = self.chunk_top(logits, scores, vocab_rows, nan_seen)
      better = (top > best_value) | ((top == best_value) & (top_index < best_index))
      best_value = jnp.where(better, top, best_value)
      best_index = jnp.where(better, top_index, best_index)
    with jax.named_scope("refill"):
      self.release_base_slot(step, position, base_slot)
      if not self.refill_before_epilogue:
        self.release_ring_slot(step, resident, j, ring)
    return best_value, best_index, nan_seen

  def chunk_top(self, logits, scores, vocab_rows, nan_seen):
    """A chunk's candidates (score, vocab row) and the NaN flag updated: on N every
    element, on M each row's top-1."""
    spec = self.spec
    if self.n_major:
      nan_seen = nan_seen | jnp.where(logits != logits, 1, 0)
      return scores, vocab_rows, nan_seen
    top = scores.max(axis=1)
    if spec.greedy and not spec.interpret:
      # The maximum propagates NaN (Mosaic's max.NaN): a row's top is NaN exactly where
      # one of its logits is, so no reduction of its own. (Interpreted, the maximum is
      # XLA CPU's, which skips NaN: the reduction stays.)
      nan_seen = nan_seen | jnp.where(top != top, 1, 0)
    else:
      nan_seen = nan_seen | jnp.where(logits != logits, 1, 0).max(axis=1)
    top_index = jnp.where(scores == lax.broadcast_in_dim(top, scores.shape, (0,)),
                          vocab_rows, gpu.BIG_INDEX).min(axis=1)
    return top, top_index, nan_seen

  def reduced(self, carry):
    """(best value, its index, NaN flag) per batch row of ``carry`` (this warpgroup's
    chunks, or on N with ``plan.merge_tiles`` both warpgroups'). Mosaic's cross-warp
    reductions (over the vocabulary on N, the NaN flag over the rows) share one scratch
    buffer among warpgroups: two warpgroups reduce in turn."""
    best_value, best_index, nan_seen = carry
    if self.n_major:   # over the vocabulary (axis 0): the best per batch column
      with jax.named_scope("column_reduce"):
        nan_seen = nan_seen.max(axis=0)
        top = best_value.max(axis=0)
        best_index = jnp.where(best_value == lax.broadcast_in_dim(top, self.tile, (1,)),
                               best_index, gpu.BIG_INDEX).min(axis=0)
        best_value = top
    nan_flag = jnp.where((nan_seen * jnp.where(self.row_ids < self.spec.batch, 1, 0)).max() > 0,
                         STATUS_NAN_LOGITS, 0)
    return best_value, best_index, nan_flag

  def merge_tiles(self):
    refs = self.refs
    return refs.merge_tile_value_s, refs.merge_tile_index_s, refs.merge_tile_nan_s

  def hand_over(self, carry):
    """Warpgroup 1's end of a step: its bests to the leader, then the next step."""
    refs = self.refs
    if self.plan.merge_tiles:   # every element's, unreduced: the leader reduces once
      for tile_ref, part in zip(self.merge_tiles(), carry):
        gpu.store(tile_ref, part)
      plgpu.barrier_arrive(refs.merge_bar)
      return jnp.int32(0)   # (its NaNs are in the leader's reduction)
    best_value, best_index, nan_flag = self.reduced(carry)
    refs.merge_value_s[pl.ds(0, self.batch_width)] = best_value
    refs.merge_index_s[pl.ds(0, self.batch_width)] = best_index
    if self.status_in_kernel:   # (the leader counts it: this warpgroup reports nothing)
      refs.merge_flag_s[0] = nan_flag
    plgpu.barrier_arrive(refs.merge_bar)
    return nan_flag

  def merged(self, carry):
    """The leader's bests merged with warpgroup 1's: (value, index, NaN flag) per row."""
    refs, width = self.refs, self.batch_width
    plgpu.barrier_wait(refs.merge_bar)   # also: warpgroup 1 has reduced or stored
    if self.plan.merge_tiles:   # element by element, then one reduction of both
      value, index, nan_seen = carry
      other_value, other_index, other_nan = (
          gpu.load(tile_ref, gpu.WGMMA, optimized=False) for tile_ref in self.merge_tiles())
      better = better_of(value, index, other_value, other_index)
      return self.reduced(
          (jnp.where(better, other_value, value), jnp.where(better, other_index, index),
           jnp.maximum(nan_seen, other_nan)))
    best_value, best_index, nan_flag = self.reduced(carry)
    other_value = gpu.load(refs.merge_value_s.at[pl.ds(0, width)], self.per_batch_row,
                           optimized=False)
    other_index = gpu.load(refs.merge_index_s.at[pl.ds(0, width)], self.per_batch_row,
                           optimized=False)
    better = better_of(best_value, best_index, other_value, other_index)
    best_value = jnp.where(better, other_value, best_value)
    best_index = jnp.where(better, other_index, best_index)
    if self.status_in_kernel:
      nan_flag = nan_flag | refs.merge_flag_s[0]
    return best_value, best_index, nan_flag

  def step_end(self, step, carry, flags):
    """The step's bests reduced (and merged across warpgroups) and exchanged over the
    grid by the leader; returns the step's status bits with ``flags``."""
    if self.wgs == 1:
      best_value, best_index, nan_flag = self.reduced(carry)
      return flags | nan_flag | self.exchange(step, best_value, best_index, flags | nan_flag)

    def merge_and_exchange():
      # (The exchange outside the profile's "merge" region, so that region is the wait
      # for warpgroup 1 and the merge alone.)
      with jax.named_scope("merge"):
        best_value, best_index, nan_flag = self.merged(carry)
      return nan_flag | self.exchange(step, best_value, best_index, flags | nan_flag)
    return flags | lax.cond(self.leader, merge_and_exchange, lambda: self.hand_over(carry))
