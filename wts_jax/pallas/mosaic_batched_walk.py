"""The Weights-That-Stay walk for many batch rows: one persistent Mosaic GPU kernel with
the batch on the tensor cores — on the WGMMA's M (``batch_axis="m"``) or on its N
(``"n"``; ``mosaic_batched_plan.py`` says why either, and which the planner takes).

Per block (one per SM) and step:

- z of all rows is a WGMMA operand (A on M, B on N): the rows' W1 rows were copied by
  bulk async copies (one per row, no tensor map) into a padded staging tile at the end
  of the last step, and go once per step through registers into a swizzled tile; rows
  past B are zeros;
- per 64-row W2 chunk (resident in shared memory, or streamed through the TMA ring that
  runs ahead across steps, odd steps in reverse as in the row kernel) one WGMMA into an
  fp32 accumulator: on M ``[64, r] x [r, 64]`` = [batch row, vocab row], on N
  ``[64, r] x [r, B]`` = [vocab row, batch row]; the chunk's base logits ([B, 64],
  through their own TMA ring) are added; on M the chunk's greedy or Gumbel top-1 (the
  generator of ``wts_jax.sampling``) per batch row updates that row's best (score,
  index), on N every accumulator element keeps its own best and one reduction over the
  vocabulary ends the step — ties to the lower index, so chunk order does not matter;
- every block folds its best per row into that row's 64-bit key of the step by an L2
  atomic max, meets the others at the grid barrier of ``grid_sync`` (the Mosaic
  protocol), and reads back the winning key — the same token per row everywhere;
- the tokens go to shared memory, and one bulk copy per row fetches the next z.

With two warpgroups (``plan.warpgroups``) each owns half of the block's chunks (its own
resident chunks, rings, base slots and accumulators) and they overlap each other's
latencies. Warpgroup 0 stages z and runs the exchange: it hands the WGMMA tile to
warpgroup 1 through an mbarrier (``za_bar``), and warpgroup 1 hands back its best per
row through shared memory (``merge_bar``); warpgroup 1 waits for nothing else, so it can
never run a step ahead (its next step starts on warpgroup 0's next ``za_bar``).

With a producer (``plan.producer``, one more warpgroup) the computing warpgroups never
issue a refill: they release each W2 slot (after its WGMMA's wait) and base slot (after
its loads) by mbarrier arrivals, and the producer refills a slot once released. Without
one, a warpgroup refills its own slots at once, after a warpgroup barrier.

Why the register round trip: a bulk copy writes a row linearly, while the WGMMA reads a
swizzled tile, and a tensor-map copy cannot write one row of an 8-row swizzle tile. On
N only the batch rows are staged (``plan.staged_rows``), moved by Mosaic's
shared-to-global copy layout; on M the WGMMA layout's 64 rows.

The gated head (``plan.gated``): z = σ(hoisted_k + G_e e) ⊙ e is fp32. The leader
streams G_e's 64-row chunks through its W2 ring ahead of each step's W2 chunks, computes
the gate as WGMMAs with the batch on M (e, a bf16 W1 row, is exact), and stores z as a
hi + lo bf16 pair; each W2 chunk is then two WGMMAs into one accumulator (z to 2^-17 of
each element) — or, with the batch on N and a split update (``plan.pair_on_n``), one
WGMMA over both halves' rows whose two column blocks are summed; the int8 planes on N
likewise share one WGMMA.

With its gate table (``plan.gate_table``, the batch on N): each row's gather brings the
token's e and G_e e (int16 words: e's bf16 bits and G_e e's fp32 bit halves,
``wts_jax.gate_table``), and the leader forms z = σ(hoisted_k + G_e e) ⊙ e elementwise
while staging it — the vanilla head's step but for that.

The rnn head with its joint table (``plan.joint_table``, the batch on N, one warpgroup):
each row's gather brings the token's J_e e (fp32 bit halves, ``wts_jax.joint_table``);
the leader loads the step's hoisted terms and the J_s s_{k−1} that the blocks owning the
state's units published during the last step (``ppub_g``: global memory, generic stores
released by that step's grid signal and read after its acquire), and advances the whole
state for every row itself, elementwise, keeping s in fp32 in shared memory. Then each
owner computes J_s s_k for its units (two WGMMAs, s's hi and lo halves with the batch on
M, against its resident J_s rows) and publishes it for the next step: one grid barrier a
step, where the split update has two.

A split update (``plan.split``): block p owns the units [8p, 8p + 8) (at r = 256 on 132
blocks), keeps its rows of the head's weights resident (G_e; for the rnn head J_s and J_e
of the gate, candidate and output), computes its units for every row with WGMMAs of N = 8
(the rnn head's three parts side by side, N = 24), publishes z (and the rnn head's state
s) as a hi + lo bf16 pair in a global buffer, and meets the others at a second grid
barrier; every block then copies the whole pair into its WGMMA tiles by TMA (the rnn
owners copy s's halves in likewise, one at a time, and keep their own units' s in fp32).

Scope (``mosaic_batched_backend.plan`` says why otherwise): the vanilla head (z = e, a W1 row)
with a bf16 W1 and W2 (z exact in bf16) or an int8 W2 that z meets as two int8 planes,
the gated head with a bf16 W1, W2 and gate, and the rnn head (split, or from its joint
table) with a bf16 W1, W2 and joint_proj (no producer for either). Int8 planes
(``wts_jax.int8_state``): two int8 WGMMAs a chunk, s32 accumulators, D = 256 · d_hi +
d_lo exact, then (f32(D) · s_lo) · scale2 — each row's s_lo loaded by a thread of
its own after the planes' copies. Up to 64 rows a launch, greedy and sampled; no logits written (the
backend computes them after the walk when asked). Interpret mode runs one block owning
every chunk.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import gate_table, sampling
from wts_jax.int8_state import LO_STEPS
from wts_jax.output import (KERNEL_STATUS_BITS, STATUS_NAN_LOGITS, STATUS_SYNC_TIMEOUT,
                             STATUS_TOKEN_OUT_OF_RANGE)
from wts_jax.pallas import grid_sync, row_words
from wts_jax.pallas.mosaic_batched_plan import BATCH_TILE, BatchedPlan, padded_batch
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS, chunk_schedule, row_swizzle
from wts_jax.pallas.mosaic_walk import (_and, _chunk_kind, _div, _interpret_params, _load,
                                        _store,
                                        _not, _rem, _select, _w2_transforms, _when)
from wts_jax.pallas.tile_math import make_operand
from wts_jax.walk_config import RING_REFILLS

_WGMMA = plgpu.Layout.WGMMA
_PER_ROW = _WGMMA.reduce(1)     # one value per batch row of a [64, n] tile
_PER_COLUMN = _WGMMA.reduce(0)  # one value per vocab row of a chunk
_WARPS = 4                      # warps a warpgroup
_BIG_INDEX = 1 << 30
_STEP_KEY_WORDS = BATCH_TILE * grid_sync.KEY_ROW_WORDS   # a step's exchange slots
_NEG_INF = float("-inf")
# Registers a thread with a producer beside two consumers (384 threads start at 168): the
# producer keeps what issuing copies needs, the consumers take the rest (multiples of 8,
# 128 · (2 · 232 + 40) <= 64 K).
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232


@dataclasses.dataclass(frozen=True)
class BatchedLab:
  """What only tools/ set on a batched launch: Mosaic GPU's profiler over the kernel's
  named regions (``profile_dir``, ``profile_space``), and for the profile a warpgroup
  barrier (region "skew") before each chunk's WGMMA, which separates the warps' arrival
  spread from the WGMMA's issue (``probe_skew``)."""
  profile_dir: str = ""
  profile_space: int = 0
  probe_skew: bool = False


@dataclasses.dataclass(frozen=True)
class BatchedSpec:
  plan: BatchedPlan
  batch: int          # the caller's rows (<= plan.batch_rows)
  steps: int
  greedy: bool
  spin_limit: int
  interpret: bool
  row_offset: int = 0   # the first row's index in the whole walk (its noise streams)
  # Measurement and profiling options that only tools/ set (``BatchedLab``).
  lab: BatchedLab = BatchedLab()
  # The walk's status: "flags", a word a warpgroup, OR-reduced by an XLA op after the
  # launch; "kernel", reduced in the kernel (as ``stacked_walk``'s): before its last
  # step's grid signal each block's leader adds one to a zeroed global counter a status
  # bit its block holds (warpgroup 1's NaN handed over with its bests, a split update's
  # time-out read then), and block 0's leader, past that step's barrier, writes the one
  # word. No op after the kernel. (The API's choice: ``mosaic_batched_backend.resolve``.)
  status: str = "flags"
  # When a streamed chunk's W2 ring slot is refilled (or released to the producer):
  # "after_epilogue", once the chunk's logits are folded; "before_epilogue", as soon as
  # its accumulator is read (its WGMMA's reads of the slot are complete then), so the
  # refill's copy runs beside the epilogue — the whole of a 1-slot ring's latency
  # otherwise. Not with an int8 W2 widened in the kernel (its threads read the slot).
  ring_refill: str = "after_epilogue"

  def __post_init__(self):
    if self.status not in ("flags", "kernel"):
      raise ValueError(f"status={self.status!r} must be 'flags' or 'kernel'")
    if self.ring_refill not in RING_REFILLS:
      raise ValueError(f"ring_refill={self.ring_refill!r} must be one of {RING_REFILLS}")
    if self.ring_refill == "before_epilogue" and self.plan.widened_in_kernel:
      raise ValueError("ring_refill='before_epilogue' needs W2 slots that only WGMMAs "
                       "read (an int8 W2 widened in the kernel is read by its threads)")


