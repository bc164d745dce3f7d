"""The stacked kernel's plan: a block's 64-row W2 tiles dealt to phases (four warpgroups
serving one block of 32 requests, or two serving each of two), each phase's resident
tiles and ring, what else shared memory holds. Pure Python on static shapes."""

from __future__ import annotations

import dataclasses

from wts_jax.pallas.mosaic_plan import SMEM_ALIGNMENT, SMEM_RESERVED_BYTES, chunks_per_block
from wts_jax.pallas.stacked.operands import BASE_SLOT_BYTES
from wts_jax.pallas.stacked.threads import REQUESTS, TILE

WARPGROUPS = 4
# ``StackedLab.timing_ablation="narrow_mma"``: a tile's W2 rows its WGMMA still reads.
NARROW_MMA_ROWS = 16
MAX_BATCH = 2 * REQUESTS


@dataclasses.dataclass(frozen=True)
class StackedPlan:
  """What the kernel holds where. ``resident[p]``: phase p's tiles kept in shared memory
  for the walk; each phase streams the rest through ``ring_stages`` slots."""

  vocab_size: int
  rank: int
  num_blocks: int
  tiles: int                  # 64-row W2 tiles a block
  request_blocks: int         # blocks of 32 requests: 1 (B <= 32) or 2
  resident: tuple[int, ...]   # a phase's resident tiles
  ring_stages: int
  # The base logits: 0, loaded into registers a tile ahead (a WGMMA's register fence
  # then waits for them); 2 or 3, copied by ``cp.async`` into that many slots a
  # warpgroup (``operands.BASE_SLOT_BYTES`` each), ``base_slots - 1`` tiles
  # ahead, and read back in the fold.
  base_slots: int = 0
  # Who copies the base logits into the slots: "threads", each thread its own words by
  # 4-byte ``cp.async`` (``operands.copy_base``); "tma", one TMA copy a tile a
  # warpgroup (its requests' 64 columns, 128-byte swizzled) waited for on an mbarrier,
  # issued once the tile before's WGMMA is done (every warp has then read the slot it
  # overwrites: their reads precede their WGMMA's register fence). V a multiple of 8
  # (the TMA's row stride).
  base_copies: str = "threads"

  def __post_init__(self):
    if self.base_slots not in (0, 2, 3, 4):
      raise ValueError(f"base_slots={self.base_slots} must be 0, 2, 3 or 4")
    if self.base_copies not in ("threads", "tma"):
      raise ValueError(f"base_copies={self.base_copies!r} must be 'threads' or 'tma'")
    if self.base_copies == "tma" and (not self.base_slots or self.vocab_size % 8):
      raise ValueError(f"base_copies='tma' needs base slots (base_slots={self.base_slots}) "
                       f"and V a multiple of 8 (vocab_size={self.vocab_size})")
    if self.request_blocks not in (1, 2):
      raise ValueError(f"request_blocks={self.request_blocks} must be 1 or 2")
    if len(self.resident) != self.phases:
      raise ValueError(f"resident={self.resident}: one count for each of {self.phases} phases")
    for p, res in enumerate(self.resident):
      if not 0 <= res <= len(self.phase_tiles(p)):
        raise ValueError(f"resident[{p}]={res} outside [0, {len(self.phase_tiles(p))}]")
      if res < len(self.phase_tiles(p)) and self.ring_stages < 1:
        raise ValueError(f"phase {p} streams tiles through ring_stages={self.ring_stages}")

  @property
  def phases(self) -> int:
    return WARPGROUPS // self.request_blocks

  def phase_tiles(self, p: int) -> list[int]:
    return list(range(p, self.tiles, self.phases))

  def order(self, p: int) -> list[tuple[int, bool, int]]:
    """Phase p's tiles in the order a step takes them: (tile, streamed?, index among
    the streamed or among the resident), the streamed spread evenly from the first."""
    tiles = self.phase_tiles(p)
    count, streamed = len(tiles), len(tiles) - self.resident[p]
    out, kinds = [], [0, 0]
    for i, tile in enumerate(tiles):
      kind = streamed > 0 and (i * streamed) % count < streamed
      out.append((tile, kind, kinds[kind]))
      kinds[kind] += 1
    return out

  def streamed(self, p: int) -> int:
    return len(self.phase_tiles(p)) - self.resident[p]

  def slot_base(self, p: int) -> int:
    """Phase p's first W2 slot: its resident tiles, then its ring."""
    return sum(self.resident[q] + self.ring_stages for q in range(p))

  @property
  def slots(self) -> int:
    return self.slot_base(self.phases)

  @property
  def resident_fraction(self) -> float:
    """The share of W2 that stays in shared memory for the whole walk (the floor
    model's ``resident_fraction``)."""
    return min(1.0, sum(self.resident) * self.num_blocks * TILE / self.vocab_size)

  def describe(self) -> str:
    return (f"stacked int8-planes walk: {self.num_blocks} blocks × {self.tiles} tiles of 64 "
            f"rows, {self.phases} phases, resident {list(self.resident)}, "
            f"{self.ring_stages}-slot rings"
            + (f", base logits by {'TMA' if self.base_copies == 'tma' else 'async'} "
               f"copies into {self.base_slots} slots" if self.base_slots else ""))


