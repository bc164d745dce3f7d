"""The greedy int8-planes walk with the planes stacked on the WGMMA's M: one persistent
Mosaic GPU kernel, four computing warpgroups a block, B 1–64.

Where ``mosaic_batched_walk`` stages z in shared memory (the B operand on N, or A on M
with a plane a WGMMA), this kernel follows the public int8 kernel's design for B 5–64:

- z is the WGMMA's A operand **in registers**: each thread loads its request's
  fragments of both planes of W1 (32 requests × 2 planes stacked on M:
  ``stacked_planes``), so z takes no shared memory, no copies and no barrier;
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

Interpret mode runs one block, its pieces (``stacked_planes``) in ``jax.numpy``.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.int8_state import thread_rows_ordered
from wts_jax.output import (KERNEL_STATUS_BITS, STATUS_NAN_LOGITS, STATUS_SYNC_TIMEOUT,
                            STATUS_TOKEN_OUT_OF_RANGE)
from wts_jax.pallas import grid_sync
from wts_jax.pallas import stacked_planes as sp
from wts_jax.pallas.mosaic_plan import SMEM_ALIGNMENT, SMEM_RESERVED_BYTES, chunks_per_block
from wts_jax.pallas.mosaic_walk import _interpret_params, _w2_transforms

WARPGROUPS = 4
# ``StackedLab.timing_ablation="narrow_mma"``: a tile's W2 rows its WGMMA still reads.
NARROW_MMA_ROWS = 16
MAX_BATCH = 2 * sp.REQUESTS


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
  # warpgroup (``stacked_planes.BASE_SLOT_BYTES`` each), ``base_slots - 1`` tiles
  # ahead, and read back in the fold.
  base_slots: int = 0
  # Who copies the base logits into the slots: "threads", each thread its own words by
  # 4-byte ``cp.async`` (``stacked_planes.copy_base``); "tma", one TMA copy a tile a
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
    return min(1.0, sum(self.resident) * self.num_blocks * sp.TILE / self.vocab_size)

  def describe(self) -> str:
    return (f"stacked int8-planes walk: {self.num_blocks} blocks × {self.tiles} tiles of 64 "
            f"rows, {self.phases} phases, resident {list(self.resident)}, "
            f"{self.ring_stages}-slot rings"
            + (f", base logits by {'TMA' if self.base_copies == 'tma' else 'async'} "
               f"copies into {self.base_slots} slots" if self.base_slots else ""))


def tile_bytes(rank: int) -> int:
  return sp.TILE * rank


def fixed_smem_bytes(tiles: int, z_stage_bytes: int = 0) -> int:
  """Shared memory besides W2: the block's row scales, the warpgroups' bests, the
  tokens and the flags, and the base slots' bytes (each allocation on its own 1 KB)."""
  def aligned(n):
    return -(-n // SMEM_ALIGNMENT) * SMEM_ALIGNMENT
  return (aligned(tiles * sp.TILE * 4) + 3 * aligned(WARPGROUPS * sp.REQUESTS * 4)
          + aligned(MAX_BATCH * 4) + aligned(3 * 4) + aligned(z_stage_bytes))


def plan_stacked(*, vocab_size: int, rank: int, batch: int, num_blocks: int,
                 smem_per_block: int, ring_stages: int | None = None,
                 resident: int | None = None, base_slots: int = 0,
                 base_copies: str = "threads") -> StackedPlan:
  """The most resident tiles shared memory holds beside ``ring_stages`` slots a phase
  (by default one at B <= 32; above, where two warpgroups share a phase's ring, two, or
  one with the base logits by TMA: measured, NOTES v32),
  dealt to the phases with the most tiles first. ``resident``: the block's total,
  at most what fits. ``base_slots``, ``base_copies``: ``StackedPlan``'s."""
  if not 1 <= batch <= MAX_BATCH:
    raise ValueError(f"batch={batch}: the stacked walk takes 1 to {MAX_BATCH} rows")
  if rank % 32 or vocab_size % 2 or vocab_size < sp.TILE:
    raise ValueError(f"rank={rank}, vocab_size={vocab_size}: the stacked walk needs r a "
                     "multiple of 32 and an even V of at least 64")
  request_blocks = 1 if batch <= sp.REQUESTS else 2
  phases = WARPGROUPS // request_blocks
  tiles = chunks_per_block(vocab_size, num_blocks)
  default_stages = 1 if request_blocks == 1 or base_copies == "tma" else 2
  stages = default_stages if ring_stages is None else ring_stages
  counts = [len(range(p, tiles, phases)) for p in range(phases)]
  stage = WARPGROUPS * base_slots * sp.BASE_SLOT_BYTES
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


@dataclasses.dataclass(frozen=True)
class StackedLab:
  """What only tools/ set on a stacked launch (``tools/stacked_probe.py``).

  profile_dir, profile_space: Mosaic GPU's profiler over the kernel's named regions.
  timing_ablation (timing only; the tokens are wrong): "fold", a tile's fold cut to its
    first column pair; "base", no base logits loaded (with base slots: none copied, the
    fold reads the slots as they are); "mma", no WGMMA issued (the accumulators stay
    zero); "narrow_mma" (GPU), each tile's WGMMA on its first ``NARROW_MMA_ROWS`` rows
    only and only their logits folded: the same chain of WGMMAs a tile on the same
    gathered z, a quarter of the tensor cores' work. What a walk would gain were that
    work free.
  prefetch_base: each step's base logits (the block's columns of every request)
    prefetched into the L2 a step ahead by the last warpgroup
    (``stacked_planes.prefetch_base``; faster alone at B 16, slower at B 64:
    ``docs/decisions.md``).
  base_vector_reads: with ``w2_order="thread_rows"`` and the threads' async base copies,
    the fold reads a thread's 32 bytes of base logits as two 16-byte loads, not eight
    4-byte ones (TMA slots always read them so). Not measured.
  dependent_launch (GPU, jax >= 0.11): the kernel starts with ``griddepcontrol.wait``,
    so XLA launches it as a programmatic dependent launch (its blocks placed while the
    op before it ends, waiting there before reading any operand). Not measured.
  """
  profile_dir: str = ""
  profile_space: int = 0
  timing_ablation: str = ""
  prefetch_base: bool = False
  base_vector_reads: bool = False
  dependent_launch: bool = False

  def __post_init__(self):
    if self.timing_ablation not in ("", "fold", "base", "mma", "narrow_mma"):
      raise ValueError(f"timing_ablation={self.timing_ablation!r} must be one of '', "
                       "'fold', 'base', 'mma', 'narrow_mma'")


@dataclasses.dataclass(frozen=True)
class StackedSpec:
  plan: StackedPlan
  batch: int
  steps: int
  smem_per_block: int = 227 * 1024   # what the plan was made for (a part's replanned)
  ring_stages: int | None = None     # the caller's ring slots (None: the planner's)
  spin_limit: int = 1 << 22
  interpret: bool = False
  # A sampled walk (Gumbel-max; ``stacked_walk``'s ``sampling`` operands) or greedy;
  # ``row_offset``: this launch's first row in the walk (the noise's row index).
  greedy: bool = True
  row_offset: int = 0
  # W1's planes as given ("rows") or ``int8_state.fragment_ordered`` ("fragments": a
  # thread's share of a row by 16-byte loads; GPU only; ``W1Planes.fragments``).
  w1_order: str = "rows"
  # W2 as given ("rows") or ``int8_state.thread_rows_ordered`` ("thread_rows", V a
  # multiple of 64, the base logits in slots on the GPU): a thread's 16 columns of a tile
  # are 16 consecutive rows, so its base logits are two 16-byte copies, not eight of 4
  # bytes (by TMA: one copy a tile as before, the fold's reads two 16-byte loads).
  w2_order: str = "rows"
  # GPU only. ``rotate_warps``: warp w of warpgroup g serves the requests of warp
  # (w + g) % 4 of a block of 32 (``stacked_planes._request_warp``), so a partly filled
  # block's live requests fall on every warp scheduler, not the first ones of each
  # warpgroup; ``skip_idle_warps``: a warp whose 8 requests are all past the batch folds
  # nothing.
  rotate_warps: bool = False
  skip_idle_warps: bool = False
  # The walk's status: "flags", a word a warpgroup, OR-reduced by an XLA op after the
  # launch; "kernel", reduced in the kernel: before its last step's grid signal each
  # block adds one to a zeroed global counter a status bit it holds
  # (``output.KERNEL_STATUS_BITS``), and block 0, past that step's barrier, ORs the
  # counters' bits into its own status and writes the one word. No op after the kernel.
  # (A block's own time-out in the last step's wait is block 0's to report only: the
  # tokens are block 0's.)
  status: str = "flags"
  # Measurement and profiling options that only tools/ set.
  lab: StackedLab = StackedLab()

  def __post_init__(self):
    for name, allowed in (("w1_order", ("rows", "fragments")),
                          ("w2_order", ("rows", "thread_rows")),
                          ("status", ("flags", "kernel"))):
      value = getattr(self, name)
      if value not in allowed:
        raise ValueError(f"{name}={value!r} must be one of {', '.join(map(repr, allowed))}")
    if self.interpret and self.w1_order != "rows":
      raise ValueError(f"w1_order={self.w1_order!r}: the interpreted gather reads W1's rows")
    if self.w2_order == "thread_rows" and (
        self.plan.vocab_size % sp.TILE or (not self.interpret and not self.plan.base_slots)):
      raise ValueError("w2_order='thread_rows': V a multiple of 64 (V="
                       f"{self.plan.vocab_size}) and on the GPU the base logits in slots")
    if self.lab.base_vector_reads and self.w2_order != "thread_rows":
      raise ValueError("base_vector_reads: W2 in its threads' rows")
    if self.interpret and self.lab.timing_ablation == "narrow_mma":
      raise ValueError("timing_ablation='narrow_mma': GPU only")
    if self.interpret and (self.rotate_warps or self.skip_idle_warps):
      raise ValueError("rotate_warps, skip_idle_warps: GPU only (the interpreted walk "
                       "has no warps)")


def w2_operand(spec: StackedSpec, operands: dict):
  """W2 in the order ``spec`` reads it (``thread_rows``: made here when the operands
  lack ``w2_thread_rows``: a copy of W2)."""
  if spec.w2_order == "thread_rows":
    return (operands["w2_thread_rows"] if "w2_thread_rows" in operands
            else thread_rows_ordered(operands["w2"]))
  return operands["w2"]


def w1_planes_operand(spec: StackedSpec, operands: dict):
  """W1's planes in the order ``spec`` reads them, from ``head_operands.serial_operands``
  (the head carries the rows and the fragment order)."""
  return operands["w1_fragments" if spec.w1_order == "fragments" else "w1_planes"]


def row_launches(spec: StackedSpec) -> list[tuple[slice, StackedSpec]]:
  """The walk's rows a launch each, at most 64 (the rows of a walk are independent),
  each part planned for its own rows."""
  parts = []
  for first in range(0, spec.batch, MAX_BATCH):
    rows = min(MAX_BATCH, spec.batch - first)
    plan = plan_stacked(vocab_size=spec.plan.vocab_size, rank=spec.plan.rank, batch=rows,
                        num_blocks=spec.plan.num_blocks, smem_per_block=spec.smem_per_block,
                        ring_stages=spec.ring_stages, base_slots=spec.plan.base_slots,
                        base_copies=spec.plan.base_copies)
    parts.append((slice(first, first + rows),
                  dataclasses.replace(spec, plan=plan, batch=rows,
                                      row_offset=spec.row_offset + first)))
  return parts


def _kernel(*refs, spec: StackedSpec):
  lab = spec.lab
  if lab.dependent_launch and not spec.interpret:
    plgpu.griddepcontrol_wait()   # (before any operand is read)
  inputs = 6 if spec.greedy else 9   # (a sampled walk: score scales, noise, seed)
  w2_g, w2_scale_g, base_g, w1_g, s_lo_g, first_g, *sampling_g = refs[:inputs]
  (tok_g, status_g, w_s, scale_s, tok_s, best_value_s, best_index_s, best_nan_s, nan_s,
   res_bar, ring_bar, free_bar, scale_bar, step_bar, tok_bar, *extra_scratch) = refs[inputs:]
  base_slots = 0 if spec.interpret else spec.plan.base_slots
  by_tma = bool(base_slots) and spec.plan.base_copies == "tma"
  copies_ahead = max(1, base_slots - 1)   # tiles ahead a tile's base logits are fetched
  base_s = extra_scratch[0] if base_slots else None
  base_bar = extra_scratch[1] if by_tma else None
  interpreted = extra_scratch[1 + by_tma:] if base_slots else extra_scratch
  plan, steps, batch = spec.plan, spec.steps, spec.batch
  rotate = spec.rotate_warps   # (the warps' requests rotated)
  no_base = lab.timing_ablation == "base"   # (timing only: no base logits fetched)
  narrow = lab.timing_ablation == "narrow_mma"   # (timing only: a quarter of the WGMMA)
  partly_filled = batch < plan.request_blocks * sp.REQUESTS   # (rows past the batch)
  # (the fold skips a warp past the batch where the batch leaves one)
  live_rows = batch if spec.skip_idle_warps and partly_filled else None
  vocab, rank, tiles, stages = plan.vocab_size, plan.rank, plan.tiles, plan.ring_stages
  phases, interpret = plan.phases, spec.interpret
  block = lax.axis_index("blocks")
  wg = lax.axis_index("wg")
  leader = wg == 0
  step_words = MAX_BATCH * grid_sync.KEY_ROW_WORDS
  # The keys first: the first global allocation starts the zeroed buffer, so its
  # 64-bit slots are aligned (grid_sync).
  keys_g = (None if interpret else
            pl.get_global(plgpu.SemaphoreType.REGULAR((steps * step_words,))))
  sem = None if interpret else pl.get_global(plgpu.SemaphoreType.REGULAR(()))
  status_in_kernel = spec.status == "kernel"
  bit_counts_g = (pl.get_global(plgpu.SemaphoreType.REGULAR((len(KERNEL_STATUS_BITS),)))
                  if status_in_kernel and not interpret else None)

  def start(tile):
    return sp.tile_start(block, tile, tiles=tiles, vocab=vocab)

  def copy_tile(tile, slot, barrier):
    plgpu.copy_gmem_to_smem(w2_g.at[pl.ds(start(tile), sp.TILE)], w_s.at[slot], barrier)

  def phase_body(p):
    order = plan.order(p)
    res, streamed, base_slot = plan.resident[p], plan.streamed(p), plan.slot_base(p)
    issuer = wg == p   # the phase's warpgroup of request block 0 issues its copies
    shared_ring = plan.request_blocks > 1

    count = len(order)

    def ring_slot(entry):
      return lax.rem(entry, stages) if stages > 1 else 0

    def streamed_before(position):
      """Streamed tiles among the phase's first ``position`` (``plan.order``'s rule)."""
      if not streamed:
        return 0
      return jnp.where(position == 0, 0, ((position - 1) * streamed) // count + 1)

    def position_of(j):
      """The position of the phase's j-th streamed tile."""
      return (j * count + streamed - 1) // streamed

    def copy_entry(entry):
      """Ring entry ``entry`` (its slot ``entry % stages``): the phase's
      ``entry % streamed``-th streamed tile (of step ``entry // streamed``)."""
      slot = ring_slot(entry)
      copy_tile(p + position_of(entry % streamed) * phases, base_slot + res + slot,
                ring_bar.at[p * stages + slot])

    @pl.when(issuer)
    @jax.named_scope("prologue")
    def _():
      for k, (tile, _, _) in enumerate(t for t in order if not t[1]):
        copy_tile(tile, base_slot + k, res_bar.at[base_slot + k])
      for entry in range(min(stages, streamed * steps)):
        copy_entry(entry)

    # The base logits' L2 prefetch (``prefetch_base``): by the last warpgroup.
    prefetches = lab.prefetch_base and not interpret and p == phases - 1

    def prefetch(step, due=None):
      mine = wg == WARPGROUPS - 1
      pl.when(mine if due is None else jnp.logical_and(mine, due))(
          lambda: sp.prefetch_base(base_g, step, block, tiles=tiles, vocab=vocab,
                                   batch=batch))

    def base_of(ordinal):
      """The base logits of the phase's ``ordinal``-th tile of the walk (past the walk,
      of its last step: a valid, unused load; by TMA: none): loaded, or (async copies)
      copied into that ordinal's slot, the slot returned."""
      step = jnp.minimum(lax.div(ordinal, count), steps - 1)   # (ordinal >= 0)
      tile = p + lax.rem(ordinal, count) * phases
      with jax.named_scope("base"):
        if base_slots and no_base:   # (timing only: the slots read as they are)
          return None if by_tma else sp.row_array(lax.rem(ordinal, base_slots))
        if by_tma:
          slot = wg * base_slots + lax.rem(ordinal, base_slots)
          start_at = start(tile)
          for rb in range(plan.request_blocks):   # (each block's live rows, static)
            rows = min(sp.REQUESTS, batch - rb * sp.REQUESTS)
            due = jnp.logical_and(ordinal < steps * count, lax.div(wg, phases) == rb)
            pl.when(due)(functools.partial(
                plgpu.copy_gmem_to_smem,
                base_g.at[pl.ds(rb * sp.REQUESTS, rows), step, pl.ds(start_at, sp.TILE)],
                base_s.at[slot, pl.ds(0, rows)], base_bar.at[slot]))
          return None
        if base_slots:
          return sp.copy_base(base_g, base_s, lax.rem(ordinal, base_slots), step, block,
                              tile, tiles=tiles, vocab=vocab, batch=batch, phases=phases,
                              slots=base_slots, rotate=rotate,
                              thread_rows=spec.w2_order == "thread_rows")
        return sp.load_base(base_g, step, block, tile, tiles=tiles, vocab=vocab,
                            batch=batch, phases=phases, wg=wg, interpret=interpret,
                            loads=not no_base, rotate=rotate)

    def step_body(step, carry):
      # ``pending``: the base logits of the step's first tile, loaded (into registers)
      # before the last step's exchange; each tile's next are loaded under its WGMMA.
      flags, pending = carry
      with jax.named_scope("tok_wait"):
        @pl.when(jnp.logical_not(leader))
        def _():
          plgpu.barrier_wait(tok_bar)
      if prefetches:
        prefetch(step + 1, step + 1 < steps)
      with jax.named_scope("gather"):
        a, s_lo = sp.gather(tok_s, w1_g, s_lo_g, rank=rank, phases=phases, wg=wg,
                            interpret=interpret,
                            fragment_order=spec.w1_order == "fragments", rotate=rotate)
      if interpret:   # (interpreted, a WGMMA reads no registers: the tile)
        interpreted[0][wg] = a
        a = interpreted[0].at[wg]
      sampled = None if spec.greedy else sp.sampling_state(
          *sampling_g, step, rows=batch, row_offset=spec.row_offset, phases=phases, wg=wg,
          interpret=interpret, rotate=rotate)

      @pl.when(step == 0)
      @jax.named_scope("first_wait")
      def _():
        plgpu.barrier_wait(scale_bar)
        for k in range(res):   # (a barrier a resident tile: phases hold unequal counts)
          plgpu.barrier_wait(res_bar.at[base_slot + k])

      def tile_body(position, carry):
        """One tile: its WGMMA, the next tile's base logits loaded under it, its
        streamed slot refilled, its logits folded into the running best."""
        best, pending = carry
        before = streamed_before(position)
        tile = p + position * phases
        entry = step * streamed + before
        slot = ring_slot(entry)
        if streamed:
          is_streamed = streamed_before(position + 1) > before
          with jax.named_scope("ring_wait"):
            pl.when(is_streamed)(lambda: plgpu.barrier_wait(ring_bar.at[p * stages + slot]))
          w_index = jnp.where(is_streamed, base_slot + res + slot,
                              base_slot + position - before)
        else:
          w_index = base_slot + position

        def tile_base(pending):
          """The tile's base logits for the fold: its slot (by TMA: its copy waited
          for), or without slots the registers loaded a tile ahead."""
          if not base_slots:
            return pending
          slot_now = lax.rem(step * count + position, base_slots)
          slot_base = sp.row_array(slot_now)
          if by_tma and not no_base:
            with jax.named_scope("base_wait"):
              plgpu.barrier_wait(base_bar.at[wg * base_slots + slot_now])
          return slot_base

        def fold(acc, best, pending, pairs=(0, sp.TILE // 8)):
          with jax.named_scope("fold"):
            return sp.fold_tile(acc, pending, s_lo, scale_s.at[tile], best, start(tile),
                                interpret=interpret,
                                column_pairs=1 if lab.timing_ablation == "fold" else None,
                                base_s=base_s, slots=base_slots,
                                copies_pending=copies_ahead, tma_slots=by_tma,
                                rotate=rotate, live_rows=live_rows, phases=phases,
                                sampled=sampled, pairs=pairs,
                                thread_rows=spec.w2_order == "thread_rows",
                                vector_reads=lab.base_vector_reads)

        def product(acc_ref):
          if lab.timing_ablation != "mma":
            with jax.named_scope("mma"):
              tile_rows = (w_s.at[w_index, pl.ds(0, NARROW_MMA_ROWS)] if narrow else
                           w_s.at[w_index])
              plgpu.wgmma(acc_ref, a, tile_rows.T)
          # The next tile's (the next step's first after the last), or with async
          # copies the one ``copies_ahead`` on (by TMA: once the WGMMA is done).
          upcoming = None if by_tma else base_of(step * count + position + copies_ahead)
          with jax.named_scope("mma_wait"):
            return plgpu.wgmma_accumulator_load(acc_ref), upcoming
        acc, upcoming = pl.run_scoped(
            product, plgpu.ACC((2 * sp.REQUESTS, NARROW_MMA_ROWS if narrow else sp.TILE),
                               jnp.int32))
        if by_tma:
          base_of(step * count + position + copies_ahead)
        if streamed:   # the slot read (its WGMMA waited for): refill it
          total = steps * streamed
          refill_due = jnp.logical_and(is_streamed, entry + stages < total)
          refill_now = jnp.logical_and(
              is_streamed, jnp.logical_and(entry >= 0, entry + stages < total))

          def refill():
            if shared_ring:
              with jax.named_scope("free_wait"):
                plgpu.barrier_wait(free_bar.at[p * stages + ring_slot(entry)])
            copy_entry(entry + stages)
          if shared_ring:   # (only where a refill follows: no arrival left unobserved)
            pl.when(refill_due)(functools.partial(
                plgpu.barrier_arrive, free_bar.at[p * stages + slot]))
          with jax.named_scope("refill"):
            pl.when(jnp.logical_and(issuer, refill_now))(refill)
        pending = tile_base(pending)
        best = fold(acc, best, pending,
                    **(dict(pairs=(0, NARROW_MMA_ROWS // 8)) if narrow else {}))
        return best, pending if by_tma else upcoming

      best, pending = lax.fori_loop(0, count, tile_body,
                                    (sp.initial_best(interpret), pending))
      with jax.named_scope("bests"):
        sp.store_bests(best, best_value_s, best_index_s, best_nan_s, wg=wg,
                       interpret=interpret, rotate=rotate)
      plgpu.barrier_arrive(step_bar)
      if p:
        return flags, pending
      with jax.named_scope("exchange"):
        flags = lax.cond(leader, functools.partial(exchange, step), lambda f: f, flags)
      return flags, pending

    if prefetches:
      prefetch(0)
    # The walk's first tiles' base logits (async copies: ``copies_ahead`` of them).
    if by_tma and partly_filled:
      sp.zero_unread_rows(base_s, batch=batch, phases=phases, slots=base_slots,
                          rotate=rotate)
    first = base_of(0)
    for ordinal in range(1, copies_ahead):
      base_of(ordinal)
    flags, _ = lax.fori_loop(0, steps, step_body,
                             (jnp.int32(0), sp.row_array(0) if by_tma else first))
    if base_slots and not by_tma:   # (copies issued past the walk land before exit)
      sp.wait_copies()

    status = flags | jnp.where(leader, block_status(), 0)
    if not status_in_kernel:
      status_g[block * WARPGROUPS + wg] = status
    else:
      @pl.when(leader & (block == 0))
      def _():
        total = status
        for i, bit in enumerate(KERNEL_STATUS_BITS if not interpret else ()):  # (one block)
          total = total | jnp.where(pl.semaphore_read(bit_counts_g.at[i]) > 0, bit, 0)
        status_g[0] = total

  def block_status():
    """The block's status bits in shared memory (the leader's; read after the step's
    barrier): a NaN seen, the first tokens', a time-out."""
    return (nan_s[1] | jnp.where(nan_s[0] > 0, STATUS_NAN_LOGITS, 0)
            | jnp.where(nan_s[2] > 0, STATUS_SYNC_TIMEOUT, 0))

  def count_status_bits(flags):
    """The leader's last step, its keys published: one added to the counter of each
    status bit the block holds. (Its threads first meet: a NaN flag set by another
    thread's publish must be seen by the one that signals.)"""
    sp.warpgroup_sync()
    held = flags | block_status()
    for i, bit in enumerate(KERNEL_STATUS_BITS):
      pl.when((held & bit) != 0)(functools.partial(
          plgpu.semaphore_signal, bit_counts_g.at[i], 1, memory_scope="gpu"))

  def exchange(step, flags):
    """Warpgroup 0's end of a step: each request's winner over the warpgroups and the
    grid, the tokens to ``tok_s`` (block 0: to ``tok_g``), shown to the others."""
    with jax.named_scope("step_wait"):
      plgpu.barrier_wait(step_bar)
    if interpret:   # one block: the winners from the warpgroups' bests
      token = _interpreted_winners(best_value_s, best_index_s, best_nan_s, nan_s,
                                   phases=phases, batch=batch)
      ids = jnp.arange(MAX_BATCH, dtype=jnp.int32)
      tokens = jnp.where(ids < batch, jnp.clip(token, 0, vocab - 1), 0)
      tok_s[...] = tokens
      tok_g[:, step] = tokens[:batch]
    else:
      step_slots = keys_g.at[pl.ds(step * step_words, step_words)]
      with jax.named_scope("publish"):
        sp.publish_bests(best_value_s, best_index_s, best_nan_s, nan_s, step_slots,
                         rows=batch, phases=phases)
      if status_in_kernel:   # (released by the step's signal below)
        pl.when(step == steps - 1)(functools.partial(count_status_bits, flags))
      with jax.named_scope("grid_sync"):
        timed_out = grid_sync.signal_and_poll(sem, plan.num_blocks, step,
                                              spin_limit=spec.spin_limit)
      flags = flags | jnp.where(timed_out > 0, STATUS_SYNC_TIMEOUT, 0)
      with jax.named_scope("tokens"):
        sp.tokens_from_keys(step_slots, tok_s, tok_g, step, rows=batch, vocab=vocab)
    with jax.named_scope("tokens"):
      plgpu.commit_smem()
      pl.when(step + 1 < steps)(functools.partial(plgpu.barrier_arrive, tok_bar))
    return flags

  # Prologue: the block's row scales (warpgroup 0), the first tokens, the NaN flag.
  @pl.when(leader)
  def _():
    for tile in range(tiles):
      plgpu.copy_gmem_to_smem(w2_scale_g.at[pl.ds(start(tile), sp.TILE)],
                              scale_s.at[tile], scale_bar)
    for k in range(3):
      nan_s[k] = jnp.int32(0)
    plgpu.commit_smem()   # (the zeros before the threads' flag below)
    sp.first_tokens(first_g, tok_s, nan_s, rows=batch, vocab=vocab,
                    status=STATUS_TOKEN_OUT_OF_RANGE, interpret=interpret)
    plgpu.commit_smem()
    plgpu.barrier_arrive(tok_bar)

  for p in range(phases):
    pl.when(lax.rem(wg, phases) == p)(functools.partial(phase_body, p))


def _interpreted_winners(value_s, index_s, nan_s, flag_s, *, phases: int, batch: int):
  """One block (interpret mode): each request's best over the warpgroups that served
  it, as ``publish_bests`` picks it; a NaN seen sets ``flag_s[0]``."""
  values, indices, nans = value_s[...], index_s[...], nan_s[...]   # [4, 32]
  blocks = WARPGROUPS // phases
  best_v = values.reshape(blocks, phases, sp.REQUESTS)
  best_i = indices.reshape(blocks, phases, sp.REQUESTS)
  value, index = best_v[:, 0], best_i[:, 0]
  for k in range(1, phases):
    better = (best_v[:, k] > value) | ((best_v[:, k] == value) & (best_i[:, k] < index))
    value = jnp.where(better, best_v[:, k], value)
    index = jnp.where(better, best_i[:, k], index)
  index = index.reshape(-1)
  nan = nans.reshape(blocks, phases, sp.REQUESTS).max(axis=1).reshape(-1)
  live = jnp.arange(blocks * sp.REQUESTS) < batch
  flag_s[0] = jnp.maximum(flag_s[0], jnp.where(live, nan, 0).max())
  return jnp.pad(index, (0, MAX_BATCH - index.shape[0]))


def stacked_walk(spec: StackedSpec, w2, base_logits, w1, first_tokens, w2_scale, w1_scale,
                 sampling=None):
  """Launch the kernel once; returns (tokens [B, K] int32, status int32 scalar).
  ``w2`` [V, r] int8 with per-row ``w2_scale`` [V]; ``w1`` W1's interleaved int8 planes
  [2V, r] with their ``s_lo`` ``w1_scale`` [V] (``wts_jax.int8_state``); ``base_logits``
  [B, K, V] bf16. A sampled walk (``spec.greedy`` False): ``sampling`` = (score scale
  [B] f32, noise on [B] bool, seed uint32[2]), as ``reference.select_tokens`` takes
  them."""
  if spec.greedy != (sampling is None):
    raise ValueError(f"greedy={spec.greedy} with sampling operands "
                     f"{'given' if sampling is not None else 'missing'}")
  plan, batch, steps = spec.plan, spec.batch, spec.steps
  vocab, rank = plan.vocab_size, plan.rank
  if (w2.dtype != jnp.int8 or w2.shape != (vocab, rank) or w1.dtype != jnp.int8
      or w1.shape != (2 * vocab, rank) or base_logits.dtype != jnp.bfloat16
      or base_logits.shape != (batch, steps, vocab)):
    raise ValueError(
        f"the stacked walk needs W2 [{vocab}, {rank}] int8, W1 planes [{2 * vocab}, {rank}] "
        f"int8 and bf16 base logits [{batch}, {steps}, {vocab}] (got {w2.dtype}"
        f"{list(w2.shape)}, {w1.dtype}{list(w1.shape)}, {base_logits.dtype}"
        f"{list(base_logits.shape)})")
  w1 = w1.reshape(vocab, 2 * rank)   # a token's two planes side by side
  extra = ()
  if sampling is not None:
    score_scale, noise_on, seed = sampling
    extra = (score_scale.astype(jnp.float32), noise_on.astype(jnp.int32),
             seed.astype(jnp.uint32))
  if spec.interpret:   # whole blocks of 32 requests: the interpreted loads take 32 rows
    padding = plan.request_blocks * sp.REQUESTS - batch
    base_logits = jnp.pad(base_logits, ((0, padding), (0, 0), (0, 0)))
    if extra:
      extra = (jnp.pad(extra[0], (0, padding), constant_values=1.0),
               jnp.pad(extra[1], (0, padding)), extra[2])
  scratch = [
      plgpu.SMEM((plan.slots, sp.TILE, rank), jnp.int8, transforms=_w2_transforms(1, rank)),
      plgpu.SMEM((plan.tiles, sp.TILE), jnp.float32),
      plgpu.SMEM((MAX_BATCH,), jnp.int32),
      plgpu.SMEM((WARPGROUPS, sp.REQUESTS), jnp.float32),
      plgpu.SMEM((WARPGROUPS, sp.REQUESTS), jnp.int32),
      plgpu.SMEM((WARPGROUPS, sp.REQUESTS), jnp.int32),
      plgpu.SMEM((3,), jnp.int32),   # NaN seen, first tokens' status, exchange timed out
      plgpu.Barrier(num_arrivals=1, num_barriers=plan.slots),
      plgpu.Barrier(num_arrivals=1, num_barriers=plan.phases * max(1, plan.ring_stages)),
      plgpu.Barrier(num_arrivals=plan.request_blocks,
                    num_barriers=plan.phases * max(1, plan.ring_stages)),
      plgpu.Barrier(num_arrivals=plan.tiles, num_barriers=1),
      plgpu.Barrier(num_arrivals=WARPGROUPS, num_barriers=1),
      plgpu.Barrier(num_arrivals=1, num_barriers=1),
  ]
  if plan.base_slots and not spec.interpret and plan.base_copies == "tma":
    scratch += [plgpu.SMEM((WARPGROUPS * plan.base_slots, sp.REQUESTS, sp.TILE),
                           jnp.bfloat16, transforms=sp.TMA_BASE_TRANSFORMS),
                plgpu.Barrier(num_arrivals=1, num_barriers=WARPGROUPS * plan.base_slots)]
  elif plan.base_slots and not spec.interpret:
    scratch.append(plgpu.SMEM((WARPGROUPS * plan.base_slots * sp.BASE_SLOT_BYTES,),
                              jnp.int8))
  if spec.interpret:
    scratch.append(plgpu.SMEM((WARPGROUPS, 2 * sp.REQUESTS, rank), jnp.int8,
                              transforms=_w2_transforms(1, rank)))
  kernel = plgpu.kernel(
      functools.partial(_kernel, spec=spec),
      out_type=(jax.ShapeDtypeStruct((batch, steps), jnp.int32),
                jax.ShapeDtypeStruct((1,) if spec.status == "kernel"
                                     else (plan.num_blocks * WARPGROUPS,), jnp.int32)),
      grid=(plan.num_blocks,), grid_names=("blocks",),
      num_threads=WARPGROUPS, thread_name="wg",
      scratch_types=scratch,
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Lane,
          **(dict(profile_space=spec.lab.profile_space, profile_dir=spec.lab.profile_dir)
             if spec.lab.profile_dir else {})),
      interpret=_interpret_params() if spec.interpret else None,
  )
  tokens, status = kernel(w2, w2_scale.astype(jnp.float32), base_logits, w1,
                          w1_scale.astype(jnp.float32), first_tokens.astype(jnp.int32), *extra)
  if spec.status == "kernel":
    return tokens, status.reshape(())
  return tokens, lax.reduce(status, jnp.int32(0), lax.bitwise_or, (0,))