@dataclasses.dataclass(frozen=True)
class BatchedRefs:
  """The kernel's refs by name (``_g`` global, ``_s`` shared, ``_bar`` barriers)."""
  w2_g: object
  base_g: object
  tok_g: object
  flag_g: object
  w_s: object
  base_s: object
  tok_s: object
  keys_s: object
  res_bar: object
  ring_bar: object
  base_bar: object
  base_free_bar: object
  za_s: object = None            # z's WGMMA tile(s)
  z_bar: object = None           # the staging's copies
  seed_g: object = None
  scale_g: object = None
  noise_g: object = None
  w2_scale_g: object = None   # int8 W2: per-row scales, in shared memory once
  w2_scale_s: object = None
  w2_scale_bar: object = None
  w1_scale_g: object = None   # int8 planes: s_lo of each token [V]
  row_scale_s: object = None     # int8 planes: each row's s_lo [64] f32
  ring_free_bar: object = None   # producer: a W2 ring slot read by its consumer
  za_bar: object = None          # warpgroups: the WGMMA tile of z is staged
  merge_bar: object = None       # warpgroups: warpgroup 1's best per row is stored
  merge_flag_s: object = None    # status in the kernel: warpgroup 1's NaN flag, handed over
  merge_value_s: object = None
  merge_index_s: object = None
  merge_tile_value_s: object = None   # ``merge_tiles``: warpgroup 1's unreduced bests
  merge_tile_index_s: object = None
  merge_tile_nan_s: object = None
  widen_s: object = None   # ``w2_widening="smem"``: each warpgroup's bf16 chunk tile
  w1_g: object = None            # W1 and the first tokens
  first_g: object = None
  z_s: object = None             # z staging
  gate_w_g: object = None        # gated head: gate_proj.weight (G_e its last r columns)
  gate_hoisted_g: object = None  # gated head: hoisted_k, [K, r / 64, 64 rows, 64] f32
                                 # ([64 rows, K, r] with a split gate, as the hoist
                                 # gives them; [K, 2, rows, r] int16 halves of its
                                 # fp32 bits with a gate table)
  update_w_s: object = None      # split update: this block's rows of G_e (or [J_s, J_e],
                                 # each the rnn head's gate, candidate, output rows)
  update_w_bar: object = None
  update_flag_s: object = None   # split update: its barrier's timeout, for the leader's flags
  zpub_g: object = None          # split update: z of every row and step as a hi + lo
                                 # bf16 pair [K, 2, 64, r]
  spub_g: object = None          # the rnn head: its state, likewise
  pub_bar: object = None         # split update: the published z pair copied in
  state_bar: object = None       # the rnn head: a published state half copied in
  state_s: object = None         # the rnn head: its own units' state, fp32 [64, units]
  joint_w_g: object = None       # the rnn head: joint_proj.weight [3r, 2r + d]
  ppub_g: object = None          # joint table: J_s s_{k-1} of every row for step k, as
                                 # int16 halves of its fp32 bits [K, 2, 3 parts, 64, r]
  state_tile_s: object = None    # joint table: s_k's hi or lo half, the owners' WGMMA
                                 # operand [64, r] bf16


def row_launches(spec: BatchedSpec, batch: int) -> list[tuple[slice, BatchedSpec]]:
  """A walk's rows cut into launches of at most 64 (the rows of a walk are independent):
  (the rows, the launch's spec — its rows padded to whole 8-row tiles, its first row's
  index for the noise streams)."""
  launches = []
  for start in range(0, batch, BATCH_TILE):
    count = min(BATCH_TILE, batch - start)
    launches.append((slice(start, start + count), dataclasses.replace(
        spec, batch=count, row_offset=start,
        plan=dataclasses.replace(spec.plan, batch_rows=padded_batch(count)))))
  return launches


def gathered_z_rows(spec: BatchedSpec) -> int:
  """The staging rows each step's gather copies: the batch's only (the plan's padded
  rows keep the prologue's zeros, which no batch row reads)."""
  return spec.batch


