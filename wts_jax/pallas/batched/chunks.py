"""A step's chunks in the batched kernel: per 64-row W2 chunk (resident in shared memory,
or from the TMA ring) the WGMMA(s) against z into fp32 accumulators — on M
``[64, r] x [r, 64]`` = [batch row, vocab row], on N ``[64, r] x [r, B]`` = [vocab row,
batch row] — read back as the chunk's logits less the base and folded by the epilogue
(``epilogue.Epilogue.fold``). One rolled loop over a warpgroup's chunks, or with
``plan.overlap_chunks`` groups whose next chunk's WGMMAs run beside the previous chunk's
epilogue."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.int8_state import LO_STEPS
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS


@dataclasses.dataclass(frozen=True)
class StepInputs:
  """What a step's chunks read besides the kernel's facts, each over the accumulator
  tile: ``plane_scale`` (int8 planes: each row's s_lo) and, sampled, each row's noise
  ``streams``, its score ``scale`` and whether it draws noise (``noise_on``)."""
  step: object
  plane_scale: object = None
  streams: object = None
  scale: object = None
  noise_on: object = None


class Chunks:
  """The chunks' part of ``kernel.BatchedWalk`` (a mixin over ``context.WalkContext``,
  ``rings.Rings`` and ``epilogue.Epilogue``)."""

  def locate(self, step, position):
    """The chunk at ``position``: (resident?, its ring index j, its ring slot, its W2
    slot, its chunk id, its resident index)."""
    resident, index, j = self.chunk_kind(position)
    # The ring runs on across steps: a chunk's slot is its place in the walk's stream.
    ring = gpu.rem(self.stream_index(step, j), self.stages) if self.stages else 0
    return (resident, j, ring, gpu.select(resident, index, lambda: self.res + ring),
            gpu.select(resident, index, lambda: self.streamed_chunk(step, j)), index)

  def await_chunk(self, step, position):
    """Wait for the chunk's W2. Before its accumulators exist: their zeros and
    ``wgmma.fence`` must reach the WGMMA with no branch between, else ptxas inserts a
    fence of its own at the WGMMA, which inside a warpgroup's branch of the kernel
    serializes every WGMMA of the kernel (its C7520 report)."""
    refs = self.refs
    resident, _, ring, _, _, index = self.locate(step, position)
    with jax.named_scope("wait"):
      if self.res:   # once: the resident chunks copied in the prologue have landed
        gpu.when(gpu.and_(gpu.and_(resident, index == 0), step == 0),
                 lambda: plgpu.barrier_wait(refs.res_bar.at[self.wg]))
      if self.stages:
        gpu.when(gpu.not_(resident), lambda: plgpu.barrier_wait(self.ring_barrier(ring)))
    if self.spec.lab.probe_skew:
      with jax.named_scope("skew"):
        plgpu.commit_smem()

  def issue(self, step, position, acc_refs):
    """Issue the chunk's WGMMA(s) (asynchronous; its W2 awaited: ``await_chunk``)."""
    plan, refs = self.plan, self.refs
    slot = self.locate(step, position)[3]
    with jax.named_scope("mma"):
      # int8 planes: a plane an accumulator; a hi + lo pair: both into one; either
      # with ``pair_on_n``: both halves' rows in one operand, one accumulator.
      if plan.pair_on_n:
        operands = [(acc_refs[0], refs.za_s if self.planes or plan.token_table
                     else refs.za_s.at[0])]
      elif self.planes or plan.z_pair:
        operands = [(acc_refs[plane if self.planes else 0], refs.za_s.at[plane])
                    for plane in range(2)]
      else:
        operands = [(acc_refs[0], refs.za_s)]
      chunk_ref = refs.w_s.at[self.slot_base(self.wg) + slot]
      if plan.widened_in_kernel:
        chunk_ref = self.widened(chunk_ref)
      for acc_ref, z in operands:
        if self.n_major:   # the chunk is the A operand, the batch rows' z the B operand
          plgpu.wgmma(acc_ref, chunk_ref, z.at[pl.ds(0, self.n_width)].T)
        else:
          plgpu.wgmma(acc_ref, z, chunk_ref.T)

  def widened(self, chunk_ref):
    """An int8 chunk as a bf16 WGMMA operand: loaded in the layout whose upcast is the
    WGMMA's (4 bytes a load), converted (exact: |q| <= 127), then either kept in
    registers (the A operand, batch on N) or stored to the warpgroup's bf16 tile and
    fenced for the WGMMA, as either operand (no WGMMA reads the tile past its chunk:
    ``finish`` waits before the next issue)."""
    with jax.named_scope("widen"):
      values = gpu.load(chunk_ref, plgpu.Layout.WGMMA_UPCAST_2X, optimized=True)
      values = plgpu.layout_cast(values.astype(jnp.bfloat16), gpu.WGMMA)
      if self.plan.w2_widening == "registers":
        return values
      tile_ref = self.refs.widen_s.at[self.wg]
      tile_ref[...] = values
      plgpu.commit_smem()
      return tile_ref

  def finish(self, at: StepInputs, position, acc_refs, in_flight=0):
    """The chunk's logits less the base: its accumulator(s), read when complete
    (``in_flight``: the WGMMAs issued after this chunk's, left running).
    int8 planes: D = 256 · d_hi + d_lo exact in int32, then (f32(D) · s_lo) · scale2,
    the order of wts_jax.int8_state. ``plan.w2_row_scale``: the fp32 sum times the
    vocabulary rows' scales, as ``SerialHead.vocab_bias`` scales it."""
    plan, rows = self.plan, self.rows
    def read(acc_ref):
      return plgpu.wgmma_accumulator_load(acc_ref, wait_n=in_flight)
    def vocab_scale():
      c = self.locate(at.step, position)[4]
      scales = gpu.load(self.refs.w2_scale_s.at[self.wg * self.chunks + c],
                        gpu.ROW_VECTOR if self.n_major else gpu.COL_VECTOR)
      return lax.broadcast_in_dim(scales, self.tile, (self.vocab_axis,))
    def row_scaled(logits):
      return logits * vocab_scale() if plan.w2_row_scale else logits
    with jax.named_scope("mma_wait"):
      if plan.pair_on_n:   # the halves' columns: [0, rows) and [lo_offset, + rows)
        both = read(acc_refs[0])
        first = both[:, :rows]
        second = both[:, plan.lo_offset:plan.lo_offset + rows]
        if not self.planes:
          return row_scaled(first + second)
        d_hi, d_lo = first, second
      elif not self.planes:
        return row_scaled(read(acc_refs[0]))
      else:
        d_hi, d_lo = (read(acc_ref) for acc_ref in acc_refs)
      return (d_hi * LO_STEPS + d_lo).astype(jnp.float32) * at.plane_scale * vocab_scale()

  def wgmma_groups(self):
    """WGMMA groups a chunk issues (``issue``): one, or two for the int8 planes or a
    hi + lo pair unless they share one (``plan.pair_on_n``)."""
    plan = self.plan
    return 1 if plan.pair_on_n or not (self.planes or plan.z_pair) else 2

  def accumulators(self):
    dtype = jnp.int32 if self.planes else jnp.float32
    if self.plan.pair_on_n:
      return [plgpu.ACC((CHUNK_ROWS, self.n_width), dtype)]
    return [plgpu.ACC(self.tile, dtype)] * (2 if self.planes else 1)

  def chunk(self, at: StepInputs, position, carry):
    """One chunk: awaited, its WGMMAs issued and read, folded into ``carry``."""
    self.await_chunk(at.step, position)
    def product(*acc_refs):
      self.issue(at.step, position, acc_refs)
      return self.finish(at, position, acc_refs)
    return self.fold(at, position, pl.run_scoped(product, *self.accumulators()), carry)

  def overlapped_chunks(self, at: StepInputs, first, count, carry):
    """``plan.overlap_chunks``: chunks [first, first + count) with each chunk's WGMMAs
    issued before the previous chunk's accumulators are read (a wait that leaves the
    newer WGMMA group(s) running) and its epilogue. Each chunk's accumulators are a scope
    nested in the previous one's (a scope's accumulators start as zeros; an accumulator
    cannot be re-zeroed in interpret mode), so the last chunk of a group waits for its
    own WGMMAs."""
    groups = self.wgmma_groups()

    def nest(i, previous, carry):
      if i == count:
        return self.fold(at, first + i - 1, self.finish(at, first + i - 1, previous), carry)
      self.await_chunk(at.step, first + i)
      def scope(*acc_refs):
        self.issue(at.step, first + i, acc_refs)
        folded = carry
        if previous is not None:
          folded = self.fold(at, first + i - 1,
                             self.finish(at, first + i - 1, previous, in_flight=groups),
                             folded)
        return nest(i + 1, acc_refs, folded)
      return pl.run_scoped(scope, *self.accumulators())
    return nest(0, None, carry)

  def all_chunks(self, at: StepInputs):
    """This warpgroup's chunks of the step folded: (best value, its index, NaN seen) —
    per batch row on M, per accumulator element on N."""
    chunks = self.chunks
    carry_shape, carry_layout = ((self.tile, gpu.WGMMA) if self.n_major
                                 else ((self.tile[0],), gpu.ROW_VECTOR))
    carry = tuple(plgpu.layout_cast(jnp.full(carry_shape, value, dtype), carry_layout)
                  for value, dtype in ((gpu.NEG_INF, jnp.float32), (0, jnp.int32),
                                       (0, jnp.int32)))
    # One loop, not one code copy a chunk: unrolled, the copies spilled registers.
    if self.plan.overlap_chunks > 1:
      group = self.plan.overlap_chunks
      carry = lax.fori_loop(
          0, chunks // group,
          lambda k, carry: self.overlapped_chunks(at, k * group, group, carry), carry)
      if chunks % group:
        carry = self.overlapped_chunks(at, chunks - chunks % group, chunks % group, carry)
      return carry
    return lax.fori_loop(0, chunks, lambda position, carry: self.chunk(at, position, carry),
                         carry)