def tile_bytes(rank: int) -> int:
  return TILE * rank


def fixed_smem_bytes(tiles: int, z_stage_bytes: int = 0) -> int:
  """Shared memory besides W2: the block's row scales, the warpgroups' bests, the
  tokens and the flags, and the base slots' bytes (each allocation on its own 1 KB)."""
  def aligned(n):
    return -(-n // SMEM_ALIGNMENT) * SMEM_ALIGNMENT
  return (aligned(tiles * TILE * 4) + 3 * aligned(WARPGROUPS * REQUESTS * 4)
          + aligned(MAX_BATCH * 4) + aligned(3 * 4) + aligned(z_stage_bytes))


def plan_stacked(*, vocab_size: int, rank: int, batch: int, num_blocks: int,
                 smem_per_block: int, ring_stages: int | None = None,
                 resident: int | None = None, base_slots: int = 0,
                 base_copies: str = "threads") -> StackedPlan:
  """The most resident tiles shared memory holds beside ``ring_stages`` slots a phase
  (by default one at B <= 32; above, where two warpgroups share a phase's ring, two, or
  one with the base logits by TMA: measured fastest),
  dealt to the phases with the most tiles first. ``resident``: the block's total,
  at most what fits. ``base_slots``, ``base_copies``: ``StackedPlan``'s."""
  if not 1 <= batch <= MAX_BATCH:
    raise ValueError(f"batch={batch}: the stacked walk takes 1 to {MAX_BATCH} rows")
  if rank % 32 or vocab_size % 2 or vocab_size < TILE:
    raise ValueError(f"rank={rank}, vocab_size={vocab_size}: the stacked walk needs r a "
                     "multiple of 32 and an even V of at least 64")
  request_blocks = 1 if batch <= REQUESTS else 2
  phases = WARPGROUPS // request_blocks
  tiles = chunks_per_block(vocab_size, num_blocks)
  default_stages = 1 if request_blocks == 1 or base_copies == "tma" else 2
  stages = default_stages if ring_stages is None else ring_stages
  counts = [len(range(p, tiles, phases)) for p in range(phases)]
  stage = WARPGROUPS * base_slots * BASE_SLOT_BYTES
  room = ((smem_per_block - SMEM_RESERVED_BYTES - fixed_smem_bytes(tiles, stage))
          // tile_bytes(rank))
  fit = room - stages * phases
  if fit < 0:
    raise ValueError(f"{smem_per_block} bytes of shared memory hold no {stages}-slot ring "
                     f"for each of {phases} phases")
  total = min(fit, sum(counts)) if resident is None else resident
  if total > fit:
    raise ValueError(f"resident={resident} tiles: at most {fit} fit beside the rings")
  share = [0] * phases
  for _ in range(total):   # one at a time to the phase with the most still streamed
    p = max(range(phases), key=lambda q: (counts[q] - share[q], -q))
    if counts[p] == share[p]:
      break
    share[p] += 1
  return StackedPlan(vocab_size=vocab_size, rank=rank, num_blocks=num_blocks, tiles=tiles,
                     request_blocks=request_blocks, resident=tuple(share),
                     ring_stages=stages, base_slots=base_slots, base_copies=base_copies)