def _base_transforms(itemsize: int):
  # The base tile is read in the WGMMA layout: the 128-byte swizzle spreads the 8 rows a
  # warp reads over all banks.
  return (plgpu.TilingTransform((8, 128 // itemsize)), plgpu.SwizzleTransform(128))


def _batched_kernel(*refs, spec: BatchedSpec, names: tuple[str, ...]):
  plan = spec.plan
  vocab, rank, rows = plan.vocab_size, plan.rank, plan.batch_rows
  refs = BatchedRefs(**dict(zip(names, refs)))
  blocks, res, stages = plan.num_blocks, plan.resident_chunks, plan.ring_stages
  streamed, chunks, base_stages = plan.streamed_chunks, plan.wg_chunks, plan.base_stages
  block = lax.axis_index("blocks")
  # A warpgroup's share: chunks [wg * chunks, (wg + 1) * chunks) of the block's, W2 slots
  # from ``slot_base(wg)``, ring and base slots from ``wg * stages`` / ``wg * base_stages``.
  wgs = plan.warpgroups
  threads = wgs + (1 if plan.producer else 0)   # (the producer's index is wgs)
  wg = lax.axis_index("wg") if threads > 1 else 0
  leader = wg == 0   # the warpgroup that stages z and runs the exchange
  def slot_base(owner):   # a warpgroup's first W2 slot
    return owner * (res + stages)
  multi_block = blocks > 1
  # The keys first: the kernel's first global allocation starts the (zeroed) buffer, so
  # its 64-bit slots are aligned (grid_sync).
  keys_g = (pl.get_global(plgpu.SemaphoreType.REGULAR((spec.steps * _STEP_KEY_WORDS,)))
            if multi_block else None)
  sem = pl.get_global(plgpu.SemaphoreType.REGULAR(())) if multi_block else None
  # A split update's own barrier (one signal a block a step, like the exchange's).
  update_sem = (pl.get_global(plgpu.SemaphoreType.REGULAR(()))
                if multi_block and plan.split else None)
  status_in_kernel = spec.status == "kernel"
  refill_before_epilogue = spec.ring_refill == "before_epilogue"
  bit_counts_g = (pl.get_global(plgpu.SemaphoreType.REGULAR((len(KERNEL_STATUS_BITS),)))
                  if status_in_kernel and multi_block else None)
  n_major = plan.batch_axis == "n"
  # The base logits' rows each copy brings: the plan's batch rows, or on N the batch as
  # given (a slot's rows past it are zeroed once and never written).
  base_copy_rows = refs.base_g.shape[0]
  # The accumulator a chunk: [batch rows, vocab rows] (batch on M) or [vocab rows, batch
  # rows] (batch on N, ``rows`` wide); a batch row's values run along ``vocab_axis``.
  tile = (CHUNK_ROWS, rows) if n_major else (BATCH_TILE, CHUNK_ROWS)
  vocab_axis, batch_axis = (0, 1) if n_major else (1, 0)
  per_batch_row = _PER_COLUMN if n_major else _PER_ROW
  batch_width = tile[batch_axis]   # the batch rows a step's vectors carry
  published_rows = rows if n_major else BATCH_TILE   # a split update's rows copied back
  # Batch on N: the WGMMA's N (both halves' columns with ``pair_on_n``).
  n_width = plan.lo_offset + rows if plan.pair_on_n else rows
  vocab_ids = plgpu.broadcasted_iota(jnp.int32, tile, vocab_axis, layout=_WGMMA)
  row_ids = plgpu.broadcasted_iota(jnp.int32, (batch_width,), 0, layout=per_batch_row)
  planes, gated, gate_chunks = plan.int8_state, plan.gated, plan.gate_chunks
  # Rows past the batch that gather nothing (a joint table's, 3 KB a row; any plan's with
  # ``gather_batch_only``) keep the prologue's zeros, which no batch row reads.
  gathered_rows = gathered_z_rows(spec)
  zero_padded_rows = rows < BATCH_TILE or gathered_rows < rows
  z_width = plan.z_row_elements
  # The round trip's layout: on M the WGMMA's own (64 rows); on N, where only the batch
  # rows are staged, Mosaic's shared-to-global copy layout, which moves any whole
  # number of swizzle tiles.
  # (A gate table's staging holds int16 words: ``z_s.dtype``.)
  z_dtype = refs.za_s.dtype if refs.za_s is not None else refs.w1_g.dtype
  if n_major and (plan.token_table or not plan.z_pair):
    z_layout = plgpu.Layout.SMEM_GMEM_COPY(
        (plan.staged_rows, rank), z_dtype, row_swizzle(rank, jnp.dtype(z_dtype).itemsize))
  else:
    z_layout = plgpu.Layout.WGMMA_8BIT if planes else _WGMMA

  # The helpers below address warpgroup ``owner``'s chunks and slots (by default this
  # warpgroup's; the producer serves every consumer).
  def chunk_start(c, owner=None):
    # Clamped, so the last chunks overlap earlier rows rather than read past V.
    return jnp.minimum(unclamped_start(c, owner), vocab - CHUNK_ROWS)

  def unclamped_start(c, owner=None):
    owner = wg if owner is None else owner
    return block * (plan.chunks * CHUNK_ROWS) + (owner * chunks + c) * CHUNK_ROWS

  def base_start(c, owner=None):
    # ``base_g``'s columns: whole tiles, its last one the rows [V - 64, V) (``batched_walk``),
    # so a clamped chunk's base tile starts on a tile too (a copy into a tiled slot moves
    # whole tiles: from an unaligned column it would start at the tile below).
    return jnp.minimum(unclamped_start(c, owner), refs.base_g.shape[2] - CHUNK_ROWS)

  def copy_chunk(c, slot, barrier, owner=None):
    owner = wg if owner is None else owner
    plgpu.copy_gmem_to_smem(refs.w2_g.at[pl.ds(chunk_start(c, owner), CHUNK_ROWS)],
                            refs.w_s.at[slot_base(owner) + slot], barrier)

  def ring_barrier(ring, owner=None):
    return refs.ring_bar.at[(wg if owner is None else owner) * stages + ring]

  def base_slot_of(step, position, owner=None):
    # The base ring runs on across steps: a tile's slot is its place in the walk's
    # stream of base tiles.
    return ((wg if owner is None else owner) * base_stages
            + _rem(step * chunks + position, base_stages))

  def base_after(step, position):
    """(step, position) whose base tile refills the slot of (step, position)'s."""
    ahead = position + base_stages
    wraps = ahead >= chunks
    return (_select(wraps, step + 1, lambda: step),
            _select(wraps, ahead - chunks, lambda: ahead))

  def first_tokens_flag(first):
    """STATUS_TOKEN_OUT_OF_RANGE where a row's first token (as given) is outside [0, V)
    (the walk runs on from it clamped): reported here, so the caller needs no op of its
    own."""
    outside = jnp.where((first < 0) | (first >= vocab), 1, 0) * jnp.where(
        row_ids < spec.batch, 1, 0)
    return jnp.where(outside.max() > 0, STATUS_TOKEN_OUT_OF_RANGE, 0)

  def leader_only(body):
    if wgs > 1:
      pl.when(leader)(body)
    else:
      body()

  def streamed_chunk(step, j):
    if not plan.snake:
      return res + j
    return res + jnp.where(lax.rem(step, 2) == 1, streamed - 1 - j, j)

  # A step's chunks in order, one at a time: streamed ones with the resident ones spread
  # among them, so the ring keeps streaming while resident chunks are computed.
  order = [(kind, members[0]) for kind, members in chunk_schedule(res, streamed, 1)]

  def chunk_kind(position):
    return _chunk_kind(position, order)

  def chunk_at(step, position):
    resident, index, j = chunk_kind(position)
    return _select(resident, index, lambda: streamed_chunk(step, j))

  # A warpgroup's W2 ring carries a stream: per step, ``lead_of(owner)`` entries ahead of
  # its streamed W2 chunks (the gated head's G_e chunks, the leader's only), then those
  # chunks. An entry's ring slot is its place in the walk's stream modulo the slots.
  def lead_of(owner):
    if not gate_chunks:
      return 0
    if isinstance(owner, int):
      return gate_chunks if owner == 0 else 0
    return jnp.where(owner == 0, gate_chunks, 0)

  def stream_length(owner):
    return lead_of(owner) + streamed

  def stream_total(owner):
    return spec.steps * stream_length(owner)

  def stream_index(step, j, owner=None):
    """The stream entry of streamed W2 chunk j (its place in the step's order) of step."""
    owner = wg if owner is None else owner
    return step * stream_length(owner) + lead_of(owner) + j

  def copy_stream(index, owner=None):
    """Stream entry ``index`` (a G_e chunk or a streamed W2 chunk) into its ring slot."""
    owner = wg if owner is None else owner
    ring = _rem(index, stages)
    barrier = ring_barrier(ring, owner)
    length, lead = stream_length(owner), lead_of(owner)
    step, within = _div(index, length), _rem(index, length)
    if not gate_chunks:
      copy_chunk(streamed_chunk(step, within), res + ring, barrier, owner)
      return
    hidden_size = refs.gate_w_g.shape[1] - rank
    _when(within >= lead, lambda: copy_chunk(
        streamed_chunk(step, within - lead), res + ring, barrier, owner))
    _when(within < lead, lambda: plgpu.copy_gmem_to_smem(
        refs.gate_w_g.at[pl.ds(within * CHUNK_ROWS, CHUNK_ROWS), pl.ds(hidden_size, rank)],
        refs.w_s.at[slot_base(owner) + res + ring], barrier))

  def ring_refill_due(step, j, owner=None):
    owner = wg if owner is None else owner
    return stream_index(step, j, owner) + stages < stream_total(owner)

  def refill_ring_after(step, j, owner=None):
    """Streamed chunk j of ``step`` read: the stream entry ``stages`` later into its slot."""
    copy_stream(stream_index(step, j, owner) + stages, owner)

  def base_tile_g(step, position, owner=None):
    start = base_start(chunk_at(step, position), owner)
    return refs.base_g.at[:, step, pl.ds(start, CHUNK_ROWS)]

  def copy_base(step, position, owner=None):
    """The base tile of (step, position) into its slot."""
    base_slot = base_slot_of(step, position, owner)
    plgpu.copy_gmem_to_smem(base_tile_g(step, position, owner),
                            refs.base_s.at[base_slot, pl.ds(0, base_copy_rows)],
                            refs.base_bar.at[base_slot])

  def gather_z():
    """One bulk copy per row: W1 row ``tok_s[b]`` (int8 planes: the token's two planes,
    side by side) into staging row b. Rows >= B of a padded batch walk along on their
    own tokens; rows past ``rows`` stay zero. With ``plan.warp_gather`` warp w issues
    rows w, w + 4, ... (copies in warp semantics meet no warpgroup barrier). int8 planes:
    then each row's s_lo into ``row_scale_s``, by a thread of its own (interpreted, by
    scalar loads)."""
    def gather_row(b):
      token = refs.tok_s[b]
      plgpu.copy_gmem_to_smem(refs.w1_g.at[pl.ds(token, 1)],
                              refs.z_s.at[pl.ds(b, 1), pl.ds(0, z_width)], refs.z_bar,
                              oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)
    if not plan.warp_gather:
      for b in range(gathered_rows):
        gather_row(b)
    else:
      @plgpu.warp_map
      def _(warp):
        for b in range(gathered_rows):
          _when(warp == b % _WARPS, functools.partial(gather_row, b))
    if not planes:
      return
    if not spec.interpret:
      # After the copies' issue, so the loads' latency runs beside the copies'; stored
      # by their own threads (the staging's barrier orders them before its reads).
      row_words.load_row_words(refs.tok_s, refs.w1_scale_g, refs.row_scale_s, rows)
    else:
      store_row_scales([refs.w1_scale_g[refs.tok_s[b]] for b in range(rows)])

  def store_row_scales(scales):
    """Interpreted: each row's s_lo by scalar loads of its token's scale, stored for
    every warpgroup's ``row_plane_scale``."""
    per_row = None
    for b, scale in enumerate(scales):
      per_row = jnp.where(row_ids == b, scale, 0.0 if per_row is None else per_row)
    refs.row_scale_s[pl.ds(0, batch_width)] = per_row

  def row_plane_scale():
    """Each row's s_lo, as ``gather_z`` stored them."""
    return _load(refs.row_scale_s.at[pl.ds(0, batch_width)], per_batch_row,
                 optimized=False)

  def split_update(step):
    """The head's update split over the blocks (``plan.split``): a block owning units
    [block · U, block · U + U) computes their z for every row (``gate_slice`` or
    ``recurrent_slice``) and publishes it to ``zpub_g[step]`` as the hi + lo pair; after
    a second grid barrier every block copies the whole pair into ``za_s``."""
    units = plan.update_units
    owns = recurrent_slice if plan.recurrent else gate_slice
    with jax.named_scope("update_slice"):   # (profile regions: where the update's time goes)
      _when(block * units < rank, functools.partial(owns, step))
      # Every thread's stores before the release (a warpgroup barrier) — and, in one
      # block, before its own threads read them back.
      plgpu.commit_smem()
    if multi_block:
      with jax.named_scope("update_sync"):
        timed_out = grid_sync.signal_and_poll(update_sem, blocks, step,
                                              spin_limit=spec.spin_limit)
        refs.update_flag_s[0] = refs.update_flag_s[0] | timed_out
    with jax.named_scope("update_readback"):
      copy_published(refs.zpub_g, step, tuple(enumerate(pair_destinations())),
                     refs.pub_bar)
      plgpu.barrier_wait(refs.pub_bar)

  def plane_tiles():
    """The WGMMA tiles of z's two int8 planes, or of a table gate's hi and lo halves (one
    above the other with ``pair_on_n``)."""
    if plan.pair_on_n:
      staged = plan.staged_rows
      return [refs.za_s.at[pl.ds(0, staged)], refs.za_s.at[pl.ds(staged, staged)]]
    return [refs.za_s.at[0], refs.za_s.at[1]]

  def table_gate(hoisted):
    """The gated head's z = σ(hoisted_k + G_e e) ⊙ e (fp32, ``GatedMarkovHead.advance``)
    of every staged row from its gathered gate table row (``wts_jax.gate_table``: e, then
    G_e e as fp32 bit halves), stored as the hi + lo pair the W2 WGMMA reads
    (``plane_tiles``: hi rows above lo rows). ``hoisted``: the step's hoisted_k, in the
    staging's layout."""
    def part(index):   # int16 words
      return _load(refs.z_s.at[:, pl.ds(index * rank, rank)], z_layout)
    e = gate_table.bf16_from_bits(part(0)).astype(jnp.float32)
    z = make_operand(jax.nn.sigmoid(hoisted + gate_table.f32_from_halves(part(1), part(2)))
                     * e, exact_in_bf16=False)
    hi_tile, lo_tile = plane_tiles()
    hi_tile[...] = z.hi
    lo_tile[...] = z.lo

  def table_hoisted(step):
    """A table gate's hoisted_k of the step's staged rows ([K, 2, rows, r] int16 halves
    of their fp32 bits in global memory), in the staging's layout."""
    return gate_table.f32_from_halves(
        *(_load(refs.gate_hoisted_g.at[step, half], z_layout, optimized=False)
          for half in range(2)))

  def pair_destinations():
    """Where a split update's published hi and lo halves are copied: two tiles, or with
    ``pair_on_n`` the lo rows right below the hi rows of ``za_s[0]``."""
    hi = refs.za_s.at[0].at[pl.ds(0, published_rows)]
    if plan.pair_on_n:
      return hi, refs.za_s.at[0].at[pl.ds(plan.lo_offset, published_rows)]
    return hi, refs.za_s.at[1].at[pl.ds(0, published_rows)]

  def zero_tile(tile_ref):
    """A [64, r] bf16 WGMMA tile of z's (``za_s``) zeroed (generic stores)."""
    for c in range(rank // CHUNK_ROWS):
      tile_ref[:, pl.ds(c * CHUNK_ROWS, CHUNK_ROWS)] = plgpu.layout_cast(
          jnp.zeros((BATCH_TILE, CHUNK_ROWS), jnp.bfloat16), _WGMMA)

  def copy_published(pub_g, step, halves, barrier):
    """A published pair's halves (``pub_g[step, half]``, bf16) into rows of WGMMA tiles by
    bulk copies, which swizzle on the way: the rows the W2 WGMMAs read (the batch rows on
    N, 64 on M)."""
    if not spec.interpret:
      grid_sync.global_writes_to_bulk_copies()
    for half, rows_ref in halves:
      plgpu.copy_gmem_to_smem(pub_g.at[step, half, pl.ds(0, published_rows)], rows_ref,
                              barrier)

  def publish(pub_g, step, columns, value):
    """This block's units of an fp32 [64 rows, units] value as the hi + lo bf16 pair the
    readers' WGMMAs take (``pub_g[step]``)."""
    pair = make_operand(value, exact_in_bf16=False)
    _store(pub_g.at[step, 0, :, columns], pair.hi)
    _store(pub_g.at[step, 1, :, columns], pair.lo)

  def hoisted_columns(step, columns):
    """A split update's hoisted terms of a step, its 64 rows by ``columns``."""
    return refs.gate_hoisted_g.at[:, step, columns]

  def gate_slice(step):
    """A split gate's slice: z = σ(hoisted + G_e e) ⊙ e of this block's units (a WGMMA
    of the e tile ``za_s[1]`` against its resident G_e rows), to ``zpub_g[step]``."""
    units = plan.update_units
    columns = pl.ds(block * units, units)
    def product(acc_ref):
      plgpu.wgmma(acc_ref, refs.za_s.at[1], refs.update_w_s.T)
      return acc_ref[...]
    pre = pl.run_scoped(product, plgpu.ACC((BATCH_TILE, units), jnp.float32))
    hoisted = _load(hoisted_columns(step, columns), _WGMMA, optimized=False)
    e = _load(refs.z_s.at[:, columns], _WGMMA, optimized=False).astype(jnp.float32)
    publish(refs.zpub_g, step, columns, jax.nn.sigmoid(hoisted + pre) * e)

  def recurrent_slice(step):
    """The rnn head's slice (``RecurrentHead.advance``) for this block's units, every
    row: [a ; c ; o] = hoisted + J_s s + J_e e as WGMMAs against its resident rows of J_s
    and J_e (e in ``za_s[0]``; the last state's published hi then lo halves through
    ``za_s[1]``), u = σ(a), s' = u ⊙ s + (1 − u) ⊙ tanh(c) (its own units' s kept in
    fp32 in ``state_s``) and z = tanh(o), both published (``spub_g``, ``zpub_g``). s is
    zero before the first step."""
    units = plan.update_units
    own = pl.ds(block * units, units)
    e_tile, state_tile = refs.za_s.at[0], refs.za_s.at[1]
    first = step == 0
    # (Loaded before the state's copies are waited for, so their latencies overlap.)
    hoisted = [_load(hoisted_columns(step, pl.ds(part * rank + block * units, units)),
                     _WGMMA, optimized=False) for part in range(3)]

    @jax.named_scope("state_half")
    def stage_state_half(half):
      def zeros():
        zero_tile(state_tile)
        plgpu.commit_smem()   # before the WGMMAs' async-proxy reads
      def published():
        copy_published(refs.spub_g, jnp.maximum(step - 1, 0),
                       ((half, state_tile.at[pl.ds(0, published_rows)]),), refs.state_bar)
        plgpu.barrier_wait(refs.state_bar)
      _when(first, zeros)
      _when(jnp.logical_not(first), published)

    stage_state_half(0)
    # The parts' weight rows side by side on N ([J_s; J_e] of gate, candidate, output;
    # 3 · units <= WGMMA_MAX_N, ``plan_batched``): one WGMMA an operand tile for all
    # three, so each tile is read once, not once a part.
    def weights(operand):   # 0: J_s, 1: J_e
      return refs.update_w_s.at[operand].T
    # The lo half's product in an accumulator of its own, zeroed after the half is
    # staged: an accumulator live across the staging's branches makes ptxas fence the
    # WGMMA inside the leader's branch, which serializes every WGMMA of the kernel (its
    # C7520 report, two warpgroups) or injects a warpgroup arrive (C7519, one).
    def products_hi(acc):
      with jax.named_scope("update_mma_hi"):
        plgpu.wgmma(acc, e_tile, weights(1))       # J_e e
        plgpu.wgmma(acc, state_tile, weights(0))   # J_s s_hi
        plgpu.wgmma_wait(0)   # the hi half read before the lo half overwrites it
        return acc[...]
    def products_lo(acc):
      with jax.named_scope("update_mma_lo"):
        plgpu.wgmma(acc, state_tile, weights(0))   # J_s s_lo
        return acc[...]
    update_acc = plgpu.ACC((BATCH_TILE, 3 * units), jnp.float32)
    sums_hi = pl.run_scoped(products_hi, update_acc)
    stage_state_half(1)
    sums = sums_hi + pl.run_scoped(products_lo, update_acc)
    gate_pre, candidate, output = (sums[:, part * units:(part + 1) * units] + hoisted[part]
                                   for part in range(3))
    with jax.named_scope("update_activation"):
      update = jax.nn.sigmoid(gate_pre)
      last = jnp.where(first, 0.0, _load(refs.state_s, _WGMMA, optimized=False))
      state = update * last + (1.0 - update) * jnp.tanh(candidate)
      refs.state_s[...] = state   # (each thread reads back only what it stored)
      output = jnp.tanh(output)
    with jax.named_scope("update_publish"):
      publish(refs.spub_g, step, own, state)
      publish(refs.zpub_g, step, own, output)

  def joint_terms(halves_g):
    """A joint table walk's three parts (gate, candidate, output) of a step's fp32 terms
    stored as int16 halves ([2, 3, rows, r] in global memory: the hoisted terms, or the
    published J_s s), each [staged rows, r] in the staging's layout."""
    staged = pl.ds(0, plan.staged_rows)
    return [gate_table.f32_from_halves(
        *(_load(halves_g.at[half, part, staged], z_layout, optimized=False)
          for half in range(2))) for part in range(3)]

  def joint_update(step, hoisted, published):
    """The rnn head's step from its joint table (``RecurrentHead.advance``) for every
    staged row: [a ; c ; o] = (hoisted + J_s s_{k-1}) + J_e e, J_e e gathered (the row's
    T[x]: fp32 upper halves of the three parts, then lower) and J_s s_{k-1} as published
    (``publish_joint_state_terms``); u = σ(a), s_k = u ⊙ s_{k-1} + (1 − u) ⊙ tanh(c)
    kept in fp32 (``state_s``, each thread reading back what it stored), z = tanh(o)
    stored as the hi + lo pair the W2 WGMMA reads. Then, in the blocks that own units,
    J_s s_k for the next step."""
    def part(index):   # int16 words
      return _load(refs.z_s.at[:, pl.ds(index * rank, rank)], z_layout)
    first = step == 0
    gate_pre, candidate, output = (
        hoisted[p] + jnp.where(first, 0.0, published[p])
        + gate_table.f32_from_halves(part(p), part(3 + p)) for p in range(3))
    update = jax.nn.sigmoid(gate_pre)
    last = jnp.where(first, 0.0, _load(refs.state_s, z_layout, optimized=False))
    state = update * last + (1.0 - update) * jnp.tanh(candidate)
    _store(refs.state_s, state)
    z = make_operand(jnp.tanh(output), exact_in_bf16=False)
    hi_tile, lo_tile = plane_tiles()
    hi_tile[...] = z.hi
    lo_tile[...] = z.lo
    _when(joint_publish_due(step), functools.partial(publish_joint_state_terms, step, state))

  def joint_publish_due(step):
    """Whether this block publishes J_s s_k at ``step``: it owns units, and a step
    follows."""
    return _and(block * plan.update_units < rank, step + 1 < spec.steps)

  def publish_joint_state_terms(step, state):
    """An owner's J_s s_k for its units (of the gate, candidate and output), every row:
    s_k's hi then lo half through ``state_tile_s`` (the batch on M) against its resident
    J_s rows, summed in fp32, published as int16 halves to ``ppub_g[step + 1]`` for the
    next step's readers (released by this step's grid signal)."""
    units = plan.update_units
    pair = make_operand(state, exact_in_bf16=False)
    tile = refs.state_tile_s
    def product(half):
      tile.at[pl.ds(0, plan.staged_rows)][...] = half
      plgpu.commit_smem()   # before the WGMMA's async-proxy reads
      def run(acc_ref):
        plgpu.wgmma(acc_ref, tile, refs.update_w_s.T)
        plgpu.wgmma_wait(0)   # read before the next half overwrites the tile
        return acc_ref[...]
      return pl.run_scoped(run, plgpu.ACC((BATCH_TILE, 3 * units), jnp.float32))
    sums = product(pair.hi)
    sums = sums + product(pair.lo)
    halves = gate_table.f32_halves(sums)
    columns = pl.ds(block * units, units)
    for half, words in enumerate(halves):
      for p in range(3):
        part = words[:, p * units:(p + 1) * units]
        _store(refs.ppub_g.at[step + 1, half, p, :, columns], part)

  def gate(step):
    """The gated head's z = σ(hoisted_k + G_e e) ⊙ e (fp32, ``GatedMarkovHead.advance``)
    of every staged row, stored as the hi + lo bf16 pair the W2 WGMMAs read (``za_s[0]``,
    ``za_s[1]``). The leader's: per G_e chunk from its ring, a WGMMA with the batch on M
    ([64 rows, r] x [r, 64 gate rows]) reads e from ``za_s[1]``, so the lo halves wait in
    registers until the last of them has completed."""
    e_tile, hi_tile = refs.za_s.at[1], refs.za_s.at[0]
    lo_parts = []
    for c in range(gate_chunks):
      index = step * stream_length(0) + c
      ring = _rem(index, stages)
      hoisted = _load(refs.gate_hoisted_g.at[step, c], _WGMMA, optimized=False)
      plgpu.barrier_wait(ring_barrier(ring, 0))
      def product(acc_ref, ring=ring):
        plgpu.wgmma(acc_ref, e_tile, refs.w_s.at[slot_base(0) + res + ring].T)
        return acc_ref[...]
      pre = pl.run_scoped(product, plgpu.ACC((BATCH_TILE, CHUNK_ROWS), jnp.float32))
      # (The WGMMA's reads of the slot completed when its accumulator was read.)
      _when(index + stages < stream_total(0), functools.partial(copy_stream, index + stages, 0))
      columns = pl.ds(c * CHUNK_ROWS, CHUNK_ROWS)
      e = _load(refs.z_s.at[:, columns], _WGMMA).astype(jnp.float32)
      z = make_operand(jax.nn.sigmoid(hoisted + pre) * e, exact_in_bf16=False)
      hi_tile[:, columns] = z.hi
      lo_parts.append(z.lo)
    for c, z_lo in enumerate(lo_parts):
      e_tile[:, pl.ds(c * CHUNK_ROWS, CHUNK_ROWS)] = z_lo
    plgpu.commit_smem()   # the pair stored before the W2 WGMMAs' async-proxy reads

  def consumer():
    """A computing warpgroup: its chunks' WGMMAs and epilogues, and (the leader) z and
    the exchange."""
    if plan.producer and wgs > 1:   # the producer gave its registers up
      plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
    with jax.named_scope("prologue"):
      # Rows past the batch: zeros, never NaN (on N the base copies bring the batch's
      # rows only, so a slot's padded rows are zeroed here even at 64 plan rows).
      short_base = n_major and base_copy_rows < rows
      if zero_padded_rows or short_base:
        def zero_staging():
          if refs.z_s is not None:
            refs.z_s[:, pl.ds(0, z_width)] = jnp.zeros((plan.staged_rows, z_width),
                                                       refs.z_s.dtype)
          if planes:   # the rows no gather loads a scale for
            refs.row_scale_s[pl.ds(0, batch_width)] = plgpu.layout_cast(
                jnp.zeros((batch_width,), jnp.float32), per_batch_row)
          if plan.split:   # the rows past the batch that no copy back writes
            zero_tile(refs.za_s.at[0])
            zero_tile(refs.za_s.at[1])
        if zero_padded_rows:
          leader_only(zero_staging)
        if not n_major:
          zeros = plgpu.layout_cast(jnp.zeros((BATCH_TILE, CHUNK_ROWS), refs.base_s.dtype),
                                    _WGMMA)
          for s in range(base_stages):
            refs.base_s[wg * base_stages + s] = zeros
        elif short_base:
          for s in range(base_stages):
            refs.base_s[wg * base_stages + s] = jnp.zeros((rows, CHUNK_ROWS),
                                                          refs.base_s.dtype)
        plgpu.commit_smem()   # the generic writes before any async copy lands beside them
      for g in range(stages):   # the stream's first entries
        _when(g < stream_total(wg), functools.partial(copy_stream, g))
      for p in range(base_stages):
        copy_base(0, p)
      for c in range(res):
        copy_chunk(c, c, refs.res_bar.at[wg])
      if plan.scaled:   # the warpgroup's per-row W2 scales, once: [chunks, 64] f32
        for c in range(chunks):
          plgpu.copy_gmem_to_smem(refs.w2_scale_g.at[pl.ds(chunk_start(c), CHUNK_ROWS)],
                                  refs.w2_scale_s.at[wg * chunks + c],
                                  refs.w2_scale_bar.at[wg])

      # The first tokens as given (``first_g`` is ``batch_width`` long: the caller's rows,
      # zeros past them); clamped for the walk, checked for the status.
      given_first = _load(refs.first_g.at[pl.ds(0, batch_width)], per_batch_row,
                          optimized=False)

      def first_z():
        first_tokens = jnp.clip(given_first, 0, vocab - 1)
        refs.tok_s[pl.ds(0, batch_width)] = first_tokens
        if planes:
          plgpu.commit_smem()   # each row's token stored before its own thread reads it
        gather_z()
      leader_only(first_z)
      if plan.split or plan.joint_table:   # this block's rows of the update's weights
        def resident_update_rows():   # (clamped: a block owning none reads the last ones)
          units = plan.update_units
          first_unit = jnp.minimum(block * units, rank - units)
          if plan.joint_table:   # J_s rows of (gate, candidate, output)
            for part in range(3):
              plgpu.copy_gmem_to_smem(
                  refs.joint_w_g.at[pl.ds(part * rank + first_unit, units), pl.ds(0, rank)],
                  refs.update_w_s.at[pl.ds(part * units, units)], refs.update_w_bar)
            zero_tile(refs.state_tile_s)   # (its rows past the staged ones stay zero)
            plgpu.commit_smem()
          elif plan.recurrent:   # [J_s; J_e] rows of (gate, candidate, output)
            for part in range(6):
              plgpu.copy_gmem_to_smem(
                  refs.joint_w_g.at[pl.ds((part % 3) * rank + first_unit, units),
                                    pl.ds((part // 3) * rank, rank)],
                  refs.update_w_s.at[part // 3].at[pl.ds((part % 3) * units, units)],
                  refs.update_w_bar)
          else:
            plgpu.copy_gmem_to_smem(
                refs.gate_w_g.at[pl.ds(first_unit, units),
                                 pl.ds(refs.gate_w_g.shape[1] - rank, rank)],
                refs.update_w_s, refs.update_w_bar)
          if plan.split:
            refs.update_flag_s[0] = jnp.int32(0)
          plgpu.barrier_wait(refs.update_w_bar)
        leader_only(resident_update_rows)
      if plan.scaled:
        plgpu.barrier_wait(refs.w2_scale_bar.at[wg])

    if not spec.greedy:
      seeds = (refs.seed_g[0], refs.seed_g[1])
      row_scale = _load(refs.scale_g.at[pl.ds(0, batch_width)], per_batch_row,
                        optimized=False)
      row_noise = _load(refs.noise_g.at[pl.ds(0, batch_width)], per_batch_row,
                        optimized=False) != 0

    def step_body(step, flags):
      with jax.named_scope("z_wait"):
        def stage_z():
          # (Loaded before the gather is waited for, so the latencies overlap.)
          hoisted = (table_hoisted(step) if plan.gate_table
                     else joint_terms(refs.gate_hoisted_g.at[step]) if plan.joint_table
                     else None)
          # J_s s_{k-1}, published at step k - 1 (a step 0's slot is never written:
          # masked there, s_{-1} = 0).
          published = joint_terms(refs.ppub_g.at[step]) if plan.joint_table else None
          plgpu.barrier_wait(refs.z_bar)
          # The staged rows into the swizzled WGMMA tile(s) (a register round trip: a bulk
          # copy cannot swizzle), then ordered before the WGMMAs' async-proxy reads.
          # int8: q_hi, q_lo; e of a head's update: the gate's operand (then z's lo half)
          # or the rnn update's (then z's hi half).
          tiles = (plane_tiles() if planes else []
                   if plan.token_table else
                   [refs.za_s.at[1]] if gated else [refs.za_s.at[0]] if plan.recurrent
                   else [refs.za_s])
          for plane, tile_ref in enumerate(tiles):
            tile_ref[...] = _load(refs.z_s.at[:, pl.ds(plane * rank, rank)], z_layout)
          if plan.gate_table:
            with jax.named_scope("update"):
              table_gate(hoisted)
          if plan.joint_table:
            with jax.named_scope("update"):
              joint_update(step, hoisted, published)
          plgpu.commit_smem()
          if (gated and not plan.gate_table) or plan.split:
            with jax.named_scope("update"):
              (split_update if plan.split else gate)(step)
          if wgs > 1:
            plgpu.barrier_arrive(refs.za_bar)
        if wgs > 1:
          pl.when(leader)(stage_z)
          pl.when(jnp.logical_not(leader))(lambda: plgpu.barrier_wait(refs.za_bar))
        else:
          stage_z()
        if planes:
          plane_scale = lax.broadcast_in_dim(row_plane_scale(), tile, (batch_axis,))
      if not spec.greedy:
        streams = sampling.stream_key(seeds, row_ids + spec.row_offset, step)
        streams = lax.broadcast_in_dim(streams, tile, (batch_axis,))
        scale = lax.broadcast_in_dim(row_scale, tile, (batch_axis,))
        noise_on = lax.broadcast_in_dim(row_noise, tile, (batch_axis,))
      def locate(position):
        """The chunk at ``position``: (resident?, its ring index j, its slot, its id)."""
        resident, index, j = chunk_kind(position)
        # The ring runs on across steps: a chunk's slot is its place in the walk's stream.
        ring = _rem(stream_index(step, j), stages) if stages else 0
        return (resident, j, ring, _select(resident, index, lambda: res + ring),
                _select(resident, index, lambda: streamed_chunk(step, j)), index)

      def await_chunk(position):
        """Wait for the chunk's W2. Before its accumulators exist: their zeros and
        ``wgmma.fence`` must reach the WGMMA with no branch between, else ptxas
        inserts a fence of its own at the WGMMA, which inside a warpgroup's branch of
        the kernel serializes every WGMMA of the kernel (its C7520 report)."""
        resident, _, ring, _, _, index = locate(position)
        with jax.named_scope("wait"):
          if res:   # once: the resident chunks copied in the prologue have landed
            _when(_and(_and(resident, index == 0), step == 0),
                  lambda: plgpu.barrier_wait(refs.res_bar.at[wg]))
          if stages:
            _when(_not(resident), lambda: plgpu.barrier_wait(ring_barrier(ring)))
        if spec.lab.probe_skew:
          with jax.named_scope("skew"):
            plgpu.commit_smem()

      def issue(position, acc_refs):
        """Issue the chunk's WGMMA(s) (asynchronous; its W2 awaited: ``await_chunk``)."""
        slot = locate(position)[3]
        with jax.named_scope("mma"):
          # int8 planes: a plane an accumulator; a hi + lo pair: both into one; either
          # with ``pair_on_n``: both halves' rows in one operand, one accumulator.
          if plan.pair_on_n:
            operands = [(acc_refs[0], refs.za_s
                         if planes or plan.token_table
                         else refs.za_s.at[0])]
          elif planes or plan.z_pair:
            operands = [(acc_refs[plane if planes else 0], refs.za_s.at[plane])
                        for plane in range(2)]
          else:
            operands = [(acc_refs[0], refs.za_s)]
          chunk_ref = refs.w_s.at[slot_base(wg) + slot]
          if plan.widened_in_kernel:
            chunk_ref = widened(chunk_ref)
          for acc_ref, z in operands:
            if n_major:   # the chunk is the A operand, the batch rows' z the B operand
              plgpu.wgmma(acc_ref, chunk_ref, z.at[pl.ds(0, n_width)].T)
            else:
              plgpu.wgmma(acc_ref, z, chunk_ref.T)

      def widened(chunk_ref):
        """An int8 chunk as a bf16 WGMMA operand: loaded in the layout whose upcast is
        the WGMMA's (4 bytes a load), converted (exact: |q| <= 127), then either kept in
        registers (the A operand, batch on N) or stored to the warpgroup's bf16 tile
        and fenced for the WGMMA, as either operand (no WGMMA reads the tile past its
        chunk: ``finish`` waits before the next issue)."""
        with jax.named_scope("widen"):
          values = _load(chunk_ref, plgpu.Layout.WGMMA_UPCAST_2X, optimized=True)
          values = plgpu.layout_cast(values.astype(jnp.bfloat16), _WGMMA)
          if plan.w2_widening == "registers":
            return values
          tile_ref = refs.widen_s.at[wg]
          tile_ref[...] = values
          plgpu.commit_smem()
          return tile_ref

      def finish(position, acc_refs, in_flight=0):
        """The chunk's logits less the base: its accumulator(s), read when complete
        (``in_flight``: the WGMMAs issued after this chunk's, left running).
        int8 planes: D = 256 · d_hi + d_lo exact in int32, then (f32(D) · s_lo) · scale2,
        the order of wts_jax.int8_state. ``plan.w2_row_scale``: the fp32 sum times the
        vocabulary rows' scales, as ``SerialHead.vocab_bias`` scales it."""
        def read(acc_ref):
          return plgpu.wgmma_accumulator_load(acc_ref, wait_n=in_flight)
        def vocab_scale():
          c = locate(position)[4]
          scales = _load(refs.w2_scale_s.at[wg * chunks + c],
                         _PER_ROW if n_major else _PER_COLUMN)
          return lax.broadcast_in_dim(scales, tile, (vocab_axis,))
        def row_scaled(logits):
          return logits * vocab_scale() if plan.w2_row_scale else logits
        with jax.named_scope("mma_wait"):
          if plan.pair_on_n:   # the halves' columns: [0, rows) and [lo_offset, + rows)
            both = read(acc_refs[0])
            first = both[:, :rows]
            second = both[:, plan.lo_offset:plan.lo_offset + rows]
            if not planes:
              return row_scaled(first + second)
            d_hi, d_lo = first, second
          elif not planes:
            return row_scaled(read(acc_refs[0]))
          else:
            d_hi, d_lo = (read(acc_ref) for acc_ref in acc_refs)
          return (d_hi * LO_STEPS + d_lo).astype(jnp.float32) * plane_scale * vocab_scale()

      def wgmma_groups():
        """WGMMA groups a chunk issues (``issue``): one, or two for the int8 planes or
        a hi + lo pair unless they share one (``plan.pair_on_n``)."""
        return 1 if plan.pair_on_n or not (planes or plan.z_pair) else 2

      def accumulators():
        dtype = jnp.int32 if planes else jnp.float32
        if plan.pair_on_n:
          return [plgpu.ACC((CHUNK_ROWS, n_width), dtype)]
        return [plgpu.ACC(tile, dtype)] * (2 if planes else 1)

      def epilogue(position, logits, carry):
        """Base logits added and the chunk folded into ``carry``, then its base slot and
        (streamed) ring slot refilled. Batch on M: the chunk's top-1 per row into the
        row's best (score, index); batch on N: every accumulator element into its own
        best (score, vocab row), reduced over the vocabulary once a step."""
        best_value, best_index, nan_seen = carry
        resident, j, ring, _, c, _ = locate(position)
        base_slot = base_slot_of(step, position)
        if refill_before_epilogue:
          with jax.named_scope("refill"):
            if stages and not plan.producer:
              # Every warp past its wait for the WGMMA (a warpgroup barrier) before one
              # thread's copy overwrites the slot: a warp's wait completes its own part.
              # (After the epilogue the base slot's barrier is this one; a producer
              # waits for every thread's release.)
              plgpu.commit_smem()
            release_ring_slot(resident, j, ring)
        with jax.named_scope("epilogue"):
          with jax.named_scope("base_wait"):   # (profile region: the base copy's latency)
            plgpu.barrier_wait(refs.base_bar.at[base_slot])
          if n_major:   # the [rows, 64] tile read transposed
            base = _load(refs.base_s.at[base_slot, pl.ds(0, rows)].T, _WGMMA,
                         optimized=False)
          else:
            base = _load(refs.base_s.at[base_slot], _WGMMA)
          logits = logits + base.astype(jnp.float32)
          vocab_rows = chunk_start(c) + vocab_ids
          if spec.greedy:
            scores = logits
          else:
            noise = sampling.gumbel_from_uniform(
                sampling.uniform_from_stream(streams, vocab_rows))
            scores = logits * scale + jnp.where(noise_on, noise, 0.0)
          if n_major:
            nan_seen = nan_seen | jnp.where(logits != logits, 1, 0)
            top, top_index = scores, vocab_rows
          else:
            top = scores.max(axis=1)
            if spec.greedy and not spec.interpret:
              # The maximum propagates NaN (Mosaic's max.NaN): a row's top is NaN exactly
              # where one of its logits is, so no reduction of its own. (Interpreted, the
              # maximum is XLA CPU's, which skips NaN: the reduction stays.)
              nan_seen = nan_seen | jnp.where(top != top, 1, 0)
            else:
              nan_seen = nan_seen | jnp.where(logits != logits, 1, 0).max(axis=1)
            top_index = jnp.where(scores == lax.broadcast_in_dim(top, scores.shape, (0,)),
                                  vocab_rows, _BIG_INDEX).min(axis=1)
          better = (top > best_value) | ((top == best_value) & (top_index < best_index))
          best_value = jnp.where(better, top, best_value)
          best_index = jnp.where(better, top_index, best_index)
        with jax.named_scope("refill"):
          if plan.producer:   # the slots released to the producer: arrivals, no wait
            # Every warp's reads of the base slot done and ordered before the producer's
            # TMA: an arrival alone let the TMA overwrite a slot still being read (tokens
            # differed on the H200, most at 64 rows on N).
            plgpu.commit_smem()
            plgpu.barrier_arrive(refs.base_free_bar.at[base_slot])
          else:
            # Every warp's reads of the base slot before the TMA refills it.
            plgpu.commit_smem()
            next_step, next_position = base_after(step, position)
            _when(next_step < spec.steps, lambda: copy_base(next_step, next_position))
          if not refill_before_epilogue:
            release_ring_slot(resident, j, ring)
        return best_value, best_index, nan_seen

      def release_ring_slot(resident, j, ring):
        """A streamed chunk's W2 ring slot refilled with the stream entry ``stages``
        later (every warp past its wait for the chunk's WGMMA: the warpgroup barrier
        before the call), or with a producer released to it by every thread's
        arrival."""
        if not stages:
          return
        if plan.producer:
          _when(_not(resident),
                lambda: plgpu.barrier_arrive(refs.ring_free_bar.at[wg * stages + ring]))
        else:
          _when(_and(ring_refill_due(step, j), _not(resident)),
                lambda: refill_ring_after(step, j))

      carry_shape, carry_layout = (tile, _WGMMA) if n_major else ((BATCH_TILE,), _PER_ROW)
      carry = tuple(plgpu.layout_cast(jnp.full(carry_shape, value, dtype), carry_layout)
                    for value, dtype in ((_NEG_INF, jnp.float32), (0, jnp.int32),
                                         (0, jnp.int32)))
      # One loop, not one code copy a chunk: unrolled, the copies spilled registers
      # (NOTES v10).
      def chunk(position, carry):
        await_chunk(position)
        def product(*acc_refs):
          issue(position, acc_refs)
          return finish(position, acc_refs)
        return epilogue(position, pl.run_scoped(product, *accumulators()), carry)

      def overlapped_chunks(first, count, carry):
        """``plan.overlap_chunks``: chunks [first, first + count) with each chunk's
        WGMMAs issued before the previous chunk's accumulators are read (a wait that
        leaves the newer WGMMA group(s) running) and its epilogue. Each chunk's
        accumulators are a scope nested in the previous one's (a scope's accumulators
        start as zeros; an accumulator cannot be re-zeroed in interpret mode), so the
        last chunk of a group waits for its own WGMMAs."""
        groups = wgmma_groups()

        def nest(i, previous, carry):
          if i == count:
            return epilogue(first + i - 1, finish(first + i - 1, previous), carry)
          await_chunk(first + i)
          def scope(*acc_refs):
            issue(first + i, acc_refs)
            folded = carry
            if previous is not None:
              folded = epilogue(first + i - 1,
                                finish(first + i - 1, previous, in_flight=groups), folded)
            return nest(i + 1, acc_refs, folded)
          return pl.run_scoped(scope, *accumulators())
        return nest(0, None, carry)

      if plan.overlap_chunks > 1:
        group = plan.overlap_chunks
        carry = lax.fori_loop(
            0, chunks // group,
            lambda k, carry: overlapped_chunks(k * group, group, carry), carry)
        if chunks % group:
          carry = overlapped_chunks(chunks - chunks % group, chunks % group, carry)
      else:
        carry = lax.fori_loop(0, chunks, chunk, carry)

      def reduced(carry):
        """(best value, its index, NaN flag) per batch row of ``carry`` (this
        warpgroup's chunks, or on N with ``plan.merge_tiles`` both warpgroups').
        Mosaic's cross-warp reductions (over the vocabulary on N, the NaN flag over the
        rows) share one scratch buffer among warpgroups: two warpgroups reduce in turn."""
        best_value, best_index, nan_seen = carry
        if n_major:   # over the vocabulary (axis 0): the best per batch column
          with jax.named_scope("column_reduce"):
            nan_seen = nan_seen.max(axis=0)
            top = best_value.max(axis=0)
            best_index = jnp.where(best_value == lax.broadcast_in_dim(top, tile, (1,)),
                                   best_index, _BIG_INDEX).min(axis=0)
            best_value = top
        nan_flag = jnp.where((nan_seen * jnp.where(row_ids < spec.batch, 1, 0)).max() > 0,
                             STATUS_NAN_LOGITS, 0)
        return best_value, best_index, nan_flag

      if wgs == 1:
        best_value, best_index, nan_flag = reduced(carry)
        return flags | nan_flag | exchange(step, best_value, best_index, flags | nan_flag)

      merge_tiles = (refs.merge_tile_value_s, refs.merge_tile_index_s,
                     refs.merge_tile_nan_s) if plan.merge_tiles else None

      def hand_over():   # warpgroup 1: its bests to the leader, then the next step
        if plan.merge_tiles:   # every element's, unreduced: the leader reduces once
          for tile_ref, part in zip(merge_tiles, carry):
            _store(tile_ref, part)
          plgpu.barrier_arrive(refs.merge_bar)
          return jnp.int32(0)   # (its NaNs are in the leader's reduction)
        best_value, best_index, nan_flag = reduced(carry)
        refs.merge_value_s[pl.ds(0, batch_width)] = best_value
        refs.merge_index_s[pl.ds(0, batch_width)] = best_index
        if status_in_kernel:   # (the leader counts it: this warpgroup reports nothing)
          refs.merge_flag_s[0] = nan_flag
        plgpu.barrier_arrive(refs.merge_bar)
        return nan_flag

      def better_of(value, index, other_value, other_index):
        """Where the other candidate wins: a higher score, or the same and a lower
        index (the walk's tie rule)."""
        return (other_value > value) | ((other_value == value) & (other_index < index))

      def merge_and_exchange():
        # (The exchange outside the profile's "merge" region, so that region is the wait
        # for warpgroup 1 and the merge alone.)
        with jax.named_scope("merge"):
          plgpu.barrier_wait(refs.merge_bar)   # also: warpgroup 1 has reduced or stored
          if plan.merge_tiles:   # element by element, then one reduction of both
            value, index, nan_seen = carry
            other_value, other_index, other_nan = (
                _load(tile_ref, _WGMMA, optimized=False) for tile_ref in merge_tiles)
            better = better_of(value, index, other_value, other_index)
            best_value, best_index, nan_flag = reduced(
                (jnp.where(better, other_value, value), jnp.where(better, other_index, index),
                 jnp.maximum(nan_seen, other_nan)))
          else:
            best_value, best_index, nan_flag = reduced(carry)
            other_value = _load(refs.merge_value_s.at[pl.ds(0, batch_width)], per_batch_row,
                                optimized=False)
            other_index = _load(refs.merge_index_s.at[pl.ds(0, batch_width)], per_batch_row,
                                optimized=False)
            better = better_of(best_value, best_index, other_value, other_index)
            best_value = jnp.where(better, other_value, best_value)
            best_index = jnp.where(better, other_index, best_index)
            if status_in_kernel:
              nan_flag = nan_flag | refs.merge_flag_s[0]
        return nan_flag | exchange(step, best_value, best_index, flags | nan_flag)
      return flags | lax.cond(leader, merge_and_exchange, hand_over)

    def exchange(step, best_value, best_index, held):
      """The leader's end of a step: each row's winner over the grid, the tokens to
      ``tok_s`` (and by block 0 to ``tok_g``), the next step's z requested. Returns the
      timeout flag. ``held``: the block's status bits so far (``spec.status="kernel"``:
      counted at the last step, before its signal)."""
      timed_out = jnp.int32(0)
      if multi_block:
        # Each row's winner by the L2's atomics on one key per (step, row) (grid_sync).
        step_slots = keys_g.at[pl.ds(step * _STEP_KEY_WORDS, _STEP_KEY_WORDS)]
        with jax.named_scope("publish"):
          high, low = grid_sync.orderable_key(best_value, best_index)
          refs.keys_s[0, pl.ds(0, batch_width)] = high
          refs.keys_s[1, pl.ds(0, batch_width)] = low
          grid_sync.publish_keys(refs.keys_s, step_slots, batch_width)
        if status_in_kernel:   # (released by the step's signal below)
          pl.when(step == spec.steps - 1)(functools.partial(count_status_bits, held))
        with jax.named_scope("grid_sync"):
          timed_out = grid_sync.signal_and_poll(sem, blocks, step, spin_limit=spec.spin_limit)
        with jax.named_scope("exchange_reduce"):
          grid_sync.collect_keys(step_slots, refs.keys_s, batch_width)
          plgpu.commit_smem()   # every row's winning key stored before any thread reads it
          token = grid_sync.key_index(_load(refs.keys_s.at[1, pl.ds(0, batch_width)],
                                            per_batch_row, optimized=False))
      else:
        token = best_index
      with jax.named_scope("tokens"):
        tokens = jnp.clip(token, 0, vocab - 1)   # a NaN row is flagged, not followed
        refs.tok_s[pl.ds(0, batch_width)] = tokens

      @pl.when(block == 0)
      def _():
        if n_major:   # [K, 64]: a column-layout vector stores contiguously only
          _store(refs.tok_g, tokens, (step, pl.ds(0, batch_width)))
        else:
          _store(refs.tok_g, tokens, (slice(None), step))

      @pl.when(step + 1 < spec.steps)
      def _():
        # The z staging's generic reads (this step's WGMMA tile) and the tokens' stores
        # before the bulk copies.
        plgpu.commit_smem()
        with jax.named_scope("gather"):   # (profile region: issuing the rows' copies)
          gather_z()
      return jnp.where(timed_out > 0, STATUS_SYNC_TIMEOUT, 0)

    flags = lax.fori_loop(0, spec.steps, step_body, first_tokens_flag(given_first))
    if plan.split:
      flags = flags | update_timeout()
    if not status_in_kernel:
      refs.flag_g[block * threads + wg] = flags
      return

    @pl.when(leader & (block == 0))
    def _():   # (past the last step's barrier: every block's counts are in)
      total = flags
      for i, bit in enumerate(KERNEL_STATUS_BITS if multi_block else ()):
        total = total | jnp.where(pl.semaphore_read(bit_counts_g.at[i]) > 0, bit, 0)
      refs.flag_g[0] = total

  def update_timeout():
    """The leader's split-update time-out bit (its own barrier's, ``split_update``)."""
    return jnp.where(leader & (refs.update_flag_s[0] > 0), STATUS_SYNC_TIMEOUT, 0)

  def count_status_bits(held):
    """The leader's last step: one added to the counter of each status bit the block
    holds (``spec.status="kernel"``), before the step's grid signal. A split update's
    last wait is this step's first, so its time-out is in too."""
    if plan.split:
      held = held | update_timeout()
    for i, bit in enumerate(KERNEL_STATUS_BITS):
      pl.when((held & bit) != 0)(functools.partial(
          plgpu.semaphore_signal, bit_counts_g.at[i], 1, memory_scope="gpu"))

  def producer():
    """The copying warpgroup: every refill of the W2 ring and the base ring, each issued
    once its slot is released by the consumer's arrivals (in the order the consumers
    read them, consumer by consumer), so no computing warp waits on a copy's issue."""
    if wgs > 1:
      plgpu.set_max_registers(PRODUCER_REGISTERS, action="decrease")
    refill_all()
    if not status_in_kernel:
      refs.flag_g[block * threads + wg] = jnp.int32(0)

  def refill_all():
    """Every refill the consumers' releases allow, in their order, then the last
    releases observed."""
    def refill(step, position, owner):
      next_step, next_position = base_after(step, position)
      def refill_base():
        plgpu.barrier_wait(refs.base_free_bar.at[base_slot_of(step, position, owner)])
        copy_base(next_step, next_position, owner)
      _when(next_step < spec.steps, refill_base)
      if stages:
        resident, _, j = chunk_kind(position)
        def refill_ring():
          plgpu.barrier_wait(refs.ring_free_bar.at[
              owner * stages + _rem(stream_index(step, j, owner), stages)])
          refill_ring_after(step, j, owner)
        _when(_and(ring_refill_due(step, j, owner), _not(resident)), refill_ring)

    def position_loop(step):
      def body(position, carry):
        for owner in range(wgs):
          refill(step, position, owner)
        return carry
      return body
    lax.fori_loop(0, spec.steps,
                  lambda step, carry: lax.fori_loop(0, chunks, position_loop(step), carry),
                  jnp.int32(0))
    # The last reads of every slot were released and never refilled: their phases
    # observed, so no arrival is pending when the kernel ends.
    for owner in range(wgs):
      for slot in range(base_stages):
        plgpu.barrier_wait(refs.base_free_bar.at[owner * base_stages + slot])
      for ring in range(min(stages, stream_total(owner))):
        plgpu.barrier_wait(refs.ring_free_bar.at[owner * stages + ring])

  if plan.producer:
    pl.when(wg == wgs)(producer)
    pl.when(wg < wgs)(consumer)
  else:
    consumer()


def batched_walk(spec: BatchedSpec, w2, base_logits, w1, first_tokens, seed=None,
                 score_scale=None, noise_on=None, w2_scale=None, w1_scale=None,
                 gate_weight=None, gate_hoisted=None, joint_weight=None,
                 joint_hoisted=None):
  """Launch the kernel once; returns (tokens [B, K] int32, status int32 scalar).
  ``base_logits`` [B, K, V]; padded here to whole 64-column tiles when V is not a
  multiple of 64 and, with the batch on M, to the plan's ``batch_rows`` when B is not a
  multiple of 8 (the base tiles are copied as whole TMA tiles).
  ``plan.int8_state``: ``w2`` int8 with its per-row ``w2_scale`` [V]; ``w1`` is W1's
  interleaved int8 planes [2V, r] and ``w1_scale`` their ``s_lo`` [V]
  (``wts_jax.int8_state.interleaved_planes``). Otherwise bf16 W1 and W2, and with
  ``plan.w2_row_scale`` W2 is an int8 W2's values widened to bf16 (or, widened in the
  kernel, the int8 W2 itself), ``w2_scale`` [V] its per-row scales.
  ``plan.gated``: ``gate_weight`` is ``gate_proj.weight`` [r, d + r] (bf16, inputs
  [h ; e]) and ``gate_hoisted`` its hidden-side terms [B, K, r] f32
  (``GatedMarkovHead.hoist``); with ``plan.gate_table`` ``w1`` is the head's gate table
  [V, 3r] int16 (``wts_jax.gate_table.gate_rows``) and G_e is not read; with
  ``plan.joint_table`` ``w1`` is the rnn head's joint table [V, 6r] int16
  (``wts_jax.joint_table.joint_rows``) and only J_s of ``joint_weight`` is read.
  ``plan.recurrent``: ``joint_weight`` is ``joint_proj.weight`` [3r, 2r + d] (bf16,
  inputs [s ; e ; h]) and ``joint_hoisted`` its hidden-side terms [B, K, 3r] f32
  (``RecurrentHead.hoist``)."""
  plan, batch, steps = spec.plan, spec.batch, spec.steps
  rank, vocab = plan.rank, plan.vocab_size
  n_major = plan.batch_axis == "n"
  if (gate_weight is None or gate_hoisted is None) == plan.gated:
    raise ValueError("a gated plan needs gate_weight and gate_hoisted, and only it")
  if (joint_weight is None or joint_hoisted is None) == plan.recurrent:
    raise ValueError("an rnn plan needs joint_weight and joint_hoisted, and only it")
  if plan.recurrent and (joint_weight.dtype != jnp.bfloat16
                         or joint_weight.shape[0] != 3 * rank
                         or joint_hoisted.shape != (batch, steps, 3 * rank)):
    raise ValueError(f"the rnn kernel needs a bf16 joint_proj.weight [{3 * rank}, "
                     f"{2 * rank} + d] and hoisted terms [{batch}, {steps}, {3 * rank}] "
                     f"(got {joint_weight.dtype}{list(joint_weight.shape)}, "
                     f"{list(joint_hoisted.shape)})")
  if plan.gated and (gate_weight.dtype != jnp.bfloat16 or gate_weight.shape[0] != rank
                     or gate_hoisted.shape != (batch, steps, rank)):
    raise ValueError(f"the gated kernel needs a bf16 gate_proj.weight [{rank}, d + {rank}] "
                     f"and hoisted terms [{batch}, {steps}, {rank}] (got "
                     f"{gate_weight.dtype}{list(gate_weight.shape)}, "
                     f"{list(gate_hoisted.shape)})")
  if plan.gate_table and (w1.shape != (vocab, 3 * rank) or w1.dtype != jnp.int16):
    raise ValueError(f"a gate-table plan needs the head's gate table [{vocab}, {3 * rank}] "
                     f"int16 as w1 (got {w1.dtype}{list(w1.shape)})")
  if plan.joint_table and (w1.shape != (vocab, 6 * rank) or w1.dtype != jnp.int16):
    raise ValueError(f"a joint-table plan needs the head's joint table [{vocab}, "
                     f"{6 * rank}] int16 as w1 (got {w1.dtype}{list(w1.shape)})")
  if plan.int8_state:
    if (w2.dtype != jnp.int8 or w2_scale is None or w1.dtype != jnp.int8
        or w1.shape != (2 * vocab, rank) or w1_scale is None):
      raise ValueError("an int8-planes plan needs an int8 W2 with scales and W1's planes "
                       f"[2V, r] int8 with theirs (got W2 {w2.dtype}, W1 {w1.dtype}"
                       f"{list(w1.shape)})")
    w1 = w1.reshape(vocab, 2 * rank)                  # a token's two planes side by side
    w1_scale = w1_scale.astype(jnp.float32)
  elif (w2.dtype != (jnp.int8 if plan.widened_in_kernel else jnp.bfloat16)
        or w1.dtype != (jnp.int16 if plan.token_table else jnp.bfloat16)):
    raise ValueError("the batched walk needs a bf16 W1 and a bf16 W2, or an int8 W2 to "
                     f"widen in the kernel (got {w1.dtype}, {w2.dtype})")
  if plan.w2_row_scale and (w2_scale is None or w2_scale.shape != (vocab,)):
    raise ValueError(f"a w2_row_scale plan needs W2's per-row scales [{vocab}] (got "
                     f"{None if w2_scale is None else list(w2_scale.shape)})")
  rows = plan.batch_rows
  # On M base tiles are [8-row, 64-column] TMA tiles: rows padded to the plan's. On N a
  # tile is untiled and a copy brings the batch's rows as given (the kernel zeroes the
  # rest of each slot once): padding them would copy all the base logits before the
  # launch. The columns are whole tiles either way: where V is not a multiple of 64, the
  # last tile holds the rows [V - 64, V), the last chunk's (its start clamped so as not to
  # read W2 past V), so that its base tile starts on a tile (``base_start``).
  tail = vocab % CHUNK_ROWS
  if tail:
    base_logits = jnp.concatenate([base_logits[:, :, :vocab - tail],
                                   base_logits[:, :, vocab - CHUNK_ROWS:]], axis=2)
  row_pad = 0 if n_major else rows - base_logits.shape[0]
  if row_pad:
    base_logits = jnp.pad(base_logits, ((0, row_pad), (0, 0), (0, 0)))
  wgs = plan.warpgroups
  threads = wgs + (1 if plan.producer else 0)
  slots = wgs * (plan.resident_chunks + plan.ring_stages)
  base_dtype = base_logits.dtype
  w_itemsize = jnp.dtype(w2.dtype).itemsize
  if (plan.int8_state or plan.token_table) and plan.pair_on_n:
    # (one above the other)
    a_tile = (2 * plan.staged_rows, rank)
  elif plan.int8_state or plan.z_pair:
    a_tile = (2, plan.staged_rows, rank)
  else:
    a_tile = (plan.staged_rows, rank)
  # The WGMMA tile's (a table's staging holds int16 words).
  z_dtype = jnp.bfloat16 if plan.token_table else w1.dtype
  scratch = {
      "w_s": plgpu.SMEM((slots, CHUNK_ROWS, rank), w2.dtype,
                        transforms=_w2_transforms(w_itemsize, rank)),
      "za_s": plgpu.SMEM(a_tile, z_dtype, transforms=_w2_transforms(plan.z_itemsize, rank)),
      # Batch on N reads the base tile transposed: untiled.
      "base_s": plgpu.SMEM((wgs * plan.base_stages, plan.base_rows, CHUNK_ROWS), base_dtype,
                           transforms=() if plan.batch_axis == "n"
                           else _base_transforms(jnp.dtype(base_dtype).itemsize)),
      "tok_s": plgpu.SMEM((BATCH_TILE,), jnp.int32),
      "keys_s": plgpu.SMEM((2, BATCH_TILE), jnp.uint32),   # exchange keys: high, low words
      "res_bar": plgpu.Barrier(num_arrivals=max(1, plan.resident_chunks), num_barriers=wgs),
      "ring_bar": plgpu.Barrier(num_arrivals=1, num_barriers=wgs * max(1, plan.ring_stages)),
      "base_bar": plgpu.Barrier(num_arrivals=1, num_barriers=wgs * plan.base_stages),
      # A base slot read by every thread of its warpgroup (one arrival each).
      "base_free_bar": plgpu.Barrier(num_arrivals=1, num_barriers=wgs * plan.base_stages),
      # A row's copies each.
      "z_bar": plgpu.Barrier(num_arrivals=gathered_z_rows(spec), num_barriers=1),
      "z_s": plgpu.SMEM((plan.staged_rows, plan.z_row_bytes // plan.z_itemsize), w1.dtype),
  }
  if plan.w2_widening == "smem":
    scratch["widen_s"] = plgpu.SMEM((wgs, CHUNK_ROWS, rank), jnp.bfloat16,
                                    transforms=_w2_transforms(2, rank))
  if plan.scaled:
    scratch["w2_scale_s"] = plgpu.SMEM((plan.chunks, CHUNK_ROWS), jnp.float32)
    scratch["w2_scale_bar"] = plgpu.Barrier(num_arrivals=plan.wg_chunks, num_barriers=wgs)
  if plan.int8_state:
    scratch["row_scale_s"] = plgpu.SMEM((BATCH_TILE,), jnp.float32)
  if plan.producer:   # slots released to the producer, by every consumer thread
    scratch["ring_free_bar"] = plgpu.Barrier(num_arrivals=1,
                                             num_barriers=wgs * max(1, plan.ring_stages))
  if wgs > 1:
    scratch["za_bar"] = plgpu.Barrier(num_arrivals=1, num_barriers=1)
    scratch["merge_bar"] = plgpu.Barrier(num_arrivals=1, num_barriers=1)
    scratch["merge_value_s"] = plgpu.SMEM((BATCH_TILE,), jnp.float32)
    scratch["merge_index_s"] = plgpu.SMEM((BATCH_TILE,), jnp.int32)
    if spec.status == "kernel" and not plan.merge_tiles:
      scratch["merge_flag_s"] = plgpu.SMEM((1,), jnp.int32)
    if plan.merge_tiles:   # warpgroup 1's per-element bests, [64 vocab rows, rows]
      for name, dtype in (("value", jnp.float32), ("index", jnp.int32), ("nan", jnp.int32)):
        scratch[f"merge_tile_{name}_s"] = plgpu.SMEM((CHUNK_ROWS, rows), dtype)
  outputs = {"tok_g": jax.ShapeDtypeStruct((steps, BATCH_TILE) if n_major
                                           else (BATCH_TILE, steps), jnp.int32),
             "flag_g": jax.ShapeDtypeStruct(
                 (1,) if spec.status == "kernel" else (plan.num_blocks * threads,),
                 jnp.int32)}
  operands = {"w2_g": w2, "base_g": base_logits}
  # The first tokens as they come (the kernel clamps them and reports those outside
  # [0, V)), padded only where the kernel's first load is wider than the batch.
  first_width = rows if n_major else BATCH_TILE
  operands.update(w1_g=w1, first_g=jnp.pad(first_tokens.astype(jnp.int32),
                                           (0, first_width - batch)))
  if plan.scaled:
    operands.update(w2_scale_g=w2_scale.astype(jnp.float32))
  if plan.int8_state:
    operands.update(w1_scale_g=w1_scale)
  def hoisted_padded(hoisted):
    """[B, K, n] -> [64 rows, K, n] f32 (rows past B zero): a split update's block reads
    its units' columns of a step with the rows' stride."""
    return jnp.pad(hoisted.astype(jnp.float32), ((0, BATCH_TILE - batch), (0, 0), (0, 0)))
  if plan.gated:
    if plan.gate_table:   # the staged rows' terms as int16 halves: [K, 2, rows, r]
      halves = jnp.stack(gate_table.f32_halves(gate_hoisted), axis=2)   # [B, K, 2, r]
      operands.update(gate_hoisted_g=jnp.pad(
          halves, ((0, plan.staged_rows - batch), (0, 0), (0, 0), (0, 0))
      ).transpose(1, 2, 0, 3))
    else:
      hoisted = hoisted_padded(gate_hoisted)
      if not plan.gate_split:   # whole [64 rows, 64] tiles a step and G_e chunk
        hoisted = hoisted.transpose(1, 0, 2).reshape(
            steps, BATCH_TILE, rank // CHUNK_ROWS, CHUNK_ROWS).transpose(0, 2, 1, 3)
      operands.update(gate_w_g=gate_weight, gate_hoisted_g=hoisted)
  if plan.joint_table:   # the staged rows' terms as int16 halves: [K, 2, 3, rows, r]
    halves = jnp.stack(gate_table.f32_halves(joint_hoisted), axis=2)   # [B, K, 2, 3r]
    halves = halves.reshape(batch, steps, 2, 3, rank)
    operands.update(joint_w_g=joint_weight, gate_hoisted_g=jnp.pad(
        halves, ((0, plan.staged_rows - batch),) + ((0, 0),) * 4).transpose(1, 2, 3, 0, 4))
    outputs["ppub_g"] = jax.ShapeDtypeStruct((steps, 2, 3, BATCH_TILE, rank), jnp.int16)
    scratch["state_s"] = plgpu.SMEM((plan.staged_rows, rank), jnp.float32)
    scratch["state_tile_s"] = plgpu.SMEM((BATCH_TILE, rank), jnp.bfloat16,
                                         transforms=_w2_transforms(2, rank))
    scratch["update_w_s"] = plgpu.SMEM((3 * plan.update_units, rank), jnp.bfloat16,
                                       transforms=_w2_transforms(2, rank))
    scratch["update_w_bar"] = plgpu.Barrier(num_arrivals=3, num_barriers=1)
  elif plan.recurrent:
    operands.update(joint_w_g=joint_weight, gate_hoisted_g=hoisted_padded(joint_hoisted))
  if plan.split:   # the split update's global buffers (outputs, discarded) and weights
    outputs["zpub_g"] = jax.ShapeDtypeStruct((steps, 2, BATCH_TILE, rank), jnp.bfloat16)
    scratch["pub_bar"] = plgpu.Barrier(num_arrivals=2, num_barriers=1)
    if plan.recurrent:
      outputs["spub_g"] = jax.ShapeDtypeStruct((steps, 2, BATCH_TILE, rank), jnp.bfloat16)
      scratch["state_bar"] = plgpu.Barrier(num_arrivals=1, num_barriers=1)
      scratch["state_s"] = plgpu.SMEM((BATCH_TILE, plan.update_units), jnp.float32)
    copies = 6 if plan.recurrent else 1
    scratch["update_w_s"] = plgpu.SMEM(
        ((2, 3 * plan.update_units) if plan.recurrent else (plan.update_units,)) + (rank,),
        jnp.bfloat16,
        transforms=_w2_transforms(2, rank))
    scratch["update_w_bar"] = plgpu.Barrier(num_arrivals=copies, num_barriers=1)
    scratch["update_flag_s"] = plgpu.SMEM((1,), jnp.int32)
  if not spec.greedy:
    def per_row(x, dtype):
      return jnp.zeros((BATCH_TILE,), dtype).at[:batch].set(x.astype(dtype))
    operands.update(seed_g=seed.astype(jnp.uint32),
                    scale_g=per_row(score_scale, jnp.float32),
                    noise_g=per_row(noise_on, jnp.int32))
  kernel = plgpu.kernel(
      functools.partial(_batched_kernel, spec=spec,
                        names=(*operands, *outputs, *scratch)),
      out_type=tuple(outputs.values()),
      grid=(plan.num_blocks,), grid_names=("blocks",),
      **(dict(num_threads=threads, thread_name="wg") if threads > 1 else {}),
      scratch_types=list(scratch.values()),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Lane,
          **(dict(profile_space=spec.lab.profile_space, profile_dir=spec.lab.profile_dir)
             if spec.lab.profile_dir else {})),
      interpret=_interpret_params() if spec.interpret else None,
  )
  tokens, flags = kernel(*operands.values())[:2]
  status = (flags.reshape(()) if spec.status == "kernel"
            else lax.reduce(flags, jnp.int32(0), lax.bitwise_or, (0,)))
  return (tokens.T if n_major else tokens)[:batch], status
