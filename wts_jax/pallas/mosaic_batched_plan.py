"""The plan of the batched Mosaic GPU walk (``mosaic_batched_walk.py``): B rows on the
tensor cores.

The row kernel (``mosaic_plan.py``) puts 64 W2 rows on M and the batch on N with 8 W1
rows a batch row (its B operand is TMA-copied 8-row tiles), which stops at B = 4. Here z
is staged by bulk copies one row a batch row, so either orientation holds up to 64 rows:
``batch_axis="m"`` — per chunk ``[64 batch rows, r] x [r, 64 vocab rows]`` (B = 16
costs what B = 64 does: the rows past B are padding on M); ``"n"`` — ``[64 vocab rows,
r] x [r, B]`` (the work shrinks with B). Each block's shard is cut into 64-row chunks as
before; some stay resident in shared memory, the rest stream through a TMA ring; the
base logits of every chunk stream through a second ring (at B = 64 a step's base
logits are 147 KB a block: no longer a whole step ahead).
Pure Python on static shapes: the budget checks happen here.
"""

from __future__ import annotations

import dataclasses

from wts_jax.pallas.mosaic_plan import (CHUNK_ROWS, SMEM_ALIGNMENT, SMEM_RESERVED_BYTES,
                                        chunks_per_block)

BATCH_TILE = 64          # WGMMA M: the batch rows of one launch (unused rows are zeros)
BATCH_ALIGN = 8          # batch rows are padded to whole 8-row TMA tiles of base logits
Z_ROW_PAD_BYTES = 16     # z staging rows padded so the 8 rows a warp reads hit 8 bank groups
DEFAULT_RING_STAGES = 2
DEFAULT_BASE_STAGES = 3
# Where "auto" takes this kernel, (low, high] rows, greedy and sampled (measured at the
# Qwen3 shape, NOTES v10: the row kernel is faster up to 4 rows; sampled, the Triton
# kernel up to 16 — this kernel computes Gumbel noise for all 64 rows in one warpgroup).
AUTO_BATCHED_RANGE = (4, 64)
AUTO_SAMPLED_RANGE = (16, 64)


