"""The plan of the batched Mosaic GPU walk (``batched/kernel.py``): B rows on the
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
``warpgroups`` > 1 splits a block's chunks between that many warpgroups, each with its
own resident chunks, rings and accumulators, so one's WGMMA, waits and refills overlap
the other's epilogue (a block's chunk loop is a chain of latencies, not of throughput);
the counts of a plan (resident, ring and base slots) are a warpgroup's.
Pure Python on static shapes: the budget checks happen here.
"""

from __future__ import annotations

import dataclasses

from wts_jax.pallas.mosaic_plan import (CHUNK_ROWS, SMEM_ALIGNMENT, SMEM_RESERVED_BYTES,
                                        chunks_per_block, row_swizzle)
from wts_jax.walk_config import W2_WIDENINGS

BATCH_TILE = 64          # WGMMA M: the batch rows of one launch (unused rows are zeros)
BATCH_ALIGN = 8          # batch rows are padded to whole 8-row TMA tiles of base logits
Z_ROW_PAD_BYTES = 16     # z staging rows padded so the 8 rows a warp reads hit 8 bank groups
DEFAULT_RING_STAGES = 2
WGMMA_MAX_N = 256
# The gated head's ring: its four G_e chunks a step stream through it too, and a third
# slot measured faster than a resident chunk beside two.
GATED_RING_STAGES = 3
DEFAULT_BASE_STAGES = 3
# The gated head's gate from its table: the batch on N, up to 32 rows a launch ("auto"
# too: at 32 rows, its staging leaving one W2 ring slot a warpgroup, it still measured
# faster than the split gate, greedy and sampled, bf16 and int8).
GATE_TABLE_MAX_ROWS = 32
# The rnn head's joint table: its staging (3 KB a row), the state (1 KB a row) and the
# owners' operand tile leave no W2 slot past 16 rows.
JOINT_TABLE_MAX_ROWS = 16
# int8 planes with the batch on N stage z's rows (r bytes a plane) into a tile swizzled at
# min(128, r) bytes: at r = 64 Mosaic finds no bank-conflict-free copy layout for that
# staging and does not lower the kernel, so such walks go on M.
PLANES_ON_N_MIN_RANK = 128


