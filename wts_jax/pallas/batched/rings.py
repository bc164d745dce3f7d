"""The batched kernel's copies into shared memory that run ahead of the compute: W2's
resident chunks (once), its streamed chunks through a TMA ring, and the base logits
through a ring of their own; and the producer warpgroup that issues the refills where a
plan has one.

A warpgroup's W2 ring carries a stream: per step, ``lead_of(owner)`` entries ahead of its
streamed W2 chunks (the gated head's G_e chunks, the leader's only), then those chunks.
An entry's ring slot is its place in the walk's stream modulo the slots, so the ring
runs on across steps: while the blocks meet at the grid barrier the next step's first
chunks are already in flight. The base ring likewise runs on across steps.

With a producer (``plan.producer``, one more warpgroup) the computing warpgroups never
issue a refill: they release each W2 slot (after its WGMMA's wait) and base slot (after
its loads) by mbarrier arrivals, and the producer refills a slot once released. Without
one, a warpgroup refills its own slots at once, after a warpgroup barrier.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.plan import BATCH_TILE
from wts_jax.pallas.batched.spec import PRODUCER_REGISTERS
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS


class Rings:
  """The copies' part of ``kernel.BatchedWalk`` (a mixin over ``context.WalkContext``)."""

  def copy_chunk(self, c, slot, barrier, owner=None):
    owner = self.wg if owner is None else owner
    plgpu.copy_gmem_to_smem(self.refs.w2_g.at[pl.ds(self.chunk_start(c, owner), CHUNK_ROWS)],
                            self.refs.w_s.at[self.slot_base(owner) + slot], barrier)

  def ring_barrier(self, ring, owner=None):
    return self.refs.ring_bar.at[(self.wg if owner is None else owner) * self.stages + ring]

  def base_slot_of(self, step, position, owner=None):
    """The slot of (step, position)'s base tile: its place in the walk's stream of base
    tiles."""
    return ((self.wg if owner is None else owner) * self.base_stages
            + gpu.rem(step * self.chunks + position, self.base_stages))

  def base_after(self, step, position):
    """(step, position) whose base tile refills the slot of (step, position)'s."""
    ahead = position + self.base_stages
    wraps = ahead >= self.chunks
    return (gpu.select(wraps, step + 1, lambda: step),
            gpu.select(wraps, ahead - self.chunks, lambda: ahead))

  def lead_of(self, owner):
    """The stream entries ahead of a step's streamed W2 chunks: the gated head's G_e
    chunks, in the leader's ring only."""
    if not self.gate_chunks:
      return 0
    if isinstance(owner, int):
      return self.gate_chunks if owner == 0 else 0
    return jnp.where(owner == 0, self.gate_chunks, 0)

  def stream_length(self, owner):
    return self.lead_of(owner) + self.streamed

  def stream_total(self, owner):
    return self.spec.steps * self.stream_length(owner)

  def stream_index(self, step, j, owner=None):
    """The stream entry of streamed W2 chunk j (its place in the step's order) of step."""
    owner = self.wg if owner is None else owner
    return step * self.stream_length(owner) + self.lead_of(owner) + j

  def copy_stream(self, index, owner=None):
    """Stream entry ``index`` (a G_e chunk or a streamed W2 chunk) into its ring slot."""
    owner = self.wg if owner is None else owner
    refs, res = self.refs, self.res
    ring = gpu.rem(index, self.stages)
    barrier = self.ring_barrier(ring, owner)
    length, lead = self.stream_length(owner), self.lead_of(owner)
    step, within = gpu.div(index, length), gpu.rem(index, length)
    if not self.gate_chunks:
      self.copy_chunk(self.streamed_chunk(step, within), res + ring, barrier, owner)
      return
    hidden_size = refs.gate_w_g.shape[1] - self.rank
    gpu.when(within >= lead, lambda: self.copy_chunk(
        self.streamed_chunk(step, within - lead), res + ring, barrier, owner))
    gpu.when(within < lead, lambda: plgpu.copy_gmem_to_smem(
        refs.gate_w_g.at[pl.ds(within * CHUNK_ROWS, CHUNK_ROWS), pl.ds(hidden_size, self.rank)],
        refs.w_s.at[self.slot_base(owner) + res + ring], barrier))

  def ring_refill_due(self, step, j, owner=None):
    owner = self.wg if owner is None else owner
    return self.stream_index(step, j, owner) + self.stages < self.stream_total(owner)

  def refill_ring_after(self, step, j, owner=None):
    """Streamed chunk j of ``step`` read: the stream entry ``stages`` later into its slot."""
    self.copy_stream(self.stream_index(step, j, owner) + self.stages, owner)

  def base_tile_g(self, step, position, owner=None):
    start = self.base_start(self.chunk_at(step, position), owner)
    return self.refs.base_g.at[:, step, pl.ds(start, CHUNK_ROWS)]

  def copy_base(self, step, position, owner=None):
    """The base tile of (step, position) into its slot."""
    base_slot = self.base_slot_of(step, position, owner)
    plgpu.copy_gmem_to_smem(self.base_tile_g(step, position, owner),
                            self.refs.base_s.at[base_slot, pl.ds(0, self.base_copy_rows)],
                            self.refs.base_bar.at[base_slot])

  def release_ring_slot(self, step, resident, j, ring):
    """A streamed chunk's W2 ring slot refilled with the stream entry ``stages`` later
    (every warp past its wait for the chunk's WGMMA: the warpgroup barrier before the
    call), or with a producer released to it by every thread's arrival."""
    if not self.stages:
      return
    if self.plan.producer:
      gpu.when(gpu.not_(resident), lambda: plgpu.barrier_arrive(
          self.refs.ring_free_bar.at[self.wg * self.stages + ring]))
    else:
      gpu.when(gpu.and_(self.ring_refill_due(step, j), gpu.not_(resident)),
               lambda: self.refill_ring_after(step, j))

  def release_base_slot(self, step, position, base_slot):
    """A chunk's base slot read: released to the producer, or refilled with the tile
    ``base_stages`` later."""
    refs = self.refs
    if self.plan.producer:   # the slots released to the producer: arrivals, no wait
      # Every warp's reads of the base slot done and ordered before the producer's
      # TMA: an arrival alone let the TMA overwrite a slot still being read (tokens
      # differed on the H200, most at 64 rows on N).
      plgpu.commit_smem()
      plgpu.barrier_arrive(refs.base_free_bar.at[base_slot])
    else:
      # Every warp's reads of the base slot before the TMA refills it.
      plgpu.commit_smem()
      next_step, next_position = self.base_after(step, position)
      gpu.when(next_step < self.spec.steps, lambda: self.copy_base(next_step, next_position))

  def zero_base_slots(self, short_base):
    """Rows past the batch: zeros, never NaN (on N the base copies bring the batch's rows
    only, so a slot's padded rows are zeroed here even at 64 plan rows)."""
    refs, wg, base_stages = self.refs, self.wg, self.base_stages
    if not self.n_major:
      zeros = plgpu.layout_cast(jnp.zeros((BATCH_TILE, CHUNK_ROWS), refs.base_s.dtype),
                                gpu.WGMMA)
      for s in range(base_stages):
        refs.base_s[wg * base_stages + s] = zeros
    elif short_base:
      for s in range(base_stages):
        refs.base_s[wg * base_stages + s] = jnp.zeros((self.rows, CHUNK_ROWS),
                                                      refs.base_s.dtype)

  def start_rings(self):
    """The prologue's copies: the stream's first entries, the first base tiles, the
    resident chunks, and an int8 W2's per-row scales ([chunks, 64] f32, once)."""
    refs, wg = self.refs, self.wg
    for g in range(self.stages):
      gpu.when(g < self.stream_total(wg), functools.partial(self.copy_stream, g))
    for p in range(self.base_stages):
      self.copy_base(0, p)
    for c in range(self.res):
      self.copy_chunk(c, c, refs.res_bar.at[wg])
    if self.plan.scaled:
      for c in range(self.chunks):
        plgpu.copy_gmem_to_smem(refs.w2_scale_g.at[pl.ds(self.chunk_start(c), CHUNK_ROWS)],
                                refs.w2_scale_s.at[wg * self.chunks + c],
                                refs.w2_scale_bar.at[wg])

  def producer(self):
    """The copying warpgroup: every refill of the W2 ring and the base ring, each issued
    once its slot is released by the consumer's arrivals (in the order the consumers
    read them, consumer by consumer), so no computing warp waits on a copy's issue."""
    if self.wgs > 1:
      plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")
    self.refill_all()
    if not self.status_in_kernel:
      self.refs.flag_g[self.block * self.threads + self.wg] = jnp.int32(0)

  def refill_all(self):
    """Every refill the consumers' releases allow, in their order, then the last
    releases observed."""
    refs, stages = self.refs, self.stages

    def refill(step, position, owner):
      next_step, next_position = self.base_after(step, position)
      def refill_base():
        plgpu.barrier_wait(refs.base_free_bar.at[self.base_slot_of(step, position, owner)])
        self.copy_base(next_step, next_position, owner)
      gpu.when(next_step < self.spec.steps, refill_base)
      if stages:
        resident, _, j = self.chunk_kind(position)
        def refill_ring():
          plgpu.barrier_wait(refs.ring_free_bar.at[
              owner * stages + gpu.rem(self.stream_index(step, j, owner), stages)])
          self.refill_ring_after(step, j, owner)
        gpu.when(gpu.and_(self.ring_refill_due(step, j, owner), gpu.not_(resident)),
                 refill_ring)

    def position_loop(step):
      def body(position, carry):
        for owner in range(self.wgs):
          refill(step, position, owner)
        return carry
      return body
    lax.fori_loop(0, self.spec.steps,
                  lambda step, carry: lax.fori_loop(0, self.chunks, position_loop(step), carry),
                  jnp.int32(0))
    # The last reads of every slot were released and never refilled: their phases
    # observed, so no arrival is pending when the kernel ends.
    for owner in range(self.wgs):
      for slot in range(self.base_stages):
        plgpu.barrier_wait(refs.base_free_bar.at[owner * self.base_stages + slot])
      for ring in range(min(stages, self.stream_total(owner))):
        plgpu.barrier_wait(refs.ring_free_bar.at[owner * stages + ring])
