"""What every part of the batched kernel reads: the launch's static facts (from its plan
and spec), its refs, the block's and warpgroup's indices, and where a warpgroup's chunks
lie in the vocabulary and in shared memory.

A block's chunks are split between its computing warpgroups (``plan.warpgroups``):
warpgroup ``wg`` owns chunks [wg · chunks, (wg + 1) · chunks) of the block's, its W2
slots from ``slot_base(wg)``, its ring and base slots from ``wg · stages`` and
``wg · base_stages``. The helpers take an ``owner`` (by default this warpgroup): the
producer serves every computing warpgroup.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.output import KERNEL_STATUS_BITS, STATUS_TOKEN_OUT_OF_RANGE
from wts_jax.pallas import grid_sync
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.plan import BATCH_TILE
from wts_jax.pallas.batched.spec import BatchedRefs, BatchedSpec, gathered_z_rows
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS, chunk_schedule, row_swizzle

STEP_KEY_WORDS = BATCH_TILE * grid_sync.KEY_ROW_WORDS   # a step's exchange slots


class WalkContext:
  """The kernel's facts and its addressing helpers. Built inside the kernel: the block
  and warpgroup indices, the grid's global buffers and the index vectors are traced
  values (in this order, the kernel's first)."""

  def __init__(self, refs: BatchedRefs, spec: BatchedSpec):
    self.spec = spec
    self.refs = refs
    plan = self.plan = spec.plan
    self.vocab, self.rank, self.rows = plan.vocab_size, plan.rank, plan.batch_rows
    self.blocks, self.res, self.stages = plan.num_blocks, plan.resident_chunks, plan.ring_stages
    self.streamed, self.chunks = plan.streamed_chunks, plan.wg_chunks
    self.base_stages = plan.base_stages
    self.block = lax.axis_index("blocks")
    self.wgs = plan.warpgroups
    self.threads = self.wgs + (1 if plan.producer else 0)   # (the producer's index is wgs)
    self.wg = lax.axis_index("wg") if self.threads > 1 else 0
    self.leader = self.wg == 0   # the warpgroup that stages z and runs the exchange
    self.multi_block = self.blocks > 1
    self._grid_buffers()
    self.status_in_kernel = spec.status == "kernel"
    self.refill_before_epilogue = spec.ring_refill == "before_epilogue"
    self.bit_counts_g = (
        pl.get_global(plgpu.SemaphoreType.REGULAR((len(KERNEL_STATUS_BITS),)))
        if self.status_in_kernel and self.multi_block else None)
    self._tile_shapes()
    self._staging_facts()
    # A step's chunks in order, one at a time: streamed ones with the resident ones spread
    # among them, so the ring keeps streaming while resident chunks are computed.
    self.order = [(kind, members[0])
                  for kind, members in chunk_schedule(self.res, self.streamed, 1)]

  def _grid_buffers(self):
    # The keys first: the kernel's first global allocation starts the (zeroed) buffer, so
    # its 64-bit slots are aligned (grid_sync).
    multi_block = self.multi_block
    self.keys_g = (pl.get_global(plgpu.SemaphoreType.REGULAR(
        (self.spec.steps * STEP_KEY_WORDS,))) if multi_block else None)
    self.sem = pl.get_global(plgpu.SemaphoreType.REGULAR(())) if multi_block else None
    # A split update's own barrier (one signal a block a step, like the exchange's).
    self.update_sem = (pl.get_global(plgpu.SemaphoreType.REGULAR(()))
                       if multi_block and self.plan.split else None)

  def _tile_shapes(self):
    plan, rows = self.plan, self.rows
    self.n_major = n_major = plan.batch_axis == "n"
    # The base logits' rows each copy brings: the plan's batch rows, or on N the batch as
    # given (a slot's rows past it are zeroed once and never written).
    self.base_copy_rows = self.refs.base_g.shape[0]
    # The accumulator a chunk: [batch rows, vocab rows] (batch on M) or [vocab rows, batch
    # rows] (batch on N, ``rows`` wide); a batch row's values run along ``vocab_axis``.
    self.tile = (CHUNK_ROWS, rows) if n_major else (BATCH_TILE, CHUNK_ROWS)
    self.vocab_axis, self.batch_axis = (0, 1) if n_major else (1, 0)
    self.per_batch_row = gpu.COL_VECTOR if n_major else gpu.ROW_VECTOR
    self.batch_width = self.tile[self.batch_axis]   # the batch rows a step's vectors carry
    self.published_rows = rows if n_major else BATCH_TILE   # a split update's rows copied back
    # Batch on N: the WGMMA's N (both halves' columns with ``pair_on_n``).
    self.n_width = plan.lo_offset + rows if plan.pair_on_n else rows
    self.vocab_ids = plgpu.broadcasted_iota(jnp.int32, self.tile, self.vocab_axis,
                                            layout=gpu.WGMMA)
    self.row_ids = plgpu.broadcasted_iota(jnp.int32, (self.batch_width,), 0,
                                          layout=self.per_batch_row)

  def _staging_facts(self):
    plan, refs = self.plan, self.refs
    self.planes, self.gated, self.gate_chunks = plan.int8_state, plan.gated, plan.gate_chunks
    # Rows past the batch that gather nothing keep the prologue's zeros, which no batch
    # row reads.
    self.gathered_rows = gathered_z_rows(self.spec)
    self.zero_padded_rows = self.rows < BATCH_TILE or self.gathered_rows < self.rows
    self.z_width = plan.z_row_elements
    # The round trip's layout: on M the WGMMA's own (64 rows); on N, where only the batch
    # rows are staged, Mosaic's shared-to-global copy layout, which moves any whole
    # number of swizzle tiles. (A gate table's staging holds int16 words: ``z_s.dtype``.)
    z_dtype = refs.za_s.dtype if refs.za_s is not None else refs.w1_g.dtype
    if self.n_major and (plan.token_table or not plan.z_pair):
      self.z_layout = plgpu.Layout.SMEM_GMEM_COPY(
          (plan.staged_rows, self.rank), z_dtype,
          row_swizzle(self.rank, jnp.dtype(z_dtype).itemsize))
    else:
      self.z_layout = plgpu.Layout.WGMMA_8BIT if self.planes else gpu.WGMMA

  def slot_base(self, owner):
    """A warpgroup's first W2 slot."""
    return owner * (self.res + self.stages)

  def chunk_start(self, c, owner=None):
    """Chunk ``c``'s first vocabulary row: clamped, so the last chunks overlap earlier
    rows rather than read past V."""
    return jnp.minimum(self.unclamped_start(c, owner), self.vocab - CHUNK_ROWS)

  def unclamped_start(self, c, owner=None):
    owner = self.wg if owner is None else owner
    return self.block * (self.plan.chunks * CHUNK_ROWS) + (owner * self.chunks + c) * CHUNK_ROWS

  def base_start(self, c, owner=None):
    """Chunk ``c``'s first column of ``base_g``: whole tiles, its last one the rows
    [V - 64, V) (``launch.batched_walk``), so a clamped chunk's base tile starts on a tile
    too (a copy into a tiled slot moves whole tiles: from an unaligned column it would
    start at the tile below)."""
    return jnp.minimum(self.unclamped_start(c, owner), self.refs.base_g.shape[2] - CHUNK_ROWS)

  def leader_only(self, body):
    if self.wgs > 1:
      pl.when(self.leader)(body)
    else:
      body()

  def streamed_chunk(self, step, j):
    """The chunk the step's j-th streamed position reads: odd steps in reverse with
    ``plan.snake``."""
    if not self.plan.snake:
      return self.res + j
    return self.res + jnp.where(lax.rem(step, 2) == 1, self.streamed - 1 - j, j)

  def chunk_kind(self, position):
    return gpu.chunk_kind(position, self.order)

  def chunk_at(self, step, position):
    resident, index, j = self.chunk_kind(position)
    return gpu.select(resident, index, lambda: self.streamed_chunk(step, j))

  def first_tokens_flag(self, first):
    """STATUS_TOKEN_OUT_OF_RANGE where a row's first token (as given) is outside [0, V)
    (the walk runs on from it clamped): reported here, so the caller needs no op of its
    own."""
    outside = jnp.where((first < 0) | (first >= self.vocab), 1, 0) * jnp.where(
        self.row_ids < self.spec.batch, 1, 0)
    return jnp.where(outside.max() > 0, STATUS_TOKEN_OUT_OF_RANGE, 0)

  def zero_tile(self, tile_ref):
    """A [64, r] bf16 WGMMA tile of z's (``za_s``) zeroed (generic stores)."""
    for c in range(self.rank // CHUNK_ROWS):
      tile_ref[:, pl.ds(c * CHUNK_ROWS, CHUNK_ROWS)] = plgpu.layout_cast(
          jnp.zeros((BATCH_TILE, CHUNK_ROWS), jnp.bfloat16), gpu.WGMMA)

  def plane_tiles(self):
    """The WGMMA tiles of z's two int8 planes, or of a hi + lo pair (one above the other
    with ``pair_on_n``)."""
    refs = self.refs
    if self.plan.pair_on_n:
      staged = self.plan.staged_rows
      return [refs.za_s.at[pl.ds(0, staged)], refs.za_s.at[pl.ds(staged, staged)]]
    return [refs.za_s.at[0], refs.za_s.at[1]]