def padded_batch(batch: int) -> int:
  return -(-batch // BATCH_ALIGN) * BATCH_ALIGN


def staged_z_rows(*, batch_axis: str, z_pair: bool, token_table: bool, batch_rows: int,
                  rank: int, itemsize: int) -> int:
  """Rows of z staging and of its WGMMA tile (``BatchedPlan.staged_rows``): 64 on M (the
  WGMMA's A operand), the batch rows (rounded: ``staged_rows_on_n``) on N; 64 for a hi +
  lo pair on either axis (the gated and rnn updates are WGMMAs with the batch on M)
  unless z comes from a token table."""
  if batch_axis == "m" or (z_pair and not token_table):
    return BATCH_TILE
  return staged_rows_on_n(batch_rows, rank, itemsize)


def resident_rows_a_unit(*, recurrent: bool, joint_table: bool) -> int:
  """Rows of the head's weights a block keeps for each unit it owns: the gated head's
  G_e row, the rnn head's J_s and J_e rows of the gate, candidate and output (J_s rows
  only with the joint table)."""
  return 3 if joint_table else 6 if recurrent else 1


def staged_rows_on_n(batch_rows: int, rank: int, itemsize: int) -> int:
  """The rows of z staged with the batch on N: the batch rows, rounded up to what the
  register round trip into the swizzled tile moves whole (Mosaic's shared-to-global copy
  layout gives each warp 4 tiles of [8 rows, one swizzle]; a row of z spans
  ``rank · itemsize / swizzle`` of them)."""
  row_tiles, col_tiles = -(-batch_rows // 8), rank * itemsize // row_swizzle(rank, itemsize)
  while not (row_tiles % 4 == 0 or (row_tiles % 2 == 0 and col_tiles % 2 == 0)
             or col_tiles % 4 == 0):
    row_tiles += 1
  return min(BATCH_TILE, row_tiles * 8)


@dataclasses.dataclass(frozen=True)
class BatchedPlan:
  """A launch of the batched Mosaic kernel (all sizes static)."""

  num_blocks: int
  chunks: int               # 64-row chunks of W2 per block
  resident_chunks: int      # kept in shared memory for the whole walk
  ring_stages: int          # W2 slots of the streaming ring
  base_stages: int          # slots of the base-logit ring (runs on across steps)
  vocab_size: int
  rank: int
  batch_rows: int           # B padded to BATCH_ALIGN (<= BATCH_TILE)
  smem_bytes: int
  base_itemsize: int = 2
  w2_itemsize: int = 2
  int8_state: bool = False  # int8 W2 × z as two int8 planes (``wts_jax.int8_state``)
  # An int8 W2 met by a bf16 z (or a hi + lo pair): its values come widened to bf16
  # (exact: |q| <= 127) and each chunk's accumulator is scaled by W2's per-row scales in
  # the epilogue, as the int8 planes' is.
  w2_row_scale: bool = False
  # Where that int8 W2 is widened (``W2_WIDENINGS``): "xla", a bf16 copy before the
  # launch; or in the kernel, the int8 chunk streamed (half the bytes) and widened after
  # it lands — "registers", loaded into the WGMMA's A operand and converted there, or
  # "smem", converted into a bf16 tile of the warpgroup's that the WGMMA reads (what
  # Pallas interpret mode runs). In the kernel it needs no WGMMA left in flight past its
  # chunk, and "registers" the batch on N (there the chunk is the A operand).
  w2_widening: str = "xla"
  snake: bool = True
  batch_axis: str = "m"     # "m": [B, r] x [r, 64] a chunk; "n": [64, r] x [r, B]
  warpgroups: int = 1       # warpgroups sharing a block's chunks (each its own share)
  # One more warpgroup that issues every ring and base refill once the consumers release
  # the slot (mbarrier arrivals), so no computing warp issues a copy in the chunk loop.
  producer: bool = False
  # The gated head: z = σ(hoisted_k + G_e e) ⊙ e in fp32 meets W2 as a hi + lo bf16 pair
  # (two WGMMAs a chunk into one accumulator, or one: ``pair_on_n``); G_e's 64-row chunks stream through the
  # leader's W2 ring ahead of each step's W2 chunks.
  gated: bool = False
  # The gated head's gate split over the blocks: each owns ``update_units`` of its units
  # (their G_e rows resident), publishes its slice of z to global memory, and every block
  # reads the whole z back after a second grid barrier (else every block computes all of
  # it from G_e streamed through its ring).
  gate_split: bool = False
  # The gated head's gate from its table (``wts_jax.gate_table``), batch on N: each row's
  # gather brings [e ; G_e e as fp32 bit halves] in one copy, and the leader forms z =
  # σ(hoisted_k + G_e e) ⊙ e elementwise while staging it — no G_e stream, no split, no
  # second barrier. z's hi + lo halves share one WGMMA (``pair_on_n``).
  gate_table: bool = False
  # The rnn head, split the same way: a block owns ``update_units`` of the state's units
  # (their rows of J_s and J_e resident), advances them for every row, publishes their
  # state and z; every block reads z back after the second barrier. ``gated`` is False.
  recurrent: bool = False
  # The rnn head with its joint table (``wts_jax.joint_table``), batch on N, one
  # warpgroup: each row's gather brings J_e e (fp32 bit halves); every block reads the
  # J_s s_{k-1} that the owners of the state's units published during the last step
  # (before its token barrier) and advances the whole state elementwise — no second
  # barrier. The owners then compute J_s s_k for their units (WGMMAs against their
  # resident J_s rows) and publish it for the next step. z's halves share one WGMMA.
  joint_table: bool = False
  # Warp-level copy issue: the step's z rows gathered by the leader's four warps, each
  # its share of the rows with no warpgroup barrier between copies (``plgpu.warp_map``;
  # else one thread issues every row's copy, a warpgroup barrier before each; set by the
  # planner where it measured faster, ``auto_warp_gather``).
  warp_gather: bool = False
  # Chunks a group whose WGMMAs overlap: within a group each chunk's WGMMA is issued
  # before the previous chunk's epilogue, so the tensor cores run while the warpgroup
  # adds the base logits and folds the scores; the last of a group waits for its own
  # (0 or 1: every chunk waits for its own). Set by the planner where it measured faster
  # (``auto_overlap_chunks``).
  overlap_chunks: int = 0
  # Two computing warpgroups with the batch on N: warpgroup 1 hands its per-element
  # bests over unreduced ([64, rows] value, index and NaN tiles in shared memory) and the
  # leader reduces over the vocabulary once a step for both, instead of each reducing
  # its own in turn (Mosaic's cross-warp reductions share one scratch buffer) before the
  # leader merges the two per-row results. A planner option (its tiles are shared memory
  # the plan counts), set where it measured faster (``auto_merge_tiles``).
  merge_tiles: bool = False

  def __post_init__(self):
    if self.w2_widening not in W2_WIDENINGS:
      raise ValueError(f"w2_widening={self.w2_widening!r} must be one of {W2_WIDENINGS}")
    if self.w2_row_scale and (self.int8_state
                              or self.w2_itemsize != (1 if self.widened_in_kernel else 2)):
      raise ValueError("w2_row_scale is an int8 W2 widened to bf16 (in the kernel from "
                       "int8, else from a bf16 copy), not the int8 planes'")
    if self.widened_in_kernel and (not self.w2_row_scale or self.overlap_chunks
                                   or self.gate_chunks):
      raise ValueError("an int8 W2 widened in the kernel needs its row scales, no "
                       "overlapped chunks and, for the gated head, the gate split (G_e "
                       "streams through a bf16 ring otherwise)")
    if self.w2_widening == "registers" and self.batch_axis != "n":
      raise ValueError("an int8 W2 widened into registers needs the batch on N (the "
                       "chunk is the WGMMA's A operand)")
    if self.overlap_chunks > 1 and self.streamed_chunks and self.ring_stages < 2:
      raise ValueError(f"overlap_chunks={self.overlap_chunks} needs a W2 ring of 2 or more "
                       f"slots (ring_stages={self.ring_stages}): a chunk is awaited before "
                       "the one before it releases its slot, so one slot would deadlock")
    if self.merge_tiles and (self.warpgroups != 2 or self.batch_axis != "n"):
      raise ValueError("merge_tiles needs two computing warpgroups with the batch on N")
    if self.gate_split and not self.gated:
      raise ValueError("gate_split is the gated head's")
    if self.gate_table and (not self.gated or self.gate_split or self.batch_axis != "n"):
      raise ValueError("gate_table is the gated head's gate, not split, with the batch on N")
    if self.recurrent and (self.gated or self.int8_state or self.producer):
      raise ValueError("the rnn head's batched plan needs a bf16 W2 and no producer")
    if self.joint_table and (not self.recurrent or self.batch_axis != "n"
                             or self.warpgroups != 1):
      raise ValueError("joint_table is the rnn head's, with the batch on N and one "
                       "warpgroup")
    if self.gated and (self.int8_state or (self.producer and not self.gate_table)
                       or (self.ring_stages < 1 and self.gate_chunks)):
      raise ValueError("the gated head's batched plan needs a bf16 W2 and, computing its "
                       "gate from G_e, no producer (a redundant gate streams G_e through a "
                       "W2 ring of at least one slot)")

  @property
  def widened_in_kernel(self) -> bool:
    """An int8 W2 streamed as int8 and widened to bf16 in the kernel."""
    return self.w2_widening != "xla"

  @property
  def z_itemsize(self) -> int:
    """Bytes of a staged z element: int8 planes, else bf16 (hi + lo pairs included)."""
    return 1 if self.int8_state else 2

  @property
  def scaled(self) -> bool:
    """Each chunk's accumulator is scaled by W2's per-row scales (an int8 W2)."""
    return self.int8_state or self.w2_row_scale

  @property
  def wg_chunks(self) -> int:
    """A warpgroup's chunks (``chunks`` is a multiple of ``warpgroups``)."""
    return self.chunks // self.warpgroups

  @property
  def streamed_chunks(self) -> int:
    """A warpgroup's chunks streamed each step."""
    return self.wg_chunks - self.resident_chunks

  @property
  def z_pair(self) -> bool:
    """z meets W2 as a hi + lo bf16 pair (two tiles, two WGMMAs a chunk into one
    accumulator, or one WGMMA: ``pair_on_n``): the gated and rnn heads' fp32 z."""
    return self.gated or self.recurrent

  @property
  def pair_on_n(self) -> bool:
    """Batch on N: z's two halves (the int8 planes, or a split update's hi + lo pair) side
    by side on the WGMMA's N, so a chunk is one WGMMA that reads its W2 tile from shared
    memory once, not two (at N <= 64 the tile's reads, not the columns, set a WGMMA's
    time). The pair needs both halves' rows in one 64-row tile: 2 · rows <= 64."""
    if self.batch_axis != "n":
      return False
    return (self.int8_state or self.token_table
            or (self.split and 2 * self.batch_rows <= BATCH_TILE))

  @property
  def lo_offset(self) -> int:
    """With ``pair_on_n``: the tile row (and accumulator column) where z's second half
    starts — after the staged rows of the first plane (or of a table gate's hi half), or
    after the batch rows of a split update's copied hi half."""
    return self.staged_rows if self.int8_state or self.token_table else self.batch_rows

  @property
  def gate_chunks(self) -> int:
    """G_e's 64-row chunks the leader streams ahead of each step's W2 chunks (a
    redundant gate)."""
    redundant = self.gated and not (self.gate_split or self.gate_table)
    return self.rank // CHUNK_ROWS if redundant else 0

  @property
  def token_table(self) -> bool:
    """z staged from each token's gathered row of a table (int16 words): the gated head's
    gate table or the rnn head's joint table."""
    return self.gate_table or self.joint_table

  @property
  def split(self) -> bool:
    """The head's update split over the blocks, a second grid barrier a step (a split
    gate, or the rnn head without its joint table)."""
    return self.gate_split or (self.recurrent and not self.joint_table)

  @property
  def update_units(self) -> int:
    """A split update, or the joint table's J_s s: the units a block owns
    (``split_update_units``)."""
    return (split_update_units(self.rank, self.num_blocks)
            if self.split or self.joint_table else 0)

  @property
  def resident_update_rows(self) -> int:
    """Rows of the head's weights a block keeps for the units it owns
    (``resident_rows_a_unit``)."""
    return self.update_units * resident_rows_a_unit(recurrent=self.recurrent,
                                                    joint_table=self.joint_table)

  @property
  def base_rows(self) -> int:
    """Rows of a base tile: the WGMMA's 64 M rows when the batch is on M; the batch rows
    only when it is on N."""
    return self.batch_rows if self.batch_axis == "n" else BATCH_TILE

  @property
  def staged_rows(self) -> int:
    """Rows of z staging and of its WGMMA tile (``staged_z_rows``)."""
    return staged_z_rows(batch_axis=self.batch_axis, z_pair=self.z_pair,
                         token_table=self.token_table, batch_rows=self.batch_rows,
                         rank=self.rank, itemsize=self.z_itemsize)

  @property
  def resident_fraction(self) -> float:
    """The share of W2 that stays in shared memory for the whole walk."""
    return min(1.0, self.resident_chunks * self.warpgroups * self.num_blocks * CHUNK_ROWS
               / self.vocab_size)

  @property
  def z_row_elements(self) -> int:
    """Staged elements a z row, its bank padding left out: a bf16 W1 row (r), an int8
    token's two planes (2r), a gate table's row (3r words) or a joint table's (6r)."""
    return (self.z_row_bytes - Z_ROW_PAD_BYTES) // self.z_itemsize

  @property
  def z_row_bytes(self) -> int:
    """A z staging row: a bf16 W1 row, an int8 token's two planes side by side, or a
    token's gate table row (three parts of 16-bit words) or joint table row (six)."""
    return z_row_bytes(self.rank, gate_table=self.gate_table, joint_table=self.joint_table)

  def describe(self) -> str:
    chunk_kb = CHUNK_ROWS * self.rank * self.w2_itemsize / 1024
    return (f"batched Mosaic GPU walk: {self.num_blocks} blocks × {self.chunks} chunks of "
            f"{CHUNK_ROWS} rows; {self.resident_chunks} resident, "
            f"{self.streamed_chunks} streamed per step through a {self.ring_stages}-slot "
            f"ring ({chunk_kb:.0f} KB a slot); base logits through a {self.base_stages}-"
            f"slot ring; {self.batch_rows} batch rows on the WGMMA's "
            f"{self.batch_axis.upper()}"
            + (f"; {self.warpgroups} warpgroups a block, the counts a warpgroup's"
               if self.warpgroups > 1 else "")
            + ("; a producer warpgroup issues the refills" if self.producer else "")
            + ("; z rows gathered by four warps" if self.warp_gather else "")
            + ("; each row's s_lo loaded by a thread of its own" if self.int8_state
               else "")
            + (f"; WGMMAs overlap epilogues in groups of {self.overlap_chunks} chunks"
               if self.overlap_chunks > 1 else "")
            + ("; warpgroup 1's bests merged unreduced" if self.merge_tiles else "")
            + ("; z as two int8 planes (int8 x int8 WGMMA)" if self.int8_state else "")
            + ("; an int8 W2 widened to bf16, its row scales in the epilogue"
               if self.w2_row_scale else "")
            + (f" (widened in the kernel, through {self.w2_widening})"
               if self.widened_in_kernel else "")
            + ("; z's two halves side by side on N, one WGMMA a chunk" if self.pair_on_n
               else "")
            + ("; gated head: z as a hi + lo bf16 pair, "
               + (f"the gate split over the blocks ({self.update_units} units a block)"
                  if self.gate_split else "the gate from its table" if self.gate_table
                  else "G_e streamed by the leader")
               if self.gated else "")
            + (f"; rnn head from its joint table (J_s s of {self.update_units} units a "
               "block published a step ahead), z as a hi + lo bf16 pair"
               if self.joint_table else
               f"; rnn head split over the blocks ({self.update_units} units a block), z "
               "as a hi + lo bf16 pair" if self.recurrent else ""))


def z_row_bytes(rank: int, *, gate_table: bool = False, joint_table: bool = False) -> int:
  """Bytes of a z staging row (``BatchedPlan.z_row_bytes``): r bf16 (or two int8 planes),
  3r 16-bit words for a gate table's row, 6r for a joint table's, then the bank
  padding."""
  return rank * 2 * (3 if gate_table else 6 if joint_table else 1) + Z_ROW_PAD_BYTES


def split_update_units(rank: int, num_blocks: int) -> int:
  """The gate's units a block owns when the gate is split: the fewest that a WGMMA's N
  takes (a multiple of 8) and that divide r, with every unit owned by some block."""
  need = -(-rank // num_blocks)
  return next(units for units in range(8, rank + 1, 8)
              if rank % units == 0 and units >= need)


def warpgroup_chunks(vocab_size: int, num_blocks: int, warpgroups: int) -> int:
  """A warpgroup's share of a block's chunks, rounded up to whole shares (the extra
  chunks' clamped starts repeat rows)."""
  return -(-chunks_per_block(vocab_size, num_blocks) // warpgroups)


def _aligned(nbytes: int) -> int:
  return -(-nbytes // SMEM_ALIGNMENT) * SMEM_ALIGNMENT


def fixed_bytes(*, chunks: int, rank: int, base_stages: int, base_itemsize: int,
                scaled: bool, int8_state: bool = False, batch_axis: str = "m",
                base_rows: int = BATCH_TILE, warpgroups: int = 1,
                staged_rows: int = BATCH_TILE, z_pair: bool = False,
                gate_rows: int = 0, state_units: int = 0, merge_tile_rows: int = 0,
                widen_tiles: int = 0, gate_table: bool = False,
                joint_table: bool = False) -> int:
  """Shared memory besides the W2 slots: z staging [rows, 2r + pad] bytes and the
  swizzled WGMMA tile [rows, 2r] bytes (``BatchedPlan.staged_rows``: 64 on M, about the
  batch on N), each warpgroup's base ring [stages, base_rows, 64], an int8 W2's per-row
  scales [chunks, 64] f32, the tokens [64] and exchange keys [2, 64]; with int8 planes
  each row's s_lo [64] f32; with warpgroups the merge slots [warpgroups, 64] f32 +
  i32; z as a hi + lo pair has two tiles; a split update's resident weight rows
  [gate_rows, r] bf16 and its timeout flag and barriers (one more aligned allocation),
  and the rnn head's own units' state [64, state_units] f32; with ``merge_tiles``
  warpgroup 1's unreduced bests, three [64, merge_tile_rows] 4-byte tiles; an int8 W2
  widened through shared memory, a bf16 chunk tile [64, r] a warpgroup
  (``widen_tiles``); a gate table's staging rows are three times as wide, a joint
  table's six times, and the joint table adds the state [staged rows, r] f32 and the
  owners' operand tile of it [64, r] bf16."""
  z_stage = (staged_rows * z_row_bytes(rank, gate_table=gate_table, joint_table=joint_table)
             + (2 if z_pair else 1) * _aligned(staged_rows * rank * 2))
  joint_state = (_aligned(staged_rows * rank * 4) + _aligned(BATCH_TILE * rank * 2)
                 if joint_table else 0)
  base = warpgroups * base_stages * base_rows * CHUNK_ROWS * base_itemsize
  scales = chunks * CHUNK_ROWS * 4 if scaled else 0
  scale_bytes = _aligned(BATCH_TILE * 4) if int8_state else 0   # each row's s_lo
  merge = 2 * _aligned(warpgroups * BATCH_TILE * 4) if warpgroups > 1 else 0
  return (_aligned(z_stage) + _aligned(base) + _aligned(scales) + _aligned(BATCH_TILE * 4)
          + _aligned(2 * BATCH_TILE * 4) + scale_bytes + merge
          + (_aligned(gate_rows * rank * 2) + SMEM_ALIGNMENT if gate_rows else 0)
          + _aligned(BATCH_TILE * state_units * 4)
          + 3 * _aligned(CHUNK_ROWS * merge_tile_rows * 4)
          + widen_tiles * _aligned(CHUNK_ROWS * rank * 2) + joint_state)


def plan_batched(*, vocab_size: int, rank: int, batch: int, num_sms: int,
                 smem_per_block: int, num_blocks: int | None = None,
                 resident_chunks: int | None = None, ring_stages: int | None = None,
                 base_stages: int | None = None, base_itemsize: int = 2,
                 w2_itemsize: int = 2, int8_state: bool = False,
                 w2_row_scale: bool = False, w2_widening: str = "xla",
                 snake: bool = True, batch_axis: str = "m",
                 warpgroups: int = 1, producer: bool = False,
                 gated: bool = False, gate_split: bool = False,
                 gate_table: bool = False, recurrent: bool = False,
                 joint_table: bool = False, merge_tiles: bool = False,
                 overlap_chunks: int = 0, warp_gather: bool = False,
                 ring_preference: int = DEFAULT_RING_STAGES) -> BatchedPlan:
  """Shard V over ``num_blocks`` (default one block per SM) and split each block's shared
  memory: z staging, the base rings, scales first, then W2 — per warpgroup as many
  resident chunks as leave ``ring_stages`` slots to stream the rest (the ring runs on
  across steps: a chunk's slot is its place in the walk's stream modulo the slots).
  ``resident_chunks``, ``ring_stages`` and ``base_stages`` are a warpgroup's. The gated
  head keeps a ring of at least one slot (its G_e chunks stream through the leader's).
  ``ring_preference``: the ring slots taken before any chunk stays resident where
  neither count is given (``auto_ring_preference``). ``w2_row_scale``: an int8 W2 that
  comes widened to bf16 (``w2_itemsize`` 2) with its per-row scales
  (``BatchedPlan.w2_row_scale``), or as int8 (``w2_itemsize`` 1) to be widened in the
  kernel (``w2_widening``). ``overlap_chunks`` and
  ``warp_gather`` take no shared memory: they are passed through
  (``auto_overlap_chunks``, ``auto_warp_gather``), the overlap dropped where one ring
  slot streams chunks (it would deadlock)."""
  in_kernel = w2_row_scale and w2_widening != "xla"
  if w2_itemsize == 1 and not (int8_state or in_kernel):
    raise ValueError("the batched walk meets an int8 W2 only with z as two int8 planes "
                     "(quantize_w2(head, 'int8', state='planes'))")
  if int8_state and w2_itemsize != 1:
    raise ValueError("int8 planes of z meet an int8 W2 only")
  if int8_state and batch_axis == "n" and rank < PLANES_ON_N_MIN_RANK:
    raise ValueError(f"int8 planes with the batch on N need rank >= {PLANES_ON_N_MIN_RANK} "
                     f"(rank={rank}: Mosaic has no conflict-free copy for its z staging); "
                     "use batch_axis='m'")
  if gated and ((w2_itemsize != 2 and not in_kernel) or (producer and not gate_table)):
    raise ValueError("the gated head's batched walk needs a bf16 W2 (its fp32 z meets W2 "
                     "as a hi + lo bf16 pair) and, unless its gate comes from its table, "
                     "no producer warpgroup")
  if gate_table and (not gated or gate_split or batch_axis != "n"):
    raise ValueError("a gate table is the gated head's, its gate not split, with the batch "
                     "on N")
  if joint_table and (not recurrent or batch_axis != "n" or warpgroups != 1 or producer):
    raise ValueError("a joint table is the rnn head's, with the batch on N, one warpgroup "
                     "and no producer")
  # The gated head's gate computed from G_e streamed through the leader's W2 ring.
  redundant_gate = gated and not (gate_split or gate_table)
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
  if warpgroups not in (1, 2):
    raise ValueError(f"warpgroups={warpgroups} must be 1 or 2 (a block's registers hold "
                     "two 128-thread warpgroups at 255 registers each)")
  wg_chunks = warpgroup_chunks(vocab_size, blocks, warpgroups)
  chunks = wg_chunks * warpgroups
  if base_stages is None:
    base_stages = min(DEFAULT_BASE_STAGES, wg_chunks)
  if ring_preference < 1:
    raise ValueError(f"ring_preference={ring_preference} must be >= 1")
  if not 1 <= base_stages <= wg_chunks:
    raise ValueError(f"base_stages={base_stages} must be in [1, {wg_chunks}] (the chunks "
                     "a warpgroup owns: the prologue fills the ring from the first step)")
  chunk_bytes = CHUNK_ROWS * rank * w2_itemsize
  z_pair = gated or recurrent   # (``BatchedPlan.z_pair``)
  update_units = split_update_units(rank, blocks) if gate_split or recurrent else 0
  if recurrent and 3 * update_units > WGMMA_MAX_N:   # (one WGMMA for the three parts)
    raise ValueError(f"the rnn head's {update_units} units a block on {blocks} blocks: its "
                     f"three parts' {3 * update_units} rows exceed a WGMMA's N of "
                     f"{WGMMA_MAX_N}; use more blocks")
  fixed = fixed_bytes(chunks=chunks, rank=rank, base_stages=base_stages,
                      base_itemsize=base_itemsize,
                      scaled=w2_itemsize == 1 or w2_row_scale,
                      int8_state=int8_state, batch_axis=batch_axis,
                      base_rows=padded_batch(batch) if batch_axis == "n" else BATCH_TILE,
                      warpgroups=warpgroups,
                      staged_rows=staged_z_rows(
                          batch_axis=batch_axis, z_pair=z_pair,
                          token_table=gate_table or joint_table,
                          batch_rows=padded_batch(batch), rank=rank,
                          itemsize=1 if int8_state else 2),
                      z_pair=z_pair,
                      gate_rows=update_units * resident_rows_a_unit(recurrent=recurrent,
                                                                    joint_table=joint_table),
                      state_units=update_units if recurrent and not joint_table else 0,
                      merge_tile_rows=padded_batch(batch) if merge_tiles else 0,
                      widen_tiles=warpgroups if in_kernel and w2_widening == "smem" else 0,
                      gate_table=gate_table, joint_table=joint_table)
  slots = (smem_per_block - SMEM_RESERVED_BYTES - fixed) // chunk_bytes // warpgroups
  if slots < 1:
    raise ValueError(f"{smem_per_block} bytes of shared memory hold no {chunk_bytes}-byte "
                     "W2 chunk a warpgroup beside the batched walk's staging")
  if (resident_chunks is None and ring_stages in (None, 0) and wg_chunks <= slots
      and not redundant_gate):
    resident_chunks, ring_stages = wg_chunks, 0
  if ring_stages is None:
    rest = wg_chunks - min(resident_chunks or 0, wg_chunks)
    if resident_chunks is None:
      preference, room = ring_preference, slots
    else:   # stated resident chunks keep their slots: the ring takes what is left
      preference, room = DEFAULT_RING_STAGES, max(1, slots - resident_chunks)
    ring_stages = (min(GATED_RING_STAGES, slots) if redundant_gate
                   else min(preference, room, rest))
  if resident_chunks is None:
    resident_chunks = max(0, min(wg_chunks, slots - ring_stages))
  resident_chunks = min(resident_chunks, wg_chunks)
  if redundant_gate:   # the ring's slots first (residency a wish, the ring a need)
    resident_chunks = max(0, min(resident_chunks, slots - ring_stages))
  streamed = wg_chunks - resident_chunks
  if redundant_gate and ring_stages < 1:
    raise ValueError("the gated head streams G_e through the W2 ring: ring_stages >= 1")
  if streamed == 0 and not redundant_gate:
    ring_stages = 0
  elif ring_stages < 1:
    raise ValueError(f"{streamed} streamed chunks need a ring of at least one slot")
  if resident_chunks + ring_stages > slots:
    raise ValueError(f"{resident_chunks} resident chunks + {ring_stages} ring slots exceed "
                     f"the {slots} W2 chunks that fit "
                     + ("a warpgroup's half of " if warpgroups > 1 else "")
                     + "a block's shared memory")
  if ring_stages < 2 and streamed:
    # (Overlapped, a chunk is awaited before the chunk before it releases its slot: one
    # slot would deadlock, so such a plan computes each chunk in turn.)
    overlap_chunks = 0
  used = (SMEM_RESERVED_BYTES + fixed
          + warpgroups * (resident_chunks + ring_stages) * chunk_bytes)
  return BatchedPlan(num_blocks=blocks, chunks=chunks, resident_chunks=resident_chunks,
                     ring_stages=ring_stages, base_stages=base_stages,
                     vocab_size=vocab_size, rank=rank, batch_rows=padded_batch(batch),
                     smem_bytes=used, base_itemsize=base_itemsize,
                     w2_itemsize=w2_itemsize, int8_state=int8_state,
                     w2_row_scale=w2_row_scale, w2_widening=w2_widening, snake=snake,
                     batch_axis=batch_axis, warpgroups=warpgroups,
                     producer=producer, gated=gated,
                     gate_split=gate_split, gate_table=gate_table, recurrent=recurrent,
                     joint_table=joint_table, merge_tiles=merge_tiles,
                     overlap_chunks=overlap_chunks, warp_gather=warp_gather)
