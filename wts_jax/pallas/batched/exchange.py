"""The batched kernel's step end over the grid: every block folds its best per row into
that row's 64-bit key of the step by an L2 atomic max, meets the others at the grid
barrier of ``grid_sync`` (the Mosaic protocol), and reads back the winning key — the same
token per row everywhere; the tokens go to shared memory (block 0 writes them out) and one
bulk copy per row fetches the next z. And the walk's status: a word a warpgroup, or with
``spec.status="kernel"`` reduced in the kernel."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.output import KERNEL_STATUS_BITS, STATUS_SYNC_TIMEOUT
from wts_jax.pallas import grid_sync
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.context import STEP_KEY_WORDS


class Exchange:
  """The exchange's part of ``kernel.BatchedWalk`` (a mixin over ``context.WalkContext``
  and ``z_staging.ZStaging``)."""

  def exchange(self, step, best_value, best_index, held):
    """The leader's end of a step: each row's winner over the grid, the tokens to
    ``tok_s`` (and by block 0 to ``tok_g``), the next step's z requested. Returns the
    timeout flag. ``held``: the block's status bits so far (``spec.status="kernel"``:
    counted at the last step, before its signal)."""
    spec, refs, width = self.spec, self.refs, self.batch_width
    timed_out = jnp.int32(0)
    if self.multi_block:
      # Each row's winner by the L2's atomics on one key per (step, row) (grid_sync).
      step_slots = self.keys_g.at[pl.ds(step * STEP_KEY_WORDS, STEP_KEY_WORDS)]
      with jax.named_scope("publish"):
        high, low = grid_sync.orderable_key(best_value, best_index)
        refs.keys_s[0, pl.ds(0, width)] = high
        refs.keys_s[1, pl.ds(0, width)] = low
        grid_sync.publish_keys(refs.keys_s, step_slots, width)
      if self.status_in_kernel:   # (released by the step's signal below)
        pl.when(step == spec.steps - 1)(functools.partial(self.count_status_bits, held))
      with jax.named_scope("grid_sync"):
        timed_out = grid_sync.signal_and_poll(self.sem, self.blocks, step,
                                              spin_limit=spec.spin_limit)
      with jax.named_scope("exchange_reduce"):
        grid_sync.collect_keys(step_slots, refs.keys_s, width)
        plgpu.commit_smem()   # every row's winning key stored before any thread reads it
        token = grid_sync.key_index(gpu.load(refs.keys_s.at[1, pl.ds(0, width)],
                                             self.per_batch_row, optimized=False))
    else:
      token = best_index
    with jax.named_scope("tokens"):
      tokens = jnp.clip(token, 0, self.vocab - 1)   # a NaN row is flagged, not followed
      refs.tok_s[pl.ds(0, width)] = tokens

    @pl.when(self.block == 0)
    def _():
      if self.n_major:   # [K, 64]: a column-layout vector stores contiguously only
        gpu.store(refs.tok_g, tokens, (step, pl.ds(0, width)))
      else:
        gpu.store(refs.tok_g, tokens, (slice(None), step))

    @pl.when(step + 1 < spec.steps)
    def _():
      # The z staging's generic reads (this step's WGMMA tile) and the tokens' stores
      # before the bulk copies.
      plgpu.commit_smem()
      with jax.named_scope("gather"):   # (profile region: issuing the rows' copies)
        self.gather_z()
    return jnp.where(timed_out > 0, STATUS_SYNC_TIMEOUT, 0)

  def count_status_bits(self, held):
    """The leader's last step: one added to the counter of each status bit the block
    holds (``spec.status="kernel"``), before the step's grid signal. A split update's
    last wait is this step's first, so its time-out is in too."""
    if self.plan.split:
      held = held | self.update.timeout_flag()
    for i, bit in enumerate(KERNEL_STATUS_BITS):
      pl.when((held & bit) != 0)(functools.partial(
          plgpu.semaphore_signal, self.bit_counts_g.at[i], 1, memory_scope="gpu"))

  def write_status(self, flags):
    """The walk's status: this warpgroup's word, or (``spec.status="kernel"``) block 0's
    leader, past the last step's barrier, ORs every block's counted bits into one."""
    refs = self.refs
    if self.plan.split:
      flags = flags | self.update.timeout_flag()
    if not self.status_in_kernel:
      refs.flag_g[self.block * self.threads + self.wg] = flags
      return

    @pl.when(self.leader & (self.block == 0))
    def _():   # (past the last step's barrier: every block's counts are in)
      total = flags
      for i, bit in enumerate(KERNEL_STATUS_BITS if self.multi_block else ()):
        total = total | jnp.where(pl.semaphore_read(self.bit_counts_g.at[i]) > 0, bit, 0)
      refs.flag_g[0] = total
