"""The Weights-That-Stay walk as one persistent Mosaic GPU kernel (``plgpu.kernel``).

Why a second backend: Pallas Triton can keep W2 only in registers (a quarter of a bf16
rank-256 W2 at best, and it spills), and streams the rest one tile ahead. Mosaic GPU gives
us the shared memory and the TMA engine directly:

- block ``p`` (one per SM) owns ``chunks`` 64-row chunks of W2; the first
  ``resident_chunks`` are copied into shared memory once, in the prologue, and stay
  there for all K steps (the default plan keeps 2 beside a 2-slot ring unless everything
  fits: the fastest split measured at the Qwen3 shape, NOTES v6); a step computes them
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
memory, the order of a step's chunks — is ``mosaic_plan.py``'s; this file is the kernel
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
import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import sampling
from wts_jax.int8_state import LO_STEPS
from wts_jax.output import (STATUS_NAN_LOGITS, STATUS_SYNC_TIMEOUT,
                             STATUS_TOKEN_OUT_OF_RANGE)
from wts_jax.pallas import grid_sync
from wts_jax.pallas.mosaic_plan import (CHUNK_ROWS, Z_TILE_ROWS, MosaicPlan,
                                        chunk_schedule, row_swizzle)

_WGMMA = plgpu.Layout.WGMMA
_ROW_VECTOR = _WGMMA.reduce(1)   # a [64] chunk of logits, one value per W2 row
_COL_VECTOR = _WGMMA.reduce(0)   # an [r] vector (e, z), broadcast over rows
_BIG_INDEX = 1 << 30
_NEG_INF = float("-inf")
# jax 0.10.2's ``plgpu.load`` takes the index as a required positional argument; 0.11
# makes it optional (deprecated) and 0.12 drops it.
_LOAD_INDEX_PARAMETER = inspect.signature(plgpu.load).parameters.get("idx")
_LOAD_NEEDS_INDEX = (_LOAD_INDEX_PARAMETER is not None
                     and _LOAD_INDEX_PARAMETER.default is inspect.Parameter.empty)


def _load(ref, layout, **kwargs):
  if _LOAD_NEEDS_INDEX:
    return plgpu.load(ref, (), layout=layout, **kwargs)
  return plgpu.load(ref, layout=layout, **kwargs)


# jax 0.12 plans every register-to-memory store for coalescing (global memory) or for no
# bank conflicts (shared memory), and refuses one it cannot prove; earlier versions store
# untiled refs as given. ``plgpu.store(optimized=False)`` (jax >= 0.12) is that store.
_HAS_STORE = hasattr(plgpu, "store")


def _store(ref, value, index=...):
  """``ref[index] = value`` lowered as jax 0.10 and 0.11 lower it, on every version: for
  a few words a row in global memory, or a tile whose transfer has no conflict-free
  plan."""
  if _HAS_STORE:
    plgpu.store(ref if index is Ellipsis else ref.at[index], value, optimized=False)
  else:
    ref[index] = value


def _select(condition, when_true, when_false):
  """``when_true`` or ``when_false()``: chosen in Python for a static condition (a plan
  without resident or without streamed chunks knows every chunk's kind), else by
  ``jnp.where``."""
  if isinstance(condition, bool):
    return when_true if condition else when_false()
  return jnp.where(condition, when_true, when_false())


def _when(condition, body):
  if isinstance(condition, bool):
    if condition:
      body()
  else:
    pl.when(condition)(body)


def _not(condition):
  return (not condition) if isinstance(condition, bool) else jnp.logical_not(condition)


def _and(a, b):
  if isinstance(a, bool) and isinstance(b, bool):
    return a and b
  if isinstance(a, bool):
    return b if a else False
  if isinstance(b, bool):
    return a if b else False
  return jnp.logical_and(a, b)


def _rem(a, b):
  return a % b if isinstance(a, int) else lax.rem(a, b)


def _div(a, b):
  if isinstance(a, int) and isinstance(b, int):
    return a // b
  return lax.div(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))


def _chunk_kind(position, order):
  """(resident?, its resident index, its streamed index) of the chunk at a rolled chunk
  loop's ``position`` in ``order`` (``chunk_schedule``'s, one chunk a group; the i-th
  resident position holds resident chunk i). Python values where the plan fixes them
  (no resident or no streamed chunks), scalars otherwise."""
  resident_positions = [p for p, (kind, _) in enumerate(order) if kind == "resident"]
  if len(resident_positions) == len(order):
    return True, position, 0
  if not resident_positions:
    return False, 0, position
  hits = [position == p for p in resident_positions]
  resident = functools.reduce(jnp.logical_or, hits)
  index = sum((jnp.where(hit, i, 0) for i, hit in enumerate(hits)), jnp.int32(0))
  before = sum((jnp.where(p < position, 1, 0) for p in resident_positions), jnp.int32(0))
  return resident, index, position - before


def _w2_transforms(itemsize: int, rank: int = 256):
  swizzle = row_swizzle(rank, itemsize)
  return (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))


@dataclasses.dataclass(frozen=True)
class MosaicSpec:
  plan: MosaicPlan
  batch: int
  steps: int
  greedy: bool
  spin_limit: int
  interpret: bool
  # Developer profiling (tools/profile_mosaic.py): when set, Mosaic's on-device profiler
  # records the kernel's named regions (``jax.named_scope``) into ``profile_dir``, with
  # room for ``profile_space`` regions per warpgroup (taken from shared memory).
  profile_dir: str = ""
  profile_space: int = 0


def _chunk_scores(spec: MosaicSpec, logits, rows, stream, score_scale, noise_on):
  """Greedy: the logits. Sampling: logits · (1/T) + Gumbel noise (when the row samples)."""
  if spec.greedy:
    return logits
  noise = sampling.gumbel_from_uniform(sampling.uniform_from_stream(stream, rows))
  return logits * score_scale + jnp.where(noise_on, noise, 0.0)


def _register_products(weights, z_rows):
  """W·z_b of a chunk as an fp32 GEMV in registers: ``b -> [64]`` (row layout).
  (An int8 chunk converted through bf16 — Mosaic's prmt path — measured 2.7× slower
  than int8 -> fp32 directly: NOTES v6.)"""
  w = weights.astype(jnp.float32)
  return lambda b: (w * z_rows[b]).sum(axis=1)


def _wgmma_products(operands, z_s, columns, plane_scales=None):
  """W·z_b of a group of chunks on the tensor cores: per chunk one WGMMA [64, r] x
  [r, 8B] (bf16 operands: a shared-memory slot, or an int8 chunk upcast in registers;
  fp32 accumulation) against ``z_s``, whose 8-row tile b holds W1 rows around token b;
  ``columns[b]`` is the column of token b's own row. All the group's WGMMAs are issued
  before the one wait, so their latencies overlap (a single m64n8 WGMMA is 16 dependent
  k-steps: latency-bound, NOTES v5). The column is picked by a masked sum along the row
  (exact: the other terms are zeros). Per chunk ``b -> [64]`` (row layout).

  With ``plane_scales`` (int8 W2, z as two int8 planes: ``wts_jax.int8_state``) the
  operands are int8, the products s32, the tile holds W1's interleaved planes, and
  ``columns[b]`` is token b's q_hi column (q_lo beside it): the masked sum forms
  ``D = 256 · d_hi + d_lo`` in int32 (exact), then ``f32(D) · s_lo``."""
  width = z_s.shape[0]
  planes = plane_scales is not None
  acc_dtype = jnp.int32 if planes else jnp.float32

  def accumulate(*acc_refs):
    for acc_ref, weights in zip(acc_refs, operands):
      plgpu.wgmma(acc_ref, weights, z_s.T)
    return [acc_ref[...] for acc_ref in acc_refs]   # the first read waits for all

  accs = pl.run_scoped(accumulate,
                       *[plgpu.ACC((CHUNK_ROWS, width), acc_dtype)] * len(operands))
  column = plgpu.broadcasted_iota(jnp.int32, (CHUNK_ROWS, width), 1, layout=_WGMMA)

  def products(acc):
    if planes:
      return lambda b: (jnp.where(column == columns[b], acc * LO_STEPS,
                                  jnp.where(column == columns[b] + 1, acc, 0))
                        .sum(axis=1).astype(jnp.float32) * plane_scales[b])
    return lambda b: jnp.where(column == columns[b], acc, 0.0).sum(axis=1)
  return [products(acc) for acc in accs]


def _scaled(products, row_scale):
  return lambda b: products(b) * row_scale


def _update_candidates(spec: MosaicSpec, product_of, rows, base_of, best, nan_lanes,
                       sample):
  """One 64-row chunk into the per-lane candidates: for every batch row b the logits
  ``product_of(b)`` (W·z_b in fp32) + base_of(b), NaN lanes flagged, the greedy or Gumbel
  score, and an update to the higher score, on a tie to the lower row — so the result
  does not depend on the order the chunks come in (``chunk_schedule``). ``sample``:
  (streams, score_scale, noise_on) per row, None when greedy."""
  new_best = []
  for b in range(spec.batch):
    logits = product_of(b) + base_of(b)
    nan_lanes = nan_lanes | jnp.where(logits != logits, 1, 0)
    scores = (logits if spec.greedy else
              _chunk_scores(spec, logits, rows, sample[0][b], sample[1][b], sample[2][b]))
    better = (scores > best[b][0]) | ((scores == best[b][0]) & (rows < best[b][1]))
    new_best.append((jnp.where(better, scores, best[b][0]),
                     jnp.where(better, rows, best[b][1])))
  return new_best, nan_lanes


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
  TMA barriers). ``mosaic_walk`` passes the operands, outputs and scratch as ordered
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


def _walk_kernel(*refs, spec: MosaicSpec, names: tuple[str, ...]):
  plan, batch = spec.plan, spec.batch
  vocab, rank = plan.vocab_size, plan.rank
  wgmma, quantized, int8_state = (plan.gemv == "wgmma", plan.w2_itemsize == 1,
                                  plan.int8_state)
  reads_slots_in_registers = not wgmma or (quantized and not int8_state)
  refs = KernelRefs(**dict(zip(names, refs)))
  blocks, res, stages = plan.num_blocks, plan.resident_chunks, plan.ring_stages
  registers = plan.register_chunks
  streamed = plan.streamed_chunks
  block = lax.axis_index("blocks")
  multi_block = blocks > 1
  sem = pl.get_global(plgpu.SemaphoreType.REGULAR(())) if multi_block else None
  lanes = plan.exchange_lanes
  row_iota = plgpu.broadcasted_iota(jnp.int32, (CHUNK_ROWS,), 0, layout=_ROW_VECTOR)
  lane_iota = plgpu.broadcasted_iota(jnp.int32, (lanes,), 0, layout=_ROW_VECTOR)
  copies = _BlockCopies(plan, block, refs.w2_g, refs.w_s, refs.base_g, refs.base_s,
                        refs.base_bar)
  chunk_start, copy_chunk = copies.chunk_start, copies.chunk

  # Invariant: chunks [0, res) are copied once here and stay in shared memory; chunks
  # [res, res + registers) are loaded into registers once and carried through the loop;
  # the rest stream through the ring.
  total_streamed = spec.steps * streamed
  first_streamed = res + registers
  rolled = plan.group == 1 and plan.on_chip_group == 1 and not registers

  def streamed_chunk(step, j):
    """The chunk at position ``j`` of ``step``'s stream (snake: odd steps reversed)."""
    if not plan.snake:
      return first_streamed + j
    return first_streamed + jnp.where(lax.rem(step, 2) == 1, streamed - 1 - j, j)

  register_chunks = ()
  if registers:
    with jax.named_scope("register_chunks"):
      # Staged through the first slots before anything else uses them, then held in
      # registers in the 8-bit WGMMA layout (4 values a register: a loop carry must be
      # whole 32-bit registers), an int8 A operand's layout.
      for i in range(registers):
        copy_chunk(res + i, i, refs.register_bar)
      plgpu.barrier_wait(refs.register_bar)
      register_chunks = tuple(_load(refs.w_s.at[i], plgpu.Layout.WGMMA_8BIT)
                              for i in range(registers))
      plgpu.commit_smem()   # every warp's reads of the slots before the TMA refills them
  with jax.named_scope("prologue"):
    # Base logits by TMA, a step ahead: a register load per chunk issued a few chunks
    # ahead stalled every third chunk by ~1 µs behind the W2 stream (profile, NOTES v4).
    copies.base(0, 0)
    if quantized:   # the block's per-row scales, once: [chunks, 64] f32
      for c in range(plan.chunks):
        plgpu.copy_gmem_to_smem(refs.w2_scale_g.at[pl.ds(chunk_start(c), CHUNK_ROWS)],
                                refs.w2_scale_s.at[c], refs.w2_scale_bar)
    # The ring's first slots before the resident chunks: step 0 starts on the stream
    # and waits for the resident chunks only where its schedule first needs them.
    for g in range(min(stages, total_streamed)):
      copy_chunk(first_streamed + g, res + g, refs.ring_bar.at[g])   # step 0: forward
    for c in range(res):
      copy_chunk(c, c, refs.res_bar)
    if plan.gated:   # G_e: columns [d, d + r) of gate_proj.weight, resident
      hidden_size = refs.gate_w_g.shape[1] - rank
      for i in range(rank // CHUNK_ROWS):
        plgpu.copy_gmem_to_smem(
            refs.gate_w_g.at[pl.ds(i * CHUNK_ROWS, CHUNK_ROWS), pl.ds(hidden_size, rank)],
            refs.gate_e_s.at[i], refs.gate_e_bar)
    if quantized:
      plgpu.barrier_wait(refs.w2_scale_bar)
    if plan.gated:
      plgpu.barrier_wait(refs.gate_e_bar)

  if not spec.greedy:
    seed = (refs.seed_g[0], refs.seed_g[1])
    score_scale = [refs.scale_g[b] for b in range(batch)]
    noise_on = [refs.noise_g[b] != 0 for b in range(batch)]

  def gather(tokens, needed=True):
    """z for the next step. Registers: the W1 rows as fp32 vectors. WGMMA: a TMA copy of
    the 8 W1 rows from min(token, V - 8) into tile b of ``z_s`` (landing on ``z_bar``;
    only when ``needed``: every copy must be waited for), and the column of the token's
    own row within the tiles. int8 planes: the 8 rows are 4 tokens' interleaved planes
    from 2 · min(token, V - 4), and each token's ``s_lo`` comes along."""
    if not wgmma:
      return [_load(refs.w1_g.at[tokens[b]], _COL_VECTOR,
                    optimized=False).astype(jnp.float32) for b in range(batch)]
    # Planes: 2 rows a token (q_hi, q_lo), so a tile holds 4 tokens.
    tokens_per_tile = Z_TILE_ROWS // 2 if int8_state else Z_TILE_ROWS
    starts = [jnp.minimum(tokens[b], vocab - tokens_per_tile) for b in range(batch)]
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

  def broadcast_rows(vectors):
    """Per batch row, an [r] vector broadcast over a chunk's 64 rows (register GEMV)."""
    return [lax.broadcast_in_dim(v, (CHUNK_ROWS, rank), (1,)) for v in vectors]

  def gated_z(e, step):
    """The gated head's z = σ(hoisted_k + G_e e) ⊙ e (fp32, ``GatedMarkovHead.advance``):
    G_e e as register GEMVs over G_e's 64-row chunks in shared memory, each [64] result
    (row layout) stored to ``gate_pre_s`` and read back as an [r] vector (column layout)
    — the relayout goes through shared memory."""
    plgpu.commit_smem()   # every warp's reads of the last step's vector before the writes
    e_rows = broadcast_rows(e)
    for i in range(rank // CHUNK_ROWS):   # each G_e chunk loaded once for all rows
      pre = _register_products(_load(refs.gate_e_s.at[i], _WGMMA), e_rows)
      for b in range(batch):
        refs.gate_pre_s[b, pl.ds(i * CHUNK_ROWS, CHUNK_ROWS)] = pre(b)
    plgpu.commit_smem()   # every warp's writes before any thread reads the vector
    return [jax.nn.sigmoid(
        _load(refs.gate_hoisted_g.at[b, step], _COL_VECTOR, optimized=False)
        + _load(refs.gate_pre_s.at[b], _COL_VECTOR)) * e[b] for b in range(batch)]

  def step_body(step, carry):
    z, flags, register_chunks = carry
    parity = lax.rem(step, 2)
    with jax.named_scope("base_wait"):
      plgpu.barrier_wait(refs.base_bar.at[parity])
      if wgmma:   # this step's W1 rows (issued at the last step's end)
        plgpu.barrier_wait(refs.z_bar)

    @pl.when(step + 1 < spec.steps)
    def _():
      # Invariant: buffer 1 - parity was read in the previous step; its generic-proxy
      # reads are ordered before the TMA's write (fence + warpgroup barrier), then the
      # copy (grid_sync: the Mosaic protocol).
      plgpu.commit_smem()
      copies.base(step + 1, 1 - parity)

    if plan.gated:
      with jax.named_scope("gate"):
        z = gated_z(z, step)
    if not wgmma:
      z_rows = broadcast_rows(z)
    if not spec.greedy:
      streams = [sampling.stream_key(seed, jnp.uint32(b), step) for b in range(batch)]
    # Per-lane candidates: each of the 64 lanes keeps the best (score, row) it has seen;
    # one cross-thread reduction per step instead of three per chunk.
    def lanes_of(value, dtype):   # in the row layout: a loop carry keeps its layout
      return plgpu.layout_cast(jnp.full((CHUNK_ROWS,), value, dtype), _ROW_VECTOR)
    best = [(lanes_of(_NEG_INF, jnp.float32), lanes_of(0, jnp.int32)) for _ in range(batch)]
    nan_lanes = lanes_of(0, jnp.int32)

    def chunk_products(slot_indices):
      """The GEMV of a group of chunks (by slot, or an int8 chunk held in registers):
      per chunk ``b -> [64]``."""
      if not wgmma:
        return [_register_products(_load(refs.w_s.at[slot], _WGMMA), z_rows)
                for slot in slot_indices]
      if int8_state:   # int8 x int8: the slots are the A operands as they are
        columns, plane_scales = z
        # A chunk held in registers is a [64, r] array; any other is a slot index.
        return _wgmma_products([slot if jnp.ndim(slot) == 2 else refs.w_s.at[slot]
                                for slot in slot_indices], refs.z_s, columns, plane_scales)
      # An int8 chunk is upcast to bf16 in registers (exact: |q| <= 128 fits bf16's
      # mantissa) and is the WGMMA's A operand from there.
      operands = [_load(refs.w_s.at[slot], _WGMMA).astype(jnp.bfloat16) if quantized
                  else refs.w_s.at[slot] for slot in slot_indices]
      return _wgmma_products(operands, refs.z_s, z)

    def take_group(chunk_ids, slot_indices, best, nan_lanes):
      for c, products in zip(chunk_ids, chunk_products(slot_indices)):
        if quantized:   # (Σ q·z) · scale, the order of SerialHead.vocab_bias
          products = _scaled(products, _load(refs.w2_scale_s.at[c], _ROW_VECTOR))
        best, nan_lanes = _update_candidates(
            spec, products, chunk_start(c) + row_iota,
            lambda b, c=c: _load(refs.base_s.at[parity, c, b],
                                 _ROW_VECTOR).astype(jnp.float32),
            best, nan_lanes, None if spec.greedy else (streams, score_scale, noise_on))
      return best, nan_lanes

    def refill(step, j):
      # Refill ring slot j % stages with the chunk `stages` ahead — across the step
      # boundary too. Invariant: a slot is refilled only after its chunk was consumed.
      if reads_slots_in_registers:
        # Every warp's generic-proxy reads of the slot before the TMA's write. (A
        # WGMMA reads a shared-memory operand in the async proxy and has completed:
        # its result was read.)
        plgpu.commit_smem()
      later = (j + stages) // streamed            # the same step (0) or the next (1)
      copy_chunk(streamed_chunk(step + later, _rem(j + stages, streamed)),
                 res + _rem(j, stages), refs.ring_bar.at[_rem(j, stages)])

    if rolled:
      # One chunk a group, no chunk in registers: the step's chunks as one loop (one
      # code copy, not one a chunk: unrolled copies spill registers, NOTES v10).
      order = [(kind, members[0]) for kind, members in chunk_schedule(res, streamed, 1)]

      def chunk(position, carry):
        best, nan_lanes = carry
        resident, index, j = _chunk_kind(position, order)
        if res:
          _when(_and(_and(resident, index == 0), step == 0),
                lambda: plgpu.barrier_wait(refs.res_bar))   # once: the resident chunks
        if stages:
          _when(_not(resident), lambda: plgpu.barrier_wait(refs.ring_bar.at[_rem(j, stages)]))
        slot = _select(resident, index, lambda: res + _rem(j, stages))
        c = _select(resident, index, lambda: streamed_chunk(step, j))
        with jax.named_scope("chunk"):
          best, nan_lanes = take_group([c], [slot], best, nan_lanes)
        if stages:
          _when(_and(_not(resident), step * streamed + j + stages < total_streamed),
                lambda: refill(step, j))
        return best, nan_lanes

      best, nan_lanes = lax.fori_loop(0, plan.chunks, chunk, (best, nan_lanes))
    else:
      schedule = chunk_schedule(res, streamed, plan.group, registers, plan.resident_group)
      for kind, members in schedule:
        if kind == "resident":
          if members[0] == 0 and res:
            @pl.when(step == 0)
            def _():   # once: the resident chunks copied in the prologue have landed
              plgpu.barrier_wait(refs.res_bar)
          sources = [c if c < res else register_chunks[c - res] for c in members]
          with jax.named_scope("resident_chunk"):
            best, nan_lanes = take_group(members, sources, best, nan_lanes)
          continue
        # The ring restarts every step (streamed % stages == 0), so slots are static.
        slots = [res + j % stages for j in members]
        with jax.named_scope("ring_wait"):
          for j in members:
            plgpu.barrier_wait(refs.ring_bar.at[j % stages])
        with jax.named_scope("streamed_chunk"):
          best, nan_lanes = take_group([streamed_chunk(step, j) for j in members], slots,
                                       best, nan_lanes)
        for j in members:
          pl.when(step * streamed + j + stages < total_streamed)(
              functools.partial(refill, step, j))

    with jax.named_scope("publish"):
      # Invariant: parity k % 2 is free: every block read step k - 2's pairs before it
      # signalled step k - 1, and this block passed that barrier (grid_sync).
      for b in range(batch):
        values, rows = best[b]
        top = values.max()
        refs.xv_g[parity, b, block] = top
        refs.xi_g[parity, b, block] = jnp.min(jnp.where(values == top, rows,
                                                        _BIG_INDEX))
    timed_out = jnp.int32(0)
    if multi_block:
      with jax.named_scope("grid_sync"):
        timed_out = grid_sync.signal_and_poll(sem, blocks, step, spec.spin_limit)
    tokens = []
    with jax.named_scope("exchange_reduce"):
      for b in range(batch):
        valid = lane_iota < blocks
        # Invariant: every block reduces the same pairs with the same arithmetic, so
        # all agree on the token without a broadcast.
        values = jnp.where(valid, _load(refs.xv_g.at[parity, b], _ROW_VECTOR,
                                        optimized=False), _NEG_INF)
        indices = jnp.where(valid, _load(refs.xi_g.at[parity, b], _ROW_VECTOR,
                                         optimized=False), _BIG_INDEX)
        top = values.max()
        token = jnp.min(jnp.where(values == top, indices, _BIG_INDEX))
        tokens.append(jnp.clip(token, 0, vocab - 1))   # a NaN row is flagged, not followed

    @pl.when(block == 0)
    def _():
      for b in range(batch):
        refs.tok_g[b, step] = tokens[b]

    flags = (flags | jnp.where(nan_lanes.max() > 0, STATUS_NAN_LOGITS, 0)
             | jnp.where(timed_out > 0, STATUS_SYNC_TIMEOUT, 0))
    with jax.named_scope("gather"):   # issues the W1 row loads; their first use waits
      e = gather(tokens, needed=step + 1 < spec.steps)
    return e, flags, register_chunks

  given = [refs.first_g[b] for b in range(batch)]
  first = [jnp.clip(token, 0, vocab - 1) for token in given]
  # First tokens outside [0, V) are reported here (the walk runs on from them clamped),
  # so the caller needs no op of its own before the launch.
  outside = functools.reduce(jnp.logical_or, [(t < 0) | (t >= vocab) for t in given])
  first_flag = jnp.where(outside, STATUS_TOKEN_OUT_OF_RANGE, 0)
  _, flags, _ = lax.fori_loop(0, spec.steps, step_body,
                              (gather(first), first_flag, register_chunks))
  refs.flag_g[block] = flags


def _interpret_params():
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
  return InterpretGPUParams()


def mosaic_walk(spec: MosaicSpec, w2, base_logits, w1, first_tokens, seed=None,
                score_scale=None, noise_on=None, w2_scale=None, gate_weight=None,
                gate_hoisted=None, w1_scale=None):
  """Launch the kernel once; returns (tokens [B, K] int32, status int32 scalar).
  ``w2_scale``: the per-row scales [V] of an int8 W2 (``plan.w2_itemsize == 1``).
  ``plan.int8_state``: ``w1`` is W1's interleaved int8 planes [2V, r] and ``w1_scale``
  their ``s_lo`` [V] (``wts_jax.int8_state.interleaved_planes``).
  Gated head (``plan.gated``): ``gate_weight`` is ``gate_proj.weight`` [r, d + r] (bf16,
  inputs [h ; e]) and ``gate_hoisted`` its hidden-side terms [B, K, r] f32
  (``GatedMarkovHead.hoist``)."""
  if (w2_scale is None) != (spec.plan.w2_itemsize == 2):
    raise ValueError(f"the plan streams {spec.plan.w2_itemsize}-byte W2 rows; "
                     f"W2 is {w2.dtype} with{'out' if w2_scale is None else ''} scales")
  if (gate_weight is None or gate_hoisted is None) == spec.plan.gated:
    raise ValueError("a gated plan needs gate_weight and gate_hoisted, and only it")
  if (w1_scale is None) == spec.plan.int8_state or (
      spec.plan.int8_state and (w1.dtype != jnp.int8
                                or w1.shape[0] != 2 * spec.plan.vocab_size)):
    raise ValueError("an int8-planes plan needs W1's planes [2V, r] int8 and their "
                     f"scales, and only it (got W1 {w1.dtype}{list(w1.shape)})")
  plan, batch, steps = spec.plan, spec.batch, spec.steps
  slots = plan.resident_chunks + plan.ring_stages
  transforms = _w2_transforms(jnp.dtype(w2.dtype).itemsize, plan.rank)
  itemsize = jnp.dtype(base_logits.dtype).itemsize
  if batch > plan.staged_batch or itemsize > plan.base_itemsize:
    raise ValueError(f"the plan stages {plan.staged_batch} rows of {plan.base_itemsize}-"
                     f"byte base logits; this walk has {batch} rows of {itemsize} bytes")
  lanes = plan.exchange_lanes
  scratch = {
      "w_s": plgpu.SMEM((slots, CHUNK_ROWS, plan.rank), w2.dtype, transforms=transforms),
      "base_s": plgpu.SMEM((2, plan.chunks, batch, CHUNK_ROWS), base_logits.dtype),
      "res_bar": plgpu.Barrier(num_arrivals=max(1, plan.resident_chunks), num_barriers=1),
      "ring_bar": plgpu.Barrier(num_arrivals=1, num_barriers=max(1, plan.ring_stages)),
      "base_bar": plgpu.Barrier(num_arrivals=plan.chunks, num_barriers=2),
  }
  if plan.gemv == "wgmma":   # z: 8 W1 rows per batch row, the WGMMA's B operand
    if w1.dtype != (jnp.int8 if plan.int8_state else jnp.bfloat16):
      raise ValueError(f"the WGMMA GEMV needs a bf16 W1 (got {w1.dtype})")
    scratch["z_s"] = plgpu.SMEM((Z_TILE_ROWS * batch, plan.rank), w1.dtype,
                                transforms=_w2_transforms(jnp.dtype(w1.dtype).itemsize,
                                                          plan.rank))
    scratch["z_bar"] = plgpu.Barrier(num_arrivals=batch, num_barriers=1)
  if w2_scale is not None:
    scratch["w2_scale_s"] = plgpu.SMEM((plan.chunks, CHUNK_ROWS), jnp.float32)
    scratch["w2_scale_bar"] = plgpu.Barrier(num_arrivals=plan.chunks, num_barriers=1)
  if plan.gated:
    if gate_weight.dtype != jnp.bfloat16 or gate_weight.shape[0] != plan.rank:
      raise ValueError(f"the gated kernel needs a bf16 gate_proj.weight [{plan.rank}, "
                       f"d + {plan.rank}] (got {gate_weight.dtype}{list(gate_weight.shape)})")
    scratch["gate_e_s"] = plgpu.SMEM((plan.rank // CHUNK_ROWS, CHUNK_ROWS, plan.rank),
                                     jnp.bfloat16, transforms=_w2_transforms(2, plan.rank))
    scratch["gate_e_bar"] = plgpu.Barrier(num_arrivals=plan.rank // CHUNK_ROWS,
                                          num_barriers=1)
    scratch["gate_pre_s"] = plgpu.SMEM((batch, plan.rank), jnp.float32)
  if plan.register_chunks:
    scratch["register_bar"] = plgpu.Barrier(num_arrivals=plan.register_chunks,
                                            num_barriers=1)
  outputs = {"tok_g": jax.ShapeDtypeStruct((batch, steps), jnp.int32),
             "flag_g": jax.ShapeDtypeStruct((plan.num_blocks,), jnp.int32),
             "xv_g": jax.ShapeDtypeStruct((2, batch, lanes), jnp.float32),
             "xi_g": jax.ShapeDtypeStruct((2, batch, lanes), jnp.int32)}
  operands = {"w2_g": w2, "base_g": base_logits, "w1_g": w1,
              "first_g": first_tokens.astype(jnp.int32)}
  if not spec.greedy:
    operands.update(seed_g=seed.astype(jnp.uint32), scale_g=score_scale.astype(jnp.float32),
                    noise_g=noise_on.astype(jnp.int32))
  if w2_scale is not None:
    operands["w2_scale_g"] = w2_scale.astype(jnp.float32)
  if w1_scale is not None:
    operands["w1_scale_g"] = w1_scale.astype(jnp.float32)
  if plan.gated:
    operands.update(gate_w_g=gate_weight, gate_hoisted_g=gate_hoisted.astype(jnp.float32))
  kernel = plgpu.kernel(
      functools.partial(_walk_kernel, spec=spec,
                        names=(*operands, *outputs, *scratch)),
      out_type=tuple(outputs.values()),
      grid=(plan.num_blocks,), grid_names=("blocks",),
      scratch_types=list(scratch.values()),
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Lane,
          **(dict(profile_space=spec.profile_space, profile_dir=spec.profile_dir)
             if spec.profile_dir else {})),
      interpret=_interpret_params() if spec.interpret else None,
  )
  tokens, flags, _, _ = kernel(*operands.values())
  return tokens, lax.reduce(flags, jnp.int32(0), lax.bitwise_or, (0,))