def padded_batch(batch: int) -> int:
  return -(-batch // BATCH_ALIGN) * BATCH_ALIGN


@dataclasses.dataclass(frozen=True)
class BatchedPlan:
  """A launch of the batched Mosaic kernel (all sizes static)."""

  num_blocks: int
  chunks: int               # 64-row chunks of W2 per block
  resident_chunks: int      # kept in shared memory for the whole walk
  ring_stages: int          # W2 slots of the streaming ring
  base_stages: int          # slots of the base-logit ring (divides ``chunks``)
  vocab_size: int
  rank: int
  batch_rows: int           # B padded to BATCH_ALIGN (<= BATCH_TILE)
  smem_bytes: int
  base_itemsize: int = 2
  w2_itemsize: int = 2
  int8_state: bool = False  # int8 W2 × z as two int8 planes (``wts_jax.int8_state``)
  snake: bool = True
  batch_axis: str = "m"     # "m": [B, r] x [r, 64] a chunk; "n": [64, r] x [r, B]

  @property
  def streamed_chunks(self) -> int:
    return self.chunks - self.resident_chunks

  @property
  def resident_fraction(self) -> float:
    """The share of W2 that stays in shared memory for the whole walk."""
    return min(1.0, self.resident_chunks * self.num_blocks * CHUNK_ROWS / self.vocab_size)

  @property
  def z_row_bytes(self) -> int:
    """A z staging row: a bf16 W1 row, or an int8 token's two planes side by side."""
    return self.rank * 2 + Z_ROW_PAD_BYTES

  def describe(self) -> str:
    chunk_kb = CHUNK_ROWS * self.rank * self.w2_itemsize / 1024
    return (f"batched Mosaic GPU walk: {self.num_blocks} blocks × {self.chunks} chunks of "
            f"{CHUNK_ROWS} rows; {self.resident_chunks} resident, "
            f"{self.streamed_chunks} streamed per step through a {self.ring_stages}-slot "
            f"ring ({chunk_kb:.0f} KB a slot); base logits through a {self.base_stages}-"
            f"slot ring; {self.batch_rows} batch rows on the WGMMA's "
            f"{self.batch_axis.upper()}"
            + ("; z as two int8 planes (int8 x int8 WGMMA)" if self.int8_state else ""))


def _aligned(nbytes: int) -> int:
  return -(-nbytes // SMEM_ALIGNMENT) * SMEM_ALIGNMENT


def fixed_bytes(*, chunks: int, rank: int, base_stages: int, base_itemsize: int,
                scaled: bool, int8_state: bool = False, batch_axis: str = "m") -> int:
  """Shared memory besides the W2 slots: z staging [64, 2r + pad] bytes and the swizzled
  A tile [64, 2r] bytes, the base ring [stages, 64, 64], an int8 W2's per-row scales
  [chunks, 64] f32, the tokens [64] and exchange keys [2, 64]; with int8 planes the
  scales around each row's s_lo [64, 32 + 8] f32 ([64, 64 + 8] and their [64] s_lo
  with the batch on N)."""
  z_stage = BATCH_TILE * (rank * 2 + Z_ROW_PAD_BYTES) + _aligned(BATCH_TILE * rank * 2)
  base = base_stages * BATCH_TILE * CHUNK_ROWS * base_itemsize
  scales = chunks * CHUNK_ROWS * 4 if scaled else 0
  window = 64 if batch_axis == "n" else 32   # mosaic_batched_walk's scale windows
  plane_scales = (_aligned(BATCH_TILE * (window + 8) * 4)
                  + (_aligned(BATCH_TILE * 4) if batch_axis == "n" else 0)
                  if int8_state else 0)
  return (_aligned(z_stage) + _aligned(base) + _aligned(scales) + _aligned(BATCH_TILE * 4)
          + _aligned(2 * BATCH_TILE * 4) + plane_scales)


def plan_batched(*, vocab_size: int, rank: int, batch: int, num_sms: int,
                 smem_per_block: int, num_blocks: int | None = None,
                 resident_chunks: int | None = None, ring_stages: int | None = None,
                 base_stages: int | None = None, base_itemsize: int = 2,
                 w2_itemsize: int = 2, int8_state: bool = False,
                 snake: bool = True, batch_axis: str = "m") -> BatchedPlan:
  """Shard V over ``num_blocks`` (default one block per SM) and split each block's shared
  memory: z staging, the base ring, scales first, then W2 — as many resident chunks as
  leave ``ring_stages`` slots streaming whole ring rounds per step (the ring restarts each
  step, so its slot indices are static)."""
  if w2_itemsize == 1 and not int8_state:
    raise ValueError("the batched walk meets an int8 W2 only with z as two int8 planes "
                     "(quantize_w2(head, 'int8', state='planes'))")
  if int8_state and w2_itemsize != 1:
    raise ValueError("int8 planes of z meet an int8 W2 only")
  if rank % 64 or rank > 256:
    raise ValueError(f"rank={rank} must be a multiple of 64 and <= 256 for the Mosaic walk")
  if vocab_size < CHUNK_ROWS or vocab_size % 8:   # (>= 64 also holds a 32-scale window)
    raise ValueError(f"vocab_size={vocab_size} must be a multiple of 8 and >= "
                     f"{CHUNK_ROWS} for the Mosaic walk")
  if not 1 <= batch <= BATCH_TILE:
    raise ValueError(f"batch={batch} must be in [1, {BATCH_TILE}] for one batched launch")
  blocks = num_blocks or num_sms
  if blocks > num_sms:
    raise ValueError(f"num_blocks={blocks} exceeds the {num_sms} SMs: the blocks could "
                     "not all be co-resident and the grid barrier would time out")
  chunks = chunks_per_block(vocab_size, blocks)
  if base_stages is None:
    base_stages = next(s for s in range(min(DEFAULT_BASE_STAGES, chunks), 0, -1)
                       if chunks % s == 0)
  if base_stages < 1 or chunks % base_stages:
    raise ValueError(f"base_stages={base_stages} must divide the {chunks} chunks a block "
                     "owns (the base ring restarts every step)")
  chunk_bytes = CHUNK_ROWS * rank * w2_itemsize
  fixed = fixed_bytes(chunks=chunks, rank=rank, base_stages=base_stages,
                      base_itemsize=base_itemsize, scaled=w2_itemsize == 1,
                      int8_state=int8_state, batch_axis=batch_axis)
  slots = (smem_per_block - SMEM_RESERVED_BYTES - fixed) // chunk_bytes
  if slots < 1:
    raise ValueError(f"{smem_per_block} bytes of shared memory hold no {chunk_bytes}-byte "
                     "W2 chunk beside the batched walk's staging")
  if resident_chunks is None and ring_stages in (None, 0) and chunks <= slots:
    resident_chunks, ring_stages = chunks, 0
  if ring_stages is None and resident_chunks is not None:
    # The deepest ring up to the default that streams the rest in whole rounds.
    rest = chunks - min(resident_chunks, chunks)
    ring_stages = next((s for s in range(min(DEFAULT_RING_STAGES, rest), 0, -1)
                        if rest % s == 0), 0)
  if ring_stages is None:
    ring_stages = min(DEFAULT_RING_STAGES, slots)
  if resident_chunks is None:
    resident_chunks = next((r for r in range(min(chunks, slots - ring_stages), -1, -1)
                            if r == chunks or (ring_stages and
                                               (chunks - r) % ring_stages == 0)), None)
    if resident_chunks is None:
      raise ValueError(f"no split of {chunks} chunks fits {slots} shared-memory slots "
                       f"with a {ring_stages}-slot ring")
  resident_chunks = min(resident_chunks, chunks)
  streamed = chunks - resident_chunks
  if streamed == 0:
    ring_stages = 0
  elif ring_stages < 1 or streamed % ring_stages:
    raise ValueError(f"{streamed} streamed chunks are not a whole number of rounds of a "
                     f"{ring_stages}-slot ring")
  if resident_chunks + ring_stages > slots:
    raise ValueError(f"{resident_chunks} resident chunks + {ring_stages} ring slots exceed "
                     f"the {slots} W2 chunks that fit a block's shared memory")
  used = SMEM_RESERVED_BYTES + fixed + (resident_chunks + ring_stages) * chunk_bytes
  return BatchedPlan(num_blocks=blocks, chunks=chunks, resident_chunks=resident_chunks,
                     ring_stages=ring_stages, base_stages=base_stages,
                     vocab_size=vocab_size, rank=rank, batch_rows=padded_batch(batch),
                     smem_bytes=used, base_itemsize=base_itemsize,
                     w2_itemsize=w2_itemsize, int8_state=int8_state, snake=snake,
                     batch_axis=batch_axis)
