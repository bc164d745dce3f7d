"""The greedy int8-planes walk with the planes stacked on the WGMMA's M: one persistent
Mosaic GPU kernel, four computing warpgroups a block, B 1–64.

Where the batched kernel (``pallas/batched``) stages z in shared memory (the B operand on N, or A on M
with a plane a WGMMA), this kernel follows the public int8 kernel's design for B 5–64:

- z is the WGMMA's A operand **in registers**: each thread loads its request's
  fragments of both planes of W1 (32 requests × 2 planes stacked on M:
  ``threads``, ``operands``), so z takes no shared memory, no copies and no barrier;
- W2 is the B operand, 64-row tiles: the block's 18 tiles (Qwen3 at 132 blocks) are
  dealt to **phases** — four at B ≤ 32 (every warpgroup serves the same 32 requests,
  every fourth tile), two at B 33–64 (warpgroups 0, 1 serve requests 0–31, 2, 3 the
  rest; a phase's tiles are read by both its warpgroups);
- shared memory is W2's: each phase keeps ``resident[p]`` of its tiles for the whole
  walk and streams the rest through its own ring (FIFO across steps, so a step's first
  streamed tile arrives during the exchange before it), streamed and resident tiles
  alternating so a refill's latency hides behind a resident tile;
- base logits: each thread its request's 16 columns of a tile, a tile ahead, either
  loaded into registers or (``StackedPlan.base_slots``, the API's) copied into shared
  memory — by each thread's ``cp.async``, or one TMA copy a tile a warpgroup
  (``base_copies``) — and read back, so the next WGMMA's register fence does not wait
  for their HBM latency;
- (``StackedSpec.rotate_warps``) each warpgroup's warps serve the blocks' request warps
  rotated by its index, so a partly filled block's live requests issue on every warp
  scheduler, and (``skip_idle_warps``) a warp past the batch does not fold;
- each thread keeps a running best of its request; at the step's end the four lanes of
  a request reduce by shuffles, the warpgroups' bests meet in shared memory, and
  warpgroup 0 folds them into the grid's 64-bit keys (``grid_sync``), polls, and writes
  the tokens that every warpgroup gathers its next operand from.

A phase's walk is ``phase.Phase``; the register-level pieces are ``threads``, ``operands``,
``fold`` and ``bests``. Interpret mode runs one block, those pieces in ``jax.numpy``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.output import (KERNEL_STATUS_BITS, STATUS_NAN_LOGITS, STATUS_SYNC_TIMEOUT,
                            STATUS_TOKEN_OUT_OF_RANGE)
from wts_jax.pallas import grid_sync
from wts_jax.pallas.stacked import bests
from wts_jax.pallas.stacked.phase import Phase
from wts_jax.pallas.stacked.plan import MAX_BATCH, WARPGROUPS
from wts_jax.pallas.stacked.spec import StackedSpec
from wts_jax.pallas.stacked.threads import REQUESTS, TILE, tile_start, warpgroup_sync


class StackedWalk:
  """One block's walk: its refs and facts (the block and warpgroup indices and the grid's
  global buffers are traced, in this order), the prologue, and warpgroup 0's exchange."""

  def __init__(self, refs, spec: StackedSpec):
    self.spec, self.lab = spec, spec.lab
    inputs = 6 if spec.greedy else 9   # (a sampled walk: score scales, noise, seed)
    (self.w2_g, self.w2_scale_g, self.base_g, self.w1_g, self.s_lo_g, self.first_g,
     *self.sampling_g) = refs[:inputs]
    (self.tok_g, self.status_g, self.w_s, self.scale_s, self.tok_s, self.best_value_s,
     self.best_index_s, self.best_nan_s, self.nan_s, self.res_bar, self.ring_bar,
     self.free_bar, self.scale_bar, self.step_bar, self.tok_bar,
     *extra_scratch) = refs[inputs:]
    plan = self.plan = spec.plan
    base_slots = self.base_slots = 0 if spec.interpret else plan.base_slots
    by_tma = self.by_tma = bool(base_slots) and plan.base_copies == "tma"
    self.copies_ahead = max(1, base_slots - 1)   # tiles ahead a tile's base logits come
    self.base_s = extra_scratch[0] if base_slots else None
    self.base_bar = extra_scratch[1] if by_tma else None
    self.interpreted = extra_scratch[1 + by_tma:] if base_slots else extra_scratch
    self.steps, self.batch = spec.steps, spec.batch
    self.rotate = spec.rotate_warps   # (the warps' requests rotated)
    self.no_base = self.lab.timing_ablation == "base"   # (timing only: no base logits)
    self.narrow = self.lab.timing_ablation == "narrow_mma"   # (timing only: a quarter MMA)
    self.partly_filled = spec.batch < plan.request_blocks * REQUESTS   # (rows past the batch)
    # (the fold skips a warp past the batch where the batch leaves one)
    self.live_rows = spec.batch if spec.skip_idle_warps and self.partly_filled else None
    self.vocab, self.rank, self.tiles = plan.vocab_size, plan.rank, plan.tiles
    self.stages, self.phases, self.interpret = plan.ring_stages, plan.phases, spec.interpret
    self.block = lax.axis_index("blocks")
    self.wg = lax.axis_index("wg")
    self.leader = self.wg == 0
    self.step_words = MAX_BATCH * grid_sync.KEY_ROW_WORDS
    # The keys first: the first global allocation starts the zeroed buffer, so its
    # 64-bit slots are aligned (grid_sync).
    self.keys_g = (None if self.interpret else pl.get_global(
        plgpu.SemaphoreType.REGULAR((spec.steps * self.step_words,))))
    self.sem = None if self.interpret else pl.get_global(plgpu.SemaphoreType.REGULAR(()))
    self.status_in_kernel = spec.status == "kernel"
    self.bit_counts_g = (
        pl.get_global(plgpu.SemaphoreType.REGULAR((len(KERNEL_STATUS_BITS),)))
        if self.status_in_kernel and not self.interpret else None)

  def start(self, tile):
    return tile_start(self.block, tile, tiles=self.tiles, vocab=self.vocab)

  def copy_tile(self, tile, slot, barrier):
    plgpu.copy_gmem_to_smem(self.w2_g.at[pl.ds(self.start(tile), TILE)], self.w_s.at[slot],
                            barrier)

  def run(self):
    """The prologue (warpgroup 0), then each warpgroup its phase's walk."""
    pl.when(self.leader)(self.prologue)
    for p in range(self.phases):
      pl.when(lax.rem(self.wg, self.phases) == p)(
          functools.partial(lambda p: Phase(self, p).run(), p))

  def prologue(self):
    """The block's row scales, the first tokens, the NaN flag."""
    for tile in range(self.tiles):
      plgpu.copy_gmem_to_smem(self.w2_scale_g.at[pl.ds(self.start(tile), TILE)],
                              self.scale_s.at[tile], self.scale_bar)
    for k in range(3):
      self.nan_s[k] = jnp.int32(0)
    plgpu.commit_smem()   # (the zeros before the threads' flag below)
    bests.first_tokens(self.first_g, self.tok_s, self.nan_s, rows=self.batch,
                       vocab=self.vocab, status=STATUS_TOKEN_OUT_OF_RANGE,
                       interpret=self.interpret)
    plgpu.commit_smem()
    plgpu.barrier_arrive(self.tok_bar)

  def block_status(self):
    """The block's status bits in shared memory (the leader's; read after the step's
    barrier): a NaN seen, the first tokens', a time-out."""
    nan_s = self.nan_s
    return (nan_s[1] | jnp.where(nan_s[0] > 0, STATUS_NAN_LOGITS, 0)
            | jnp.where(nan_s[2] > 0, STATUS_SYNC_TIMEOUT, 0))

  def count_status_bits(self, flags):
    """The leader's last step, its keys published: one added to the counter of each
    status bit the block holds. (Its threads first meet: a NaN flag set by another
    thread's publish must be seen by the one that signals.)"""
    warpgroup_sync()
    held = flags | self.block_status()
    for i, bit in enumerate(KERNEL_STATUS_BITS):
      pl.when((held & bit) != 0)(functools.partial(
          plgpu.semaphore_signal, self.bit_counts_g.at[i], 1, memory_scope="gpu"))

  def exchange(self, step, flags):
    """Warpgroup 0's end of a step: each request's winner over the warpgroups and the
    grid, the tokens to ``tok_s`` (block 0: to ``tok_g``), shown to the others."""
    steps, batch, vocab = self.steps, self.batch, self.vocab
    with jax.named_scope("step_wait"):
      plgpu.barrier_wait(self.step_bar)
    if self.interpret:   # one block: the winners from the warpgroups' bests
      token = _interpreted_winners(self.best_value_s, self.best_index_s, self.best_nan_s,
                                   self.nan_s, phases=self.phases, batch=batch)
      ids = jnp.arange(MAX_BATCH, dtype=jnp.int32)
      tokens = jnp.where(ids < batch, jnp.clip(token, 0, vocab - 1), 0)
      self.tok_s[...] = tokens
      self.tok_g[:, step] = tokens[:batch]
    else:
      step_slots = self.keys_g.at[pl.ds(step * self.step_words, self.step_words)]
      with jax.named_scope("publish"):
        bests.publish_bests(self.best_value_s, self.best_index_s, self.best_nan_s,
                            self.nan_s, step_slots, rows=batch, phases=self.phases)
      if self.status_in_kernel:   # (released by the step's signal below)
        pl.when(step == steps - 1)(functools.partial(self.count_status_bits, flags))
      with jax.named_scope("grid_sync"):
        timed_out = grid_sync.signal_and_poll(self.sem, self.plan.num_blocks, step,
                                              spin_limit=self.spec.spin_limit)
      flags = flags | jnp.where(timed_out > 0, STATUS_SYNC_TIMEOUT, 0)
      with jax.named_scope("tokens"):
        bests.tokens_from_keys(step_slots, self.tok_s, self.tok_g, step, rows=batch,
                               vocab=vocab)
    with jax.named_scope("tokens"):
      plgpu.commit_smem()
      pl.when(step + 1 < steps)(functools.partial(plgpu.barrier_arrive, self.tok_bar))
    return flags

  def write_status(self, flags):
    """The warpgroup's status word, or (``spec.status="kernel"``) block 0's leader ORs
    every block's counted bits into one."""
    status = flags | jnp.where(self.leader, self.block_status(), 0)
    if not self.status_in_kernel:
      self.status_g[self.block * WARPGROUPS + self.wg] = status
      return

    @pl.when(self.leader & (self.block == 0))
    def _():
      total = status
      for i, bit in enumerate(KERNEL_STATUS_BITS if not self.interpret else ()):  # (one block)
        total = total | jnp.where(pl.semaphore_read(self.bit_counts_g.at[i]) > 0, bit, 0)
      self.status_g[0] = total


