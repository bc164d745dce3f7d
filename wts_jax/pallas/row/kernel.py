"""The Weights-That-Stay walk as one persistent Mosaic GPU kernel (``plgpu.kernel``).

Why a second backend: Pallas Triton can keep W2 only in registers (a quarter of a bf16
rank-256 W2 at best, and it spills), and streams the rest one tile ahead. Mosaic GPU gives
us the shared memory and the TMA engine directly:

- block ``p`` (one per SM) owns ``chunks`` 64-row chunks of W2; the first
  ``resident_chunks`` are copied into shared memory once, in the prologue, and stay
  there for all K steps (the default plan keeps 2 beside a 2-slot ring unless everything
  fits: the fastest split measured at the Qwen3 shape); a step computes them
  between its streamed chunks, so the ring keeps streaming meanwhile;
- the other chunks are streamed through a ring of ``ring_stages`` shared-memory slots by
  TMA. W2 does not depend on the drafted tokens, so the ring runs ahead across step
  boundaries: while the blocks meet at the grid barrier, the next step's first chunks
  are already in flight. Odd steps stream in reverse order ("snake"): a step starts on
  the chunks the previous one read last, which the L2 still holds when W2 does not fit
  it (bf16 at r = 256: 78 MB against 60 MB);
- the base logits of step k + 1 are copied by TMA into shared memory during step k;
- per chunk W·z in fp32 — on tensor cores (a WGMMA against z staged in shared memory
  as W1 rows, exact for the vanilla head's bf16 z; an int8 chunk upcast in registers;
  optionally several chunks' WGMMAs before one wait) or as a register GEMV (fp32
  products and sums), int8 W2 times its row scales: the contract of
  ``SerialHead.vocab_bias`` —
  plus the base logits, then the chunk's greedy or Gumbel top-1 (the generator of
  ``wts_jax.sampling``) into per-lane candidates;
- per step each block publishes one (score, index) pair per batch row, signals a global
  semaphore (release), polls it with a bounded spin (acquire), and reduces all blocks'
  pairs to the same token (ties → lowest index); then fetches the next z from W1.

The plan — chunks per block, which stay resident, the ring, the rest of the shared
memory, the order of a step's chunks — is ``mosaic_plan.py``'s; this package is the kernel
and its launch. The vocabulary is cut into chunks whose start is clamped to ``V - 64``: the last chunks
of the last blocks overlap earlier rows instead of reading past the end. A duplicated
row yields the same (score, index) pair in both places, so top-1 is unaffected — and no
padded copy of W2 is ever made.

Scope (``mosaic_row_backend.plan`` says why otherwise): the vanilla head (``z = e``) and the
gated head (``z = σ(hoisted_k + G_e e) ⊙ e``, fp32, register GEMV: G_e stays in shared
memory, each block computes the gate itself and relays it from row to column layout
through shared memory), a bf16 or int8 W2 with rank a multiple of 64, up to
``MAX_BATCH`` rows, greedy and sampled; it writes no logits (asked for, they and the
log-probabilities are computed after it from the drafted tokens:
``reference.logits_of_tokens``). Confidence logits are computed after the kernel from the
drafted tokens (an exact identity: they read only ``e_k = W1[x_{k-1}]`` and hoisted
terms).

Interpret mode (CPU tests) runs blocks one after another and has no semaphores, so the
CPU suite runs this kernel with one block owning every chunk (the barrier is compiled
out); the GPU suite covers the multi-block exchange.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import sampling
from wts_jax.output import STATUS_NAN_LOGITS, STATUS_SYNC_TIMEOUT, STATUS_TOKEN_OUT_OF_RANGE
from wts_jax.pallas import grid_sync
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS, Z_TILE_ROWS, MosaicPlan, chunk_schedule
from wts_jax.pallas.row.products import (register_products, scaled, update_candidates,
                                         wgmma_products)
from wts_jax.pallas.row.spec import RowSpec


@dataclasses.dataclass(frozen=True)
class _BlockCopies:
  """This block's rows and its TMA copies: W2 chunks into slots, a step's base logits
  into a staging buffer."""
  plan: MosaicPlan
  block: jax.Array
  w2_g: object
  w_s: object
  base_g: object
  base_s: object
  base_bar: object

  def chunk_start(self, c):
    # Clamped, so the last chunks overlap earlier rows rather than read past V.
    plan = self.plan
    return jnp.minimum(self.block * (plan.chunks * CHUNK_ROWS) + c * CHUNK_ROWS,
                       plan.vocab_size - CHUNK_ROWS)

  def chunk(self, c, slot_index, barrier):
    plgpu.copy_gmem_to_smem(self.w2_g.at[pl.ds(self.chunk_start(c), CHUNK_ROWS)],
                            self.w_s.at[slot_index], barrier)

  def base(self, step, parity):
    """All rows' base logits of ``step`` ([chunks, B, 64]) into buffer ``parity``;
    ``base_bar[parity]`` completes when all ``chunks`` copies have landed."""
    for c in range(self.plan.chunks):
      plgpu.copy_gmem_to_smem(self.base_g.at[:, step, pl.ds(self.chunk_start(c),
                                                            CHUNK_ROWS)],
                              self.base_s.at[parity, c], self.base_bar.at[parity])


@dataclasses.dataclass(frozen=True)
class KernelRefs:
  """The kernel's refs by name (``_g``: global memory, ``_s``: shared memory, ``_bar``:
  TMA barriers). ``launch.row_walk`` passes the operands, outputs and scratch as ordered
  dicts and the kernel gets them back by these names: the optional ones (sampling, an
  int8 W2's scales, the WGMMA's z, the gated head's G_e) are None when the plan has none."""
  # Inputs.
  w2_g: object
  base_g: object
  w1_g: object
  first_g: object
  # Outputs: the tokens, the per-block status flags, the exchange's (score, index)
  # slots [2 parities, B, lanes] (see ``grid_sync``).
  tok_g: object
  flag_g: object
  xv_g: object
  xi_g: object
  # Scratch: the W2 slots (resident chunks, then the ring), the base logits of two steps.
  w_s: object
  base_s: object
  res_bar: object
  ring_bar: object
  base_bar: object
  seed_g: object = None          # sampling: the Gumbel stream's seed, 1/T, noise on
  scale_g: object = None
  noise_g: object = None
  w2_scale_g: object = None      # int8 W2: per-row scales, copied to shared memory once
  w2_scale_s: object = None
  w2_scale_bar: object = None
  z_s: object = None             # WGMMA GEMV: the W1 rows of z (the B operand)
  z_bar: object = None
  gate_w_g: object = None        # gated head: gate_proj.weight, G_e resident, the gate
  gate_hoisted_g: object = None
  gate_e_s: object = None
  gate_e_bar: object = None
  gate_pre_s: object = None
  w1_scale_g: object = None      # int8 planes: s_lo of each token's planes (w1_g holds them)
  register_bar: object = None    # chunks held in registers: their one staging copy


@dataclasses.dataclass(frozen=True)
class _Step:
  """What a step's chunks read: the step, its base buffer (``parity``), z (registers:
  the rows' vectors, ``z_rows`` broadcast over a chunk; WGMMA: the tokens' columns, and
  for int8 planes their scales), the rows' noise streams (sampled) and the chunks held in
  registers."""
  step: object
  parity: object
  z: object
  z_rows: object
  streams: object
  register_chunks: tuple


class RowWalk:
  """One block's walk (built inside the kernel: the block index, the grid semaphore and
  the index vectors are traced, in this order)."""

  def __init__(self, refs: KernelRefs, spec: RowSpec):
    plan = self.plan = spec.plan
    self.spec, self.refs, self.batch = spec, refs, spec.batch
    self.vocab, self.rank = plan.vocab_size, plan.rank
    self.wgmma, self.quantized, self.int8_state = (
        plan.gemv == "wgmma", plan.w2_itemsize == 1, plan.int8_state)
    self.reads_slots_in_registers = not self.wgmma or (self.quantized and not self.int8_state)
    self.blocks, self.res, self.stages = plan.num_blocks, plan.resident_chunks, plan.ring_stages
    self.registers = plan.register_chunks
    self.streamed = plan.streamed_chunks
    self.block = lax.axis_index("blocks")
    self.multi_block = self.blocks > 1
    self.sem = pl.get_global(plgpu.SemaphoreType.REGULAR(())) if self.multi_block else None
    self.lanes = plan.exchange_lanes
    self.row_iota = plgpu.broadcasted_iota(jnp.int32, (CHUNK_ROWS,), 0, layout=gpu.ROW_VECTOR)
    self.lane_iota = plgpu.broadcasted_iota(jnp.int32, (self.lanes,), 0,
                                            layout=gpu.ROW_VECTOR)
    self.copies = _BlockCopies(plan, self.block, refs.w2_g, refs.w_s, refs.base_g,
                               refs.base_s, refs.base_bar)
    # Invariant: chunks [0, res) are copied once here and stay in shared memory; chunks
    # [res, res + registers) are loaded into registers once and carried through the loop;
    # the rest stream through the ring.
    self.total_streamed = spec.steps * self.streamed
    self.first_streamed = self.res + self.registers
    self.rolled = plan.group == 1 and plan.on_chip_group == 1 and not self.registers

  def run(self):
    spec, refs, batch, vocab = self.spec, self.refs, self.batch, self.vocab
    register_chunks = self.load_register_chunks()
    self.prologue()
    self.sampled = None
    if not spec.greedy:
      self.sampled = ((refs.seed_g[0], refs.seed_g[1]), [refs.scale_g[b] for b in range(batch)],
                      [refs.noise_g[b] != 0 for b in range(batch)])
    given = [refs.first_g[b] for b in range(batch)]
    first = [jnp.clip(token, 0, vocab - 1) for token in given]
    # First tokens outside [0, V) are reported here (the walk runs on from them clamped),
    # so the caller needs no op of its own before the launch.
    outside = functools.reduce(jnp.logical_or, [(t < 0) | (t >= vocab) for t in given])
    first_flag = jnp.where(outside, STATUS_TOKEN_OUT_OF_RANGE, 0)
    _, flags, _ = lax.fori_loop(0, spec.steps, self.step,
                                (self.gather(first), first_flag, register_chunks))
    refs.flag_g[self.block] = flags

  def streamed_chunk(self, step, j):
    """The chunk at position ``j`` of ``step``'s stream (snake: odd steps reversed)."""
    if not self.plan.snake:
      return self.first_streamed + j
    return self.first_streamed + jnp.where(lax.rem(step, 2) == 1, self.streamed - 1 - j, j)

  def load_register_chunks(self):
    """The chunks held in registers: staged through the first slots before anything else
    uses them, then held in the 8-bit WGMMA layout (4 values a register: a loop carry
    must be whole 32-bit registers), an int8 A operand's layout."""
    refs = self.refs
    if not self.registers:
      return ()
    with jax.named_scope("register_chunks"):
      for i in range(self.registers):
        self.copies.chunk(self.res + i, i, refs.register_bar)
      plgpu.barrier_wait(refs.register_bar)
      register_chunks = tuple(gpu.load(refs.w_s.at[i], plgpu.Layout.WGMMA_8BIT)
                              for i in range(self.registers))
      plgpu.commit_smem()   # every warp's reads of the slots before the TMA refills them
    return register_chunks

  def prologue(self):
    plan, refs, rank = self.plan, self.refs, self.rank
    copy_chunk, res = self.copies.chunk, self.res
    with jax.named_scope("prologue"):
      # Base logits by TMA, a step ahead: a register load per chunk issued a few chunks
      # ahead stalled every third chunk behind the W2 stream (a profile showed it).
      self.copies.base(0, 0)
      if self.quantized:   # the block's per-row scales, once: [chunks, 64] f32
        for c in range(plan.chunks):
          plgpu.copy_gmem_to_smem(
              refs.w2_scale_g.at[pl.ds(self.copies.chunk_start(c), CHUNK_ROWS)],
              refs.w2_scale_s.at[c], refs.w2_scale_bar)
      # The ring's first slots before the resident chunks: step 0 starts on the stream
      # and waits for the resident chunks only where its schedule first needs them.
      for g in range(min(self.stages, self.total_streamed)):
        copy_chunk(self.first_streamed + g, res + g, refs.ring_bar.at[g])   # step 0: forward
      for c in range(res):
        copy_chunk(c, c, refs.res_bar)
      if plan.gated:   # G_e: columns [d, d + r) of gate_proj.weight, resident
        hidden_size = refs.gate_w_g.shape[1] - rank
        for i in range(rank // CHUNK_ROWS):
          plgpu.copy_gmem_to_smem(
              refs.gate_w_g.at[pl.ds(i * CHUNK_ROWS, CHUNK_ROWS), pl.ds(hidden_size, rank)],
              refs.gate_e_s.at[i], refs.gate_e_bar)
      if self.quantized:
        plgpu.barrier_wait(refs.w2_scale_bar)
      if plan.gated:
        plgpu.barrier_wait(refs.gate_e_bar)

  def gather(self, tokens, needed=True):
    """z for the next step. Registers: the W1 rows as fp32 vectors. WGMMA: a TMA copy of
    the 8 W1 rows from min(token, V - 8) into tile b of ``z_s`` (landing on ``z_bar``;
    only when ``needed``: every copy must be waited for), and the column of the token's
    own row within the tiles. int8 planes: the 8 rows are 4 tokens' interleaved planes
    from 2 · min(token, V - 4), and each token's ``s_lo`` comes along."""
    refs, batch, int8_state = self.refs, self.batch, self.int8_state
    if not self.wgmma:
      return [gpu.load(refs.w1_g.at[tokens[b]], gpu.COL_VECTOR,
                       optimized=False).astype(jnp.float32) for b in range(batch)]
    # Planes: 2 rows a token (q_hi, q_lo), so a tile holds 4 tokens.
    tokens_per_tile = Z_TILE_ROWS // 2 if int8_state else Z_TILE_ROWS
    starts = [jnp.minimum(tokens[b], self.vocab - tokens_per_tile) for b in range(batch)]
    first_rows = [2 * start for start in starts] if int8_state else starts

    @pl.when(needed)
    def _():
      for b in range(batch):
        plgpu.copy_gmem_to_smem(refs.w1_g.at[pl.ds(first_rows[b], Z_TILE_ROWS)],
                                refs.z_s.at[pl.ds(b * Z_TILE_ROWS, Z_TILE_ROWS)],
                                refs.z_bar)

    if int8_state:
      return ([b * Z_TILE_ROWS + 2 * (tokens[b] - starts[b]) for b in range(batch)],
              [refs.w1_scale_g[tokens[b]] for b in range(batch)])
    return [b * Z_TILE_ROWS + tokens[b] - starts[b] for b in range(batch)]

  def broadcast_rows(self, vectors):
    """Per batch row, an [r] vector broadcast over a chunk's 64 rows (register GEMV)."""
    return [lax.broadcast_in_dim(v, (CHUNK_ROWS, self.rank), (1,)) for v in vectors]

  def gated_z(self, e, step):
    """The gated head's z = σ(hoisted_k + G_e e) ⊙ e (fp32, ``GatedMarkovHead.advance``):
    G_e e as register GEMVs over G_e's 64-row chunks in shared memory, each [64] result
    (row layout) stored to ``gate_pre_s`` and read back as an [r] vector (column layout)
    — the relayout goes through shared memory."""
    refs, batch = self.refs, self.batch
    plgpu.commit_smem()   # every warp's reads of the last step's vector before the writes
    e_rows = self.broadcast_rows(e)
    for i in range(self.rank // CHUNK_ROWS):   # each G_e chunk loaded once for all rows
      pre = register_products(gpu.load(refs.gate_e_s.at[i], gpu.WGMMA), e_rows)
      for b in range(batch):
        refs.gate_pre_s[b, pl.ds(i * CHUNK_ROWS, CHUNK_ROWS)] = pre(b)
    plgpu.commit_smem()   # every warp's writes before any thread reads the vector
    return [jax.nn.sigmoid(
        gpu.load(refs.gate_hoisted_g.at[b, step], gpu.COL_VECTOR, optimized=False)
        + gpu.load(refs.gate_pre_s.at[b], gpu.COL_VECTOR)) * e[b] for b in range(batch)]

  def step(self, step, carry):
    """One step: the base logits and z awaited (the next step's base copy issued), the
    gated head's z, every chunk into per-lane candidates, the exchange, the next z
    requested."""
    spec, refs, batch = self.spec, self.refs, self.batch
    z, flags, register_chunks = carry
    parity = lax.rem(step, 2)
    with jax.named_scope("base_wait"):
      plgpu.barrier_wait(refs.base_bar.at[parity])
      if self.wgmma:   # this step's W1 rows (issued at the last step's end)
        plgpu.barrier_wait(refs.z_bar)

    @pl.when(step + 1 < spec.steps)
    def _():
      # Invariant: buffer 1 - parity was read in the previous step; its generic-proxy
      # reads are ordered before the TMA's write (fence + warpgroup barrier), then the
      # copy (grid_sync: the Mosaic protocol).
      plgpu.commit_smem()
      self.copies.base(step + 1, 1 - parity)

    if self.plan.gated:
      with jax.named_scope("gate"):
        z = self.gated_z(z, step)
    z_rows = None if self.wgmma else self.broadcast_rows(z)
    streams = None
    if not spec.greedy:
      seed = self.sampled[0]
      streams = [sampling.stream_key(seed, jnp.uint32(b), step) for b in range(batch)]
    at = _Step(step, parity, z, z_rows, streams, register_chunks)
    # Per-lane candidates: each of the 64 lanes keeps the best (score, row) it has seen;
    # one cross-thread reduction per step instead of three per chunk.
    def lanes_of(value, dtype):   # in the row layout: a loop carry keeps its layout
      return plgpu.layout_cast(jnp.full((CHUNK_ROWS,), value, dtype), gpu.ROW_VECTOR)
    best = [(lanes_of(gpu.NEG_INF, jnp.float32), lanes_of(0, jnp.int32)) for _ in range(batch)]
    nan_lanes = lanes_of(0, jnp.int32)
    if self.rolled:
      best, nan_lanes = self.rolled_chunks(at, best, nan_lanes)
    else:
      best, nan_lanes = self.scheduled_chunks(at, best, nan_lanes)
    tokens, timed_out = self.exchange(step, parity, best)
    flags = (flags | jnp.where(nan_lanes.max() > 0, STATUS_NAN_LOGITS, 0)
             | jnp.where(timed_out > 0, STATUS_SYNC_TIMEOUT, 0))
    with jax.named_scope("gather"):   # issues the W1 row loads; their first use waits
      e = self.gather(tokens, needed=step + 1 < spec.steps)
    return e, flags, register_chunks

  def chunk_products(self, at: _Step, slot_indices):
    """The GEMV of a group of chunks (by slot, or an int8 chunk held in registers): per
    chunk ``b -> [64]``."""
    refs = self.refs
    if not self.wgmma:
      return [register_products(gpu.load(refs.w_s.at[slot], gpu.WGMMA), at.z_rows)
              for slot in slot_indices]
    if self.int8_state:   # int8 x int8: the slots are the A operands as they are
      columns, plane_scales = at.z
      # A chunk held in registers is a [64, r] array; any other is a slot index.
      return wgmma_products([slot if jnp.ndim(slot) == 2 else refs.w_s.at[slot]
                             for slot in slot_indices], refs.z_s, columns, plane_scales)
    # An int8 chunk is upcast to bf16 in registers (exact: |q| <= 128 fits bf16's
    # mantissa) and is the WGMMA's A operand from there.
    operands = [gpu.load(refs.w_s.at[slot], gpu.WGMMA).astype(jnp.bfloat16) if self.quantized
                else refs.w_s.at[slot] for slot in slot_indices]
    return wgmma_products(operands, refs.z_s, at.z)

  def take_group(self, at: _Step, chunk_ids, slot_indices, best, nan_lanes):
    refs = self.refs
    sample = None if self.spec.greedy else (at.streams, *self.sampled[1:])
    for c, products in zip(chunk_ids, self.chunk_products(at, slot_indices)):
      if self.quantized:   # (Σ q·z) · scale, the order of SerialHead.vocab_bias
        products = scaled(products, gpu.load(refs.w2_scale_s.at[c], gpu.ROW_VECTOR))
      best, nan_lanes = update_candidates(
          self.spec, products, self.copies.chunk_start(c) + self.row_iota,
          lambda b, c=c: gpu.load(refs.base_s.at[at.parity, c, b],
                                  gpu.ROW_VECTOR).astype(jnp.float32),
          best, nan_lanes, sample)
    return best, nan_lanes

  def refill(self, step, j):
    """Ring slot j % stages refilled with the chunk ``stages`` ahead — across the step
    boundary too. Invariant: a slot is refilled only after its chunk was consumed."""
    stages, streamed = self.stages, self.streamed
    if self.reads_slots_in_registers:
      # Every warp's generic-proxy reads of the slot before the TMA's write. (A WGMMA
      # reads a shared-memory operand in the async proxy and has completed: its result
      # was read.)
      plgpu.commit_smem()
    later = (j + stages) // streamed            # the same step (0) or the next (1)
    self.copies.chunk(self.streamed_chunk(step + later, gpu.rem(j + stages, streamed)),
                      self.res + gpu.rem(j, stages), self.refs.ring_bar.at[gpu.rem(j, stages)])

  def rolled_chunks(self, at: _Step, best, nan_lanes):
    """One chunk a group, no chunk in registers: the step's chunks as one loop (one code
    copy, not one a chunk: unrolled copies spill registers)."""
    refs, res, stages, step = self.refs, self.res, self.stages, at.step
    order = [(kind, members[0]) for kind, members in chunk_schedule(res, self.streamed, 1)]

    def chunk(position, carry):
      best, nan_lanes = carry
      resident, index, j = gpu.chunk_kind(position, order)
      if res:
        gpu.when(gpu.and_(gpu.and_(resident, index == 0), step == 0),
                 lambda: plgpu.barrier_wait(refs.res_bar))   # once: the resident chunks
      if stages:
        gpu.when(gpu.not_(resident),
                 lambda: plgpu.barrier_wait(refs.ring_bar.at[gpu.rem(j, stages)]))
      slot = gpu.select(resident, index, lambda: res + gpu.rem(j, stages))
      c = gpu.select(resident, index, lambda: self.streamed_chunk(step, j))
      with jax.named_scope("chunk"):
        best, nan_lanes = self.take_group(at, [c], [slot], best, nan_lanes)
      if stages:
        gpu.when(gpu.and_(gpu.not_(resident),
                          step * self.streamed + j + stages < self.total_streamed),
                 lambda: self.refill(step, j))
      return best, nan_lanes

    return lax.fori_loop(0, self.plan.chunks, chunk, (best, nan_lanes))

  def scheduled_chunks(self, at: _Step, best, nan_lanes):
    """The step's chunks in ``chunk_schedule``'s groups, unrolled (resident, held in
    registers, or streamed)."""
    plan, refs, res, stages, step = self.plan, self.refs, self.res, self.stages, at.step
    schedule = chunk_schedule(res, self.streamed, plan.group, self.registers,
                              plan.resident_group)
    for kind, members in schedule:
      if kind == "resident":
        if members[0] == 0 and res:
          @pl.when(step == 0)
          def _():   # once: the resident chunks copied in the prologue have landed
            plgpu.barrier_wait(refs.res_bar)
        sources = [c if c < res else at.register_chunks[c - res] for c in members]
        with jax.named_scope("resident_chunk"):
          best, nan_lanes = self.take_group(at, members, sources, best, nan_lanes)
        continue
      # The ring restarts every step (streamed % stages == 0), so slots are static.
      slots = [res + j % stages for j in members]
      with jax.named_scope("ring_wait"):
        for j in members:
          plgpu.barrier_wait(refs.ring_bar.at[j % stages])
      with jax.named_scope("streamed_chunk"):
        best, nan_lanes = self.take_group(
            at, [self.streamed_chunk(step, j) for j in members], slots, best, nan_lanes)
      for j in members:
        pl.when(step * self.streamed + j + stages < self.total_streamed)(
            functools.partial(self.refill, step, j))
    return best, nan_lanes

  def exchange(self, step, parity, best):
    """Each row's best over the grid: the block's (score, index) pairs published, the
    grid barrier, every block's pairs reduced to the same token (block 0 writes it out).
    Returns (the tokens, the barrier's time-out)."""
    refs, batch, block = self.refs, self.batch, self.block
    with jax.named_scope("publish"):
      # Invariant: parity k % 2 is free: every block read step k - 2's pairs before it
      # signalled step k - 1, and this block passed that barrier (grid_sync).
      for b in range(batch):
        values, rows = best[b]
        top = values.max()
        refs.xv_g[parity, b, block] = top
        refs.xi_g[parity, b, block] = jnp.min(jnp.where(values == top, rows, gpu.BIG_INDEX))
    timed_out = jnp.int32(0)
    if self.multi_block:
      with jax.named_scope("grid_sync"):
        timed_out = grid_sync.signal_and_poll(self.sem, self.blocks, step, self.spec.spin_limit)
    tokens = []
    with jax.named_scope("exchange_reduce"):
      for b in range(batch):
        valid = self.lane_iota < self.blocks
        # Invariant: every block reduces the same pairs with the same arithmetic, so
        # all agree on the token without a broadcast.
        values = jnp.where(valid, gpu.load(refs.xv_g.at[parity, b], gpu.ROW_VECTOR,
                                           optimized=False), gpu.NEG_INF)
        indices = jnp.where(valid, gpu.load(refs.xi_g.at[parity, b], gpu.ROW_VECTOR,
                                            optimized=False), gpu.BIG_INDEX)
        top = values.max()
        token = jnp.min(jnp.where(values == top, indices, gpu.BIG_INDEX))
        tokens.append(jnp.clip(token, 0, self.vocab - 1))   # a NaN row is flagged, not followed

    @pl.when(block == 0)
    def _():
      for b in range(batch):
        refs.tok_g[b, step] = tokens[b]
    return tokens, timed_out


def _walk_kernel(*refs, spec: RowSpec, names: tuple[str, ...]):
  RowWalk(KernelRefs(**dict(zip(names, refs))), spec).run()


def body(spec: RowSpec, names: tuple[str, ...]):
  """The kernel body ``plgpu.kernel`` launches for ``spec``: its refs arrive in the order
  of ``names`` (operands, outputs, scratch). The launch keeps the body function's name."""
  return functools.partial(_walk_kernel, spec=spec, names=names)