def _kernel(*refs, spec: StackedSpec):
  if spec.lab.dependent_launch and not spec.interpret:
    plgpu.griddepcontrol_wait()   # (before any operand is read)
  StackedWalk(refs, spec).run()


def _interpreted_winners(value_s, index_s, nan_s, flag_s, *, phases: int, batch: int):
  """One block (interpret mode): each request's best over the warpgroups that served
  it, as ``publish_bests`` picks it; a NaN seen sets ``flag_s[0]``."""
  values, indices, nans = value_s[...], index_s[...], nan_s[...]   # [4, 32]
  blocks = WARPGROUPS // phases
  best_v = values.reshape(blocks, phases, REQUESTS)
  best_i = indices.reshape(blocks, phases, REQUESTS)
  value, index = best_v[:, 0], best_i[:, 0]
  for k in range(1, phases):
    better = (best_v[:, k] > value) | ((best_v[:, k] == value) & (best_i[:, k] < index))
    value = jnp.where(better, best_v[:, k], value)
    index = jnp.where(better, best_i[:, k], index)
  index = index.reshape(-1)
  nan = nans.reshape(blocks, phases, REQUESTS).max(axis=1).reshape(-1)
  live = jnp.arange(blocks * REQUESTS) < batch
  flag_s[0] = jnp.maximum(flag_s[0], jnp.where(live, nan, 0).max())
  return jnp.pad(index, (0, MAX_BATCH - index.shape[0]))


def body(spec: StackedSpec):
  """The kernel body ``plgpu.kernel`` launches for ``spec``. The launch keeps the body
  function's name."""
  return functools.partial(_kernel, spec=spec)
