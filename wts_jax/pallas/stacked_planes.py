"""Register-level pieces of the stacked int8-planes walk (``stacked_walk``), built in
``plgpu.inline_mgpu`` because Pallas has no op for them; each has its interpret-mode
counterpart in ``jax.numpy`` (interpret mode runs no inline Mosaic code).

The stacked operand: 32 requests × 2 planes on the WGMMA's M, row 16w + g request
8w + g's q_hi and row 16w + g + 8 its q_lo (``z_registers.stacked_row``). In the
WGMMA accumulator layout a thread of warp w, lane 4g + t holds rows 16w + g and
16w + g + 8 at columns 8j + 2t + {0, 1} (j = 0..7): both planes of one request, so
D = 256 · d_hi + d_lo is joined inside the thread, and each thread carries one running
best (score, vocab row) of its request. Per-thread values ride in [64, 8] arrays of the
WGMMA layout (two registers of two elements a thread, all four the thread's value), so
Pallas can carry them through loops.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import sampling
from wts_jax.int8_state import LO_STEPS
from wts_jax.pallas import z_registers

TILE = 64        # W2 rows a tile (the WGMMA's N)
REQUESTS = 32    # requests a stacked operand holds
CARRY = (64, 8)  # a per-thread value's array (GPU)
BIG_INDEX = 1 << 30


def _i32():
  from jax._src.lib.mlir import ir
  return ir.IntegerType.get_signless(32)


def _const(value, type_=None):
  from jax._src.lib.mlir.dialects import arith
  return arith.constant(type_ or _i32(), value)


def _thread():
  """(block-wide thread index, warpgroup, warp in it, g, t) as i32 values."""
  from jax._src.lib.mlir.dialects import arith
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  thread = mgpu_utils.thread_idx()
  if thread.type != _i32():
    thread = arith.index_cast(_i32(), thread)
  in_wg = arith.remui(thread, _const(128))
  lane = arith.remui(in_wg, _const(32))
  return (thread, arith.divui(thread, _const(128)), arith.divui(in_wg, _const(32)),
          arith.divui(lane, _const(4)), arith.remui(lane, _const(4)))


def _per_thread(values, dtype):
  """A [64, 8] WGMMA-layout array whose four elements in each thread are ``values``
  (one scalar a thread)."""
  import numpy as np
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import vector
  from jax.experimental.mosaic.gpu import fragmented_array as fa
  layout = fa.WGMMA_LAYOUT
  registers = np.empty(layout.registers_shape(CARRY), dtype=object)
  for index in np.ndindex(registers.shape):
    registers[index] = vector.broadcast(ir.VectorType.get((2,), values.type), values)
  return fa.FragmentedArray(_registers=registers, _layout=layout,
                            _is_signed=None if dtype == jnp.float32 else True)


def _scalar(array):
  """The one value a thread's registers of ``array`` hold (a ``_per_thread`` array, or a
  ``row_array``)."""
  return _element(array.registers.flat[0], 0)


def _request_warp(warp, wg, rotate: bool):
  """The warp of requests (8 rw .. 8 rw + 7 of the warpgroup's 32) that warp ``warp``
  of warpgroup ``wg`` serves: itself, or (``rotate``) rotated by the warpgroup, so the
  first requests of a partly filled block fall on a different warp scheduler in each
  warpgroup (warp w of every warpgroup issues on scheduler w)."""
  from jax._src.lib.mlir.dialects import arith
  return arith.andi(arith.addi(warp, wg), _const(3)) if rotate else warp


def _request(phases: int, rotate: bool = False):
  """(request index in the walk, the thread's (request warp, g, t)): the block of 32
  requests a warpgroup serves is its index over ``phases`` (``_request_warp``)."""
  from jax._src.lib.mlir.dialects import arith
  _, wg, warp, g, t = _thread()
  first = arith.muli(arith.divui(wg, _const(phases)), _const(REQUESTS))
  warp = _request_warp(warp, wg, rotate)
  return arith.addi(first, arith.addi(arith.muli(warp, _const(8)), g)), (warp, g, t)


def tile_start(block, tile: int, *, tiles: int, vocab: int):
  """The first vocab row of a block's tile, clamped so a tile never reads past V (the
  last tiles overlap earlier rows: a row seen twice is the same candidate)."""
  return jnp.minimum(block * (tiles * TILE) + tile * TILE, vocab - TILE)


# --- the step's operand: z's planes, stacked, and each request's s_lo --------------------

def _stacked_source(first, wg=None):
  """``z_registers.stacked_row`` on i32 rows, past the warpgroup's first request; with
  ``wg`` (an i32 value), each row's warp rotated as ``_request_warp`` does."""
  from jax._src.lib.mlir.dialects import arith

  def source(row):
    warp = arith.divui(row, _const(16))
    if wg is not None:
      warp = _request_warp(warp, wg, True)
    request = arith.addi(arith.muli(warp, _const(8)), arith.remui(row, _const(8)))
    return (arith.addi(first, request),
            arith.remui(arith.divui(row, _const(8)), _const(2)))
  return source


def _first_request(wg, phases: int):
  from jax._src.lib.mlir.dialects import arith
  return arith.muli(arith.divui(wg, _const(phases)), _const(REQUESTS))


def gather(tok_s, w1_g, s_lo_g, *, rank: int, phases: int, wg, interpret: bool,
           fragment_order: bool = False, rotate: bool = False):
  """(A, s_lo) of this warpgroup's 32 requests (tokens ``tok_s``, in range, their stores
  visible): A [64, r] int8 stacked planes of W1 (``w1_g`` [V, 2r]: hi then lo;
  ``fragment_order``: ``int8_state.fragment_ordered``), s_lo the requests' plane scale.
  GPU: A in ``WGMMA_LAYOUT_8BIT`` registers, s_lo a per-thread array. Interpreted:
  A [64, r] and s_lo [32]. ``rotate`` (GPU): the warps' requests as ``_request_warp``
  rotates them."""
  if interpret:
    first = (wg // phases) * REQUESTS
    tokens = [tok_s[first + b] for b in range(REQUESTS)]
    rows = jnp.concatenate([w1_g[pl.ds(token, 1), :] for token in tokens], axis=0)
    planes = (rows[:, :rank], rows[:, rank:])
    stacked = jnp.stack([planes[plane][request] for request, plane in
                         map(z_registers.stacked_row, range(2 * REQUESTS))])
    return stacked, jnp.stack([s_lo_g[token] for token in tokens])

  a_type = plgpu.ShapeDtypeStruct((2 * REQUESTS, rank), jnp.int8,
                                  layout=plgpu.Layout.WGMMA_8BIT)
  s_type = plgpu.ShapeDtypeStruct(CARRY, jnp.float32, layout=plgpu.Layout.WGMMA)

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 3, return_type=(a_type, s_type))
  def load(_, tok, w1, s_lo):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, memref
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    i64 = ir.IntegerType.get_signless(64)
    index = ir.IndexType.get()
    _, wg_, *_ = _thread()
    shape = (2 * REQUESTS, rank)
    a = z_registers._fragments(tok, llvm.ptrtoint(i64, mgpu_utils.memref_ptr(w1)),
                               shape, _stacked_source(_first_request(wg_, phases),
                                                      wg_ if rotate else None),
                               rank, fragment_order)
    request, _ = _request(phases, rotate)
    token = memref.load(tok, [arith.index_cast(index, request)])
    address = arith.addi(llvm.ptrtoint(i64, mgpu_utils.memref_ptr(s_lo)),
                         arith.extui(i64, arith.muli(token, _const(4))))
    scale = llvm.inline_asm(ir.F32Type.get(), [address], "ld.global.nc.f32 $0, [$1];",
                            "=f,l", has_side_effects=False)
    return a, _per_thread(scale, jnp.float32)

  return load(tok_s, w1_g, s_lo_g)


# --- a tile's base logits -----------------------------------------------------------------

def load_base(base_g, step, block, tile: int, *, tiles: int, vocab: int, batch: int,
              phases: int, wg, interpret: bool, loads: bool = True, rotate: bool = False):
  """This warpgroup's requests' base logits at ``step`` over the tile's 64 vocab rows
  (``base_g`` [B', K, V] bf16, V even). GPU: a [64, 64] bf16 WGMMA-layout array, each
  thread's hi-plane rows holding its request's 16 columns (two per 4-byte load), rows
  past the batch zero. Interpreted: [32, 64] f32 (``base_g`` padded to whole blocks of
  32 requests). ``loads`` False (GPU, timing only): zeros, nothing loaded."""
  start = tile_start(block, tile, tiles=tiles, vocab=vocab)
  if interpret:
    first = (wg // phases) * REQUESTS
    return base_g[pl.ds(first, REQUESTS), step, pl.ds(start, TILE)].astype(jnp.float32)
  steps, width = base_g.shape[1], base_g.shape[2]
  out = plgpu.ShapeDtypeStruct((2 * REQUESTS, TILE), jnp.bfloat16,
                               layout=plgpu.Layout.WGMMA)
  starts = row_array(start)   # (scalars pass as arrays: a layout arg)
  steps_at = row_array(step)

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.Layout.WGMMA.reduce(1),
                                plgpu.Layout.WGMMA.reduce(1)), return_type=out)
  def load(_, base, start_rows, step_rows):
    import numpy as np
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, vector
    from jax.experimental.mosaic.gpu import fragmented_array as fa
    i64 = ir.IntegerType.get_signless(64)
    bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
    at, live = _base_address(base, _scalar(start_rows), _scalar(step_rows), steps=steps,
                             width=width, batch=batch, phases=phases, rotate=rotate)
    layout = fa.WGMMA_LAYOUT
    registers = np.empty(layout.registers_shape((2 * REQUESTS, TILE)), dtype=object)
    zero = vector.broadcast(bf16x2, arith.constant(ir.BF16Type.get(), 0.0))
    for reg in np.ndindex(registers.shape):
      j, half = reg[1], reg[4]
      if half or not loads:
        registers[reg] = zero
        continue
      word = llvm.inline_asm(
          _i32(), [arith.addi(at, arith.constant(i64, 16 * j)),
                   arith.extui(_i32(), live)],
          "{ .reg .pred p; setp.ne.u32 p, $2, 0; mov.b32 $0, 0;\n"
          "@p ld.global.nc.b32 $0, [$1]; }",
          "=r,l,r", has_side_effects=True)
      registers[reg] = llvm.bitcast(bf16x2, word)
    return fa.FragmentedArray(_registers=registers, _layout=layout, _is_signed=None)

  return load(base_g, starts, steps_at)


# Async base copies (``StackedPlan.base_slots``): a warpgroup's slot holds its threads' 8
# words of a tile's base logits, word k of thread t at (k · 128 + t) · 4 (conflict-free).
BASE_SLOT_BYTES = 8 * 128 * 4


def _base_address(base, start, step, *, steps: int, width: int, batch: int, phases: int,
                  rotate: bool = False, columns_a_thread: int = 2):
  """(this thread's first base word's global address, its request is live): its
  request's row at ``step`` from column ``start`` + 2t (i32 values); with
  ``columns_a_thread`` 16 (``int8_state.thread_rows_ordered`` W2) from ``start`` + 16t."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  i64 = ir.IntegerType.get_signless(64)
  request, (_, _, t) = _request(phases, rotate)
  first_col = arith.addi(start, arith.muli(t, _const(columns_a_thread)))
  live = arith.cmpi(arith.CmpIPredicate.slt, request, _const(batch))
  row = arith.select(live, request, _const(0))
  element = arith.addi(arith.muli(arith.addi(arith.muli(row, _const(steps)), step),
                                  _const(width)), first_col)
  at = arith.addi(llvm.ptrtoint(i64, mgpu_utils.memref_ptr(base)),
                  arith.muli(arith.extui(i64, element), arith.constant(i64, 2)))
  return at, live


def _base_slot_word(staged, slot, slots: int):
  """This thread's first word in its warpgroup's ``slot`` (an i32 value) of the base
  slots ``staged`` (``copy_base``'s layout), as a shared-memory address."""
  from jax._src.lib.mlir.dialects import arith
  thread, slot_at = _slot_address(staged, slot, slots, BASE_SLOT_BYTES)
  return arith.addi(slot_at, arith.muli(arith.remui(thread, _const(128)), _const(4)))


def _base_slot_chunk(staged, slot, slots: int):
  """This thread's first 16-byte chunk in its warpgroup's ``slot`` (``copy_base`` with
  ``thread_rows``): chunk c of thread t at (c · 128 + t) · 16, so a warp's copies and
  reads of one chunk are contiguous."""
  from jax._src.lib.mlir.dialects import arith
  thread, slot_at = _slot_address(staged, slot, slots, BASE_SLOT_BYTES)
  return arith.addi(slot_at, arith.muli(arith.remui(thread, _const(128)), _const(16)))


def _slot_address(staged, slot, slots: int, slot_bytes: int):
  """(this thread's block-wide index, the shared-memory address of its warpgroup's
  ``slot`` (an i32 value) of ``slots`` a warpgroup of ``slot_bytes`` each in ``staged``)."""
  from jax._src.lib.mlir.dialects import arith
  from wts_jax.pallas.row_words import thread_and_addresses
  thread, (staged_at,), _ = thread_and_addresses((staged,))
  _, wg, *_ = _thread()
  return thread, arith.addi(staged_at, arith.muli(
      arith.addi(arith.muli(wg, _const(slots)), slot), _const(slot_bytes)))


def copy_base(base_g, base_s, slot, step, block, tile, *, tiles: int, vocab: int,
              batch: int, phases: int, slots: int, rotate: bool = False,
              thread_rows: bool = False):
  """``load_base``'s words by ``cp.async`` into this warpgroup's ``slot`` of ``base_s``
  (rows past the batch zero), one commit group: the words never pass through the
  registers, so no WGMMA's register fence waits for them (``fold_tile`` waits for the
  group and reads them back). Returns the slot as a row array (the fold's ``base``).
  ``thread_rows`` (an ``int8_state.thread_rows_ordered`` W2): a thread's 16 columns are
  16 consecutive rows, copied by two 16-byte copies into the slot's chunks
  (c · 128 + t) · 16, c = 0, 1."""
  start = tile_start(block, tile, tiles=tiles, vocab=vocab)
  steps, width = base_g.shape[1], base_g.shape[2]
  slots_at = row_array(slot)

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType())
                     + (plgpu.Layout.WGMMA.reduce(1),) * 3)
  def copy(_, base, staged, start_rows, step_rows, slot_rows):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    at, live = _base_address(base, _scalar(start_rows), _scalar(step_rows), steps=steps,
                             width=width, batch=batch, phases=phases, rotate=rotate,
                             columns_a_thread=16 if thread_rows else 2)
    if thread_rows:
      dst = _base_slot_chunk(staged, _scalar(slot_rows), slots)
      size = arith.select(live, _const(16), _const(0))
      llvm.inline_asm(ir.Type.parse("!llvm.void"), [dst, at, size],
                      "cp.async.cg.shared.global [$0], [$1], 16, $2;\n"
                      "cp.async.cg.shared.global [$0+2048], [$1+16], 16, $2;\n"
                      "cp.async.commit_group;", "r,l,r", has_side_effects=True)
      return
    dst = _base_slot_word(staged, _scalar(slot_rows), slots)
    size = arith.select(live, _const(4), _const(0))   # (0 bytes read: zeros written)
    copies = "".join(f"cp.async.ca.shared.global [$0+{128 * 4 * k}], [$1+{16 * k}], 4, $2;\n"
                     for k in range(8))
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [dst, at, size],
                    copies + "cp.async.commit_group;", "r,l,r", has_side_effects=True)

  copy(base_g, base_s, row_array(start), row_array(step), slots_at)
  return slots_at


# TMA base copies (``StackedPlan.base_copies="tma"``): a slot is [32 requests, 64 columns]
# bf16 in 128-byte rows, the 16-byte chunk c of row r at chunk c ^ (r % 8), so the eight
# rows a warp's lanes read at once fall in different banks.
TMA_BASE_TRANSFORMS = (plgpu.SwizzleTransform(128),)


def _tma_base_word(staged, slot, slots: int, rotate: bool = False):
  """This thread's word 0 in its warpgroup's ``slot`` (an i32 value) of the TMA base
  slots ``staged`` (``slots`` a warpgroup) as a shared-memory address: its word j is at
  that address XOR 16 j (its request's row, chunk j swizzled, byte 4 t)."""
  from jax._src.lib.mlir.dialects import arith
  at, g, t = _tma_base_row(staged, slot, slots, rotate)
  return arith.addi(at, arith.addi(arith.muli(g, _const(16)), arith.muli(t, _const(4))))


def _tma_base_row(staged, slot, slots: int, rotate: bool = False):
  """(the address of this thread's request's row in its warpgroup's TMA ``slot``, the
  thread's g and t): the row the swizzle XORs its chunks by (row % 8 = g)."""
  from jax._src.lib.mlir.dialects import arith
  _, at = _slot_address(staged, slot, slots, BASE_SLOT_BYTES)
  _, wg, warp, g, t = _thread()
  row = arith.addi(arith.muli(_request_warp(warp, wg, rotate), _const(8)), g)
  return arith.addi(at, arith.muli(row, _const(2 * TILE))), g, t


def _tma_base_chunk(staged, slot, slots: int, rotate: bool = False):
  """With W2 in its threads' rows: this thread's first 16-byte chunk (its request's row,
  chunk 2t, swizzled: at 16 · (2t ^ g) in the row) in its warpgroup's TMA ``slot``; its
  second, chunk 2t + 1, is at the first's address XOR 16 within the row."""
  from jax._src.lib.mlir.dialects import arith
  at, g, t = _tma_base_row(staged, slot, slots, rotate)
  return arith.addi(at, arith.muli(arith.xori(arith.muli(t, _const(2)), g), _const(16)))


def zero_unread_rows(base_s, *, batch: int, phases: int, slots: int, rotate: bool = False):
  """Zeros in the TMA base slots' rows past the batch (the copies write the live rows
  only), each thread its own words in its warpgroup's slots: the fold of a request past
  the batch then reads zeros, as the async copies' zero fill gives it."""
  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(transforms=TMA_BASE_TRANSFORMS),))
  def zero(_, staged):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    request, _ = _request(phases, rotate)
    dead = arith.extui(_i32(), arith.cmpi(arith.CmpIPredicate.sge, request, _const(batch)))
    for slot in range(slots):
      at = _tma_base_word(staged, _const(slot), slots, rotate)
      llvm.inline_asm(
          ir.Type.parse("!llvm.void"), [at, dead],
          "{ .reg .pred p; .reg .b32 a, z; setp.ne.u32 p, $1, 0; mov.b32 z, 0;\n"
          + "".join(f"xor.b32 a, $0, {16 * j}; @p st.shared.b32 [a], z;\n"
                    for j in range(8))
          + "}", "r,r", has_side_effects=True)
  zero(base_s)


def prefetch_base(base_g, step, block, *, tiles: int, vocab: int, batch: int):
  """Bring the block's base logits of ``step`` ([B', K, V] bf16: each request's
  ``tiles`` × 64 columns from the block's first, clamped at V) into the L2, one bulk
  prefetch a request by thread ``t`` < ``batch`` of the calling warpgroup: the base
  logits do not depend on the tokens, so a step's can be on chip before its tiles load
  them (from the HBM, one tile ahead, they were late). GPU only; no effect on values."""
  width = base_g.shape[2]
  steps = base_g.shape[1]
  first = block * (tiles * TILE)
  columns = jnp.minimum(tiles * TILE, vocab - first)
  firsts, counts, steps_at = row_array(first), row_array(columns), row_array(step)

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) + (plgpu.Layout.WGMMA.reduce(1),) * 3)
  def prefetch(_, base, first_rows, count_rows, step_rows):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    from wts_jax.pallas.row_words import thread_and_addresses
    thread, _, (base_at,) = thread_and_addresses((), (base,))
    request = arith.remui(thread, _const(128))
    live = arith.cmpi(arith.CmpIPredicate.slt, request, _const(batch))
    row = arith.select(live, request, _const(0))
    element = arith.addi(arith.muli(arith.addi(arith.muli(row, _const(steps)),
                                               _scalar(step_rows)), _const(width)),
                         _scalar(first_rows))
    i64 = ir.IntegerType.get_signless(64)
    at = arith.addi(base_at, arith.muli(arith.extui(i64, element), arith.constant(i64, 2)))
    size = arith.muli(_scalar(count_rows), _const(2))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [at, size, arith.extui(_i32(), live)],
        "{ .reg .pred p; setp.ne.u32 p, $2, 0;\n"
        "@p cp.async.bulk.prefetch.L2.global [$0], $1; }", "l,r,r", has_side_effects=True)

  prefetch(base_g, firsts, counts, steps_at)


def wait_copies():
  """Wait for all of this thread's ``cp.async`` copies (``copy_base``)."""
  @plgpu.inline_mgpu()
  def wait(_):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import llvm
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [], "cp.async.wait_all;", "",
                    has_side_effects=True)
  wait()


def warpgroup_sync():
  """``bar.sync`` of the calling warpgroup's 128 threads (Mosaic's warpgroup barrier):
  the shared-memory stores any of them issued before it, inline PTX ones included
  (``publish_bests``'s NaN flag), are seen by all of them after it. Every thread of
  the warpgroup must reach it."""
  @plgpu.inline_mgpu()
  def sync(_):
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    mgpu_utils.warpgroup_barrier()
  sync()


def row_array(value):
  """A scalar as a [64] array of the WGMMA row layout (``_scalar`` reads it back)."""
  return plgpu.layout_cast(jnp.full((2 * REQUESTS,), value, jnp.int32),
                           plgpu.Layout.WGMMA.reduce(1))


# --- a sampled walk: each request's score scale, noise switch and noise stream ---------

def sampling_state(scale_g, noise_g, seed_g, step, *, rows: int, row_offset: int,
                   phases: int, wg, interpret: bool, rotate: bool = False):
  """This warpgroup's requests' (score scale, noise on, the step's noise stream) for a
  sampled walk: ``scale_g`` [B'] f32, ``noise_g`` [B'] int32 (non-zero: Gumbel noise
  added), ``seed_g`` [2] uint32 (``sampling.seed_words``); the stream is
  ``sampling.stream_key`` of the request's row in the whole walk (``row_offset`` + its
  index here) at ``step``. Rows past ``rows``: scale 1, no noise. GPU: three per-thread
  arrays; interpreted: three [32] arrays (``scale_g`` and ``noise_g`` padded to whole
  blocks of 32 requests)."""
  if interpret:
    first = (wg // phases) * REQUESTS
    request = first + jnp.arange(REQUESTS, dtype=jnp.int32)
    stream = sampling.stream_key((seed_g[0], seed_g[1]), request + row_offset,
                                 jnp.full((REQUESTS,), step, jnp.int32))
    return scale_g[pl.ds(first, REQUESTS)], noise_g[pl.ds(first, REQUESTS)], stream
  types = tuple(plgpu.ShapeDtypeStruct(CARRY, dtype, layout=plgpu.Layout.WGMMA)
                for dtype in (jnp.float32, jnp.int32, jnp.int32))

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 3 + (plgpu.Layout.WGMMA.reduce(1),),
                     return_type=types)
  def load(_, scales, noise, seed, step_rows):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    from wts_jax.pallas.row_words import thread_and_addresses
    _, _, (scales_at, noise_at, seed_at) = thread_and_addresses((), (scales, noise, seed))
    request, _ = _request(phases, rotate)
    live = arith.extui(_i32(), arith.cmpi(arith.CmpIPredicate.slt, request, _const(rows)))
    i64 = ir.IntegerType.get_signless(64)
    offset = arith.extui(i64, arith.muli(request, _const(4)))

    def word(base, type_, default, asm_type, live_=live, at=offset):
      return llvm.inline_asm(
          type_, [arith.addi(base, at), live_],
          "{ .reg .pred p; setp.ne.u32 p, $2, 0; mov.b32 $0, " + default + ";\n"
          f"@p ld.global.nc.{asm_type} $0, [$1]; }}", "=" + ("f" if asm_type == "f32"
                                                            else "r") + ",l,r",
          has_side_effects=False)
    f32 = ir.F32Type.get()
    scale = word(scales_at, f32, "0f3F800000", "f32")
    noise_on = word(noise_at, _i32(), "0", "b32")
    seeds = [word(seed_at, _i32(), "0", "b32", _const(1), arith.constant(i64, 4 * k))
             for k in range(2)]
    counter = arith.ori(arith.shli(arith.addi(request, _const(row_offset)), _const(16)),
                        _scalar(step_rows))
    stream = _mix32(arith.addi(_mix32(arith.xori(counter, seeds[0])), seeds[1]))
    return (_per_thread(scale, jnp.float32), _per_thread(noise_on, jnp.int32),
            _per_thread(stream, jnp.int32))

  return load(scale_g, noise_g, seed_g, row_array(step))


def _mix32(x):
  """``sampling.mix32`` on an i32 value (wrapping, logical shifts)."""
  from jax._src.lib.mlir.dialects import arith
  for shift, multiplier in ((16, sampling._MIX_MUL_1), (15, sampling._MIX_MUL_2)):
    x = arith.muli(arith.xori(x, arith.shrui(x, _const(shift))), _const(multiplier))
  return arith.xori(x, arith.shrui(x, _const(15)))


def _log_positive(x):
  """``sampling.log_positive`` on an f32 value, the same operations in the same order."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith
  f32 = ir.F32Type.get()

  def real(value):
    return arith.constant(f32, value)
  bits = arith.addi(arith.bitcast(_i32(), x),
                    _const(sampling._ONE_BITS - sampling._SQRT_HALF_BITS))
  k = arith.subi(arith.shrui(bits, _const(23)), _const(0x7F))
  mantissa = arith.addi(arith.andi(bits, _const(0x007FFFFF)), _const(sampling._SQRT_HALF_BITS))
  f = arith.subf(arith.bitcast(f32, mantissa), real(1.0))
  coefficients = sampling._LOG1P_CUBIC_COEFFICIENTS
  p = real(coefficients[-1])
  for coefficient in reversed(coefficients[:-1]):
    p = arith.addf(arith.mulf(p, f), real(coefficient))
  f_squared = arith.mulf(f, f)
  rest = arith.subf(arith.mulf(arith.mulf(f_squared, f), p),
                    arith.mulf(real(0.5), f_squared))
  dk = arith.sitofp(f32, k)
  return arith.addf(arith.mulf(dk, real(sampling._LN2_HI)),
                    arith.addf(f, arith.addf(rest, arith.mulf(dk, real(sampling._LN2_LO)))))


def _gumbel(vocab_index, stream):
  """``gumbel_from_uniform(uniform_from_stream(stream, vocab_index))`` on i32 values."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith
  f32 = ir.F32Type.get()
  bits = _mix32(arith.addi(_mix32(arith.xori(vocab_index, stream)), stream))
  mantissa = arith.sitofp(f32, arith.shrui(bits, _const(9)))
  u = arith.mulf(arith.addf(mantissa, arith.constant(f32, 0.5)),
                 arith.constant(f32, 1.0 / (1 << 23)))
  return arith.negf(_log_positive(arith.negf(_log_positive(u))))


# --- a tile folded into each request's running best -----------------------------------

def initial_best(interpret: bool):
  """(score, index, NaN witness) before a step's first tile: interpreted the witness is
  a NaN flag, on the GPU the running NaN-propagating maximum of the logits."""
  shape = (REQUESTS,) if interpret else CARRY
  def full(value, dtype):
    array = jnp.full(shape, value, dtype)
    return array if interpret else plgpu.layout_cast(array, plgpu.Layout.WGMMA)
  return (full(float("-inf"), jnp.float32), full(BIG_INDEX, jnp.int32),
          full(0, jnp.int32) if interpret else full(float("-inf"), jnp.float32))


def fold_tile(acc, base, s_lo, scales_s, best, start, *, interpret: bool,
              sampled=None, column_pairs: int | None = None,
              base_s=None, slots: int = 0, copies_pending: int = 1, tma_slots: bool = False,
              rotate: bool = False, live_rows: int | None = None, phases: int = 1,
              pairs: tuple[int, int] = (0, TILE // 8), thread_rows: bool = False,
              vector_reads: bool = False):
  """The tile's logits, ((f32(256 d_hi + d_lo) · s_lo) · scale2) + base (the order of
  ``wts_jax.int8_state``), folded into ``best`` (score, vocab row, NaN seen; ties to the
  lower row). ``acc`` [64, 64] int32 stacked accumulators, ``scales_s`` the tile's 64
  W2 row scales in shared memory, ``start`` its first vocab row. GPU: the score itself
  kept by a NaN-propagating maximum, its row by the column's constant (the tile's first
  row added once), and returned again as the NaN witness (a NaN then wins the exchange,
  flagged).
  ``sampled`` (``sampling_state``'s): the score is ``logit · scale`` plus, where the
  request's noise is on, its Gumbel noise at the row (``reference.select_tokens``).
  ``column_pairs`` (GPU, timing only): fold only the first that many of a thread's 8
  column pairs. ``base_s`` (GPU): ``base`` is the slot of the tile's base logits in
  ``base_s``: ``copy_base``'s, its words waited for here (all but the latest
  ``copies_pending`` copy groups), or with ``tma_slots`` a TMA copy's (``base_of`` in
  the kernel; its barrier waited for before). ``rotate``: the warps' requests as
  ``_request_warp`` has them. ``live_rows`` (GPU): a warp whose requests are all at or
  past it (the batch; ``phases`` as ``_request``'s) folds nothing, its best kept.
  ``pairs`` (GPU): (first, count) of the thread's 8 column pairs this call folds, ``acc``
  then holding only their 8 · count columns (``StackedLab.timing_ablation``
  "narrow_mma"). ``thread_rows``: the tile's W2 is ``int8_state.thread_rows_ordered`` (accumulator column
  8j + 2t + e is the tile's row 16t + 2j + e), its base words ``copy_base``'s with
  ``thread_rows`` or a TMA copy's (GPU), read as two 16-byte loads with TMA slots or
  ``vector_reads`` (else eight 4-byte ones)."""
  if (tma_slots or vector_reads) and thread_rows and pairs != (0, TILE // 8):
    raise ValueError("the base words' 16-byte reads take a whole tile (pairs (0, 8))")
  if interpret and thread_rows:   # (column 8j + 2t + e back to row 16t + 2j + e)
    acc = acc.reshape(-1, 8, 4, 2).transpose(0, 2, 1, 3).reshape(acc.shape)
  if interpret:
    d = acc.reshape(4, 2, 8, TILE)
    joined = (d[:, 0] * LO_STEPS + d[:, 1]).reshape(REQUESTS, TILE)
    logits = (joined.astype(jnp.float32) * s_lo[:, None]) * scales_s[...][None, :] + base
    rows = start + jnp.arange(TILE, dtype=jnp.int32)
    if sampled is not None:
      scale, noise_on, stream = sampled
      noise = sampling.gumbel_from_uniform(
          sampling.uniform_from_stream(stream[:, None], rows[None, :]))
      logits = logits * scale[:, None] + jnp.where(noise_on[:, None] != 0, noise, 0.0)
    top = logits.max(axis=1)
    top_index = jnp.where(logits == top[:, None], rows[None, :], BIG_INDEX).min(axis=1)
    value, index, nan = best
    better = (top > value) | ((top == value) & (top_index < index))
    nan = nan | jnp.where(jnp.isnan(logits), 1, 0).max(axis=1)
    return jnp.where(better, top, value), jnp.where(better, top_index, index), nan

  starts = row_array(start)
  carry = plgpu.ShapeDtypeStruct(CARRY, jnp.float32, layout=plgpu.Layout.WGMMA)
  carry_i = plgpu.ShapeDtypeStruct(CARRY, jnp.int32, layout=plgpu.Layout.WGMMA)
  staged = base_s is not None
  # (optional arguments after the fixed ones: the base slots' ref, the sampling state)
  extra = ((base_s,) if staged else ()) + (() if sampled is None else (sampled,))
  extra_types = (((plgpu.RefType(transforms=TMA_BASE_TRANSFORMS if tma_slots else ()),)
                  if staged else ())
                 + (() if sampled is None else (((plgpu.Layout.WGMMA,) * 3),)))

  @plgpu.inline_mgpu(
      arg_types=(plgpu.Layout.WGMMA,
                 plgpu.Layout.WGMMA.reduce(1) if staged else plgpu.Layout.WGMMA,
                 plgpu.Layout.WGMMA,
                 plgpu.RefType(), (plgpu.Layout.WGMMA,) * 3, plgpu.Layout.WGMMA.reduce(1))
      + extra_types,
      return_type=(carry, carry_i, carry))
  def fold(_, acc, base, s_lo, scales, best, start_rows, *rest):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, scf
    value, index, top = (_scalar(b) for b in best)
    if live_rows is None:
      folded = fold_values(acc, base, s_lo, scales, start_rows, rest, value, index, top)
    else:   # (warp-uniform: a warp's 8 requests, from its first)
      request, (_, g, _) = _request(phases, rotate)
      warp_first = arith.subi(request, g)
      live = arith.cmpi(arith.CmpIPredicate.slt, warp_first, _const(live_rows))
      branch = scf.IfOp(live, [value.type, index.type, top.type], has_else=True)
      with ir.InsertionPoint(branch.then_block):
        scf.YieldOp(list(fold_values(acc, base, s_lo, scales, start_rows, rest, value,
                                     index, top)))
      with ir.InsertionPoint(branch.else_block):
        scf.YieldOp([value, index, top])
      folded = branch.results
    value, index, top = folded
    return (_per_thread(value, jnp.float32), _per_thread(index, jnp.int32),
            _per_thread(top, jnp.float32))

  def fold_values(acc, base, s_lo, scales, start_rows, rest, value, index, top):
    """The fold's (value, index, NaN witness) scalars after the tile."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, vector
    f32 = ir.F32Type.get()
    sampling_state = rest[1:] if staged else rest
    first_pair, count = pairs
    read = range(first_pair, first_pair + count)   # (the half's base words, all read)
    folded = read if column_pairs is None else range(
        first_pair, max(first_pair, min(first_pair + count, column_pairs)))
    if staged:
      if thread_rows and (tma_slots or vector_reads):   # (pair k: chunk k // 4, word k % 4)
        if tma_slots:   # (its request's row, chunks 2t and 2t + 1, swizzled)
          word_at = _tma_base_chunk(rest[0], _scalar(base), slots, rotate)
          reads = ("{ .reg .b32 a;\n"
                   f"xor.b32 a, ${count}, 16;\n"
                   f"ld.shared.v4.b32 {{$0, $1, $2, $3}}, [${count}];\n"
                   "ld.shared.v4.b32 {$4, $5, $6, $7}, [a]; }")
        else:
          word_at = _base_slot_chunk(rest[0], _scalar(base), slots)
          reads = (f"cp.async.wait_group {copies_pending};\n"
                   f"ld.shared.v4.b32 {{$0, $1, $2, $3}}, [${count}];\n"
                   f"ld.shared.v4.b32 {{$4, $5, $6, $7}}, [${count}+2048];")
      elif thread_rows:   # (pair k: chunk k // 4, word k % 4)
        word_at = _base_slot_chunk(rest[0], _scalar(base), slots)
        reads = f"cp.async.wait_group {copies_pending};\n" + "".join(
            f"ld.shared.b32 ${k - first_pair}, [${count}+{2048 * (k // 4) + 4 * (k % 4)}];\n"
            for k in read)
      elif tma_slots:   # (word k at word 0's address XOR 16 k: the swizzle)
        word_at = _tma_base_word(rest[0], _scalar(base), slots, rotate)
        reads = "{ .reg .b32 a;\n" + "".join(
            f"xor.b32 a, ${count}, {16 * k}; ld.shared.b32 ${k - first_pair}, [a];\n"
            for k in read) + "}"
      else:
        word_at = _base_slot_word(rest[0], _scalar(base), slots)
        reads = f"cp.async.wait_group {copies_pending};\n" + "".join(
            f"ld.shared.b32 ${k - first_pair}, [${count}+{128 * 4 * k}];\n"
            for k in read)
      words_type = ir.Type.parse("!llvm.struct<(" + ", ".join(["i32"] * count) + ")>")
      words = llvm.inline_asm(words_type, [word_at], reads,
                              ",".join(["=r"] * count) + ",r", has_side_effects=True)
      bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
      base_words = {k: llvm.bitcast(bf16x2, llvm.extractvalue(_i32(), words, [k - first_pair]))
                    for k in read}
    else:
      base_words = {j: base.registers[0, j, 0, 0, 0, 0, 0, 0, 0] for j in read}
    f32x2 = ir.VectorType.get((2,), f32)
    index_type = ir.IndexType.get()
    _, _, _, _, t = _thread()
    scale_lo = vector.broadcast(f32x2, _scalar(s_lo))
    lo_steps = vector.broadcast(ir.VectorType.get((2,), _i32()), _const(LO_STEPS))
    # (the thread's first column's row in the tile, and its pairs' step)
    pair = arith.muli(t, _const(16 if thread_rows else 2))
    pair_step = 2 if thread_rows else 8
    first = arith.addi(_scalar(start_rows), pair)
    # A thread meets its request's rows in ascending order through the step (tiles in
    # ascending order, columns ascending in each; a clamped last tile only repeats rows
    # with their own index), so a strictly greater score is the only way to win.
    if sampling_state:
      score_scale, noise_on, stream = (_scalar(v) for v in sampling_state[0])
      noise_on = arith.cmpi(arith.CmpIPredicate.ne, noise_on, _const(0))
    column_won = _const(-1)
    for j in folded:
      hi = acc.registers[0, j - first_pair, 0, 0, 0, 0, 0, 0, 0]
      lo = acc.registers[0, j - first_pair, 0, 0, 1, 0, 0, 0, 0]
      d = arith.addi(arith.muli(hi, lo_steps), lo)
      logits = arith.mulf(arith.sitofp(f32x2, d), scale_lo)
      column = arith.index_cast(index_type, arith.addi(pair, _const(pair_step * j)))
      logits = arith.mulf(logits, vector.load(f32x2, scales, [column]))
      logits = arith.addf(logits, arith.extf(f32x2, base_words[j]))
      for e in range(2):
        logit = _element(logits, e)
        if sampling_state:
          noise = _gumbel(arith.addi(first, _const(pair_step * j + e)), stream)
          logit = arith.addf(arith.mulf(logit, score_scale),
                             arith.select(noise_on, noise, arith.constant(f32, 0.0)))
        better = arith.cmpf(arith.CmpFPredicate.OGT, logit, value)
        column_won = arith.select(better, _const(pair_step * j + e), column_won)
        value = arith.maximumf(value, logit)   # (NaN-propagating)
    won = arith.cmpi(arith.CmpIPredicate.sge, column_won, _const(0))
    index = arith.select(won, arith.addi(first, column_won), index)
    return value, index, value

  return fold(acc, base, s_lo, scales_s, best, starts, *extra)


def _element(register, e: int):
  from jax._src.lib.mlir.dialects import vector
  return vector.extract(register, dynamic_position=[], static_position=[e])


# --- the step's bests: each request's over its four lanes, to shared memory -------------

def store_bests(best, value_s, index_s, nan_s, *, wg, interpret: bool,
                rotate: bool = False):
  """This warpgroup's best per request into row ``wg`` of ``value_s`` / ``index_s`` /
  ``nan_s`` ([4, 32] in shared memory): GPU, the four lanes of a request reduced by
  shuffles (ties to the lower row) and stored by lane t = 0 (``rotate``: the warps'
  requests as ``_request_warp`` has them)."""
  if interpret:
    for ref, part in zip((value_s, index_s, nan_s), best):
      ref[wg] = part
    return

  @plgpu.inline_mgpu(arg_types=((plgpu.Layout.WGMMA,) * 3, plgpu.RefType(),
                                plgpu.RefType(), plgpu.RefType()))
  def store(_, best, values, indices, nans):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    from wts_jax.pallas.row_words import thread_and_addresses
    thread, (values_at, indices_at, nans_at), _ = thread_and_addresses(
        (values, indices, nans))
    # (the request's slot, warpgroup · 32 + request warp · 8 + g, in bytes; as
    # thread & ~3 unrotated)
    _, wg_, warp, g, _ = _thread()
    slot_warp = _request_warp(warp, wg_, rotate)
    slot = arith.addi(arith.muli(wg_, _const(REQUESTS)),
                      arith.addi(arith.muli(slot_warp, _const(8)), g))
    slot_at = arith.muli(slot, _const(4))
    value, index, nan = (_scalar(b) for b in best)
    shuffles = "".join(
        f"shfl.sync.bfly.b32 v2, v, {m}, 0x1f, 0xffffffff;\n"
        f"shfl.sync.bfly.b32 i2, i, {m}, 0x1f, 0xffffffff;\n"
        f"shfl.sync.bfly.b32 n2, n, {m}, 0x1f, 0xffffffff;\n"
        "setp.gt.f32 p, v2, v; setp.eq.f32 q, v2, v; setp.lt.s32 r, i2, i;\n"
        "and.pred q, q, r; or.pred p, p, q;\n"
        "@p mov.b32 v, v2; @p mov.b32 i, i2; or.b32 n, n, n2;\n" for m in (1, 2))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"),
        [value, index, nan, thread, values_at, indices_at, nans_at, slot_at],
        "{ .reg .pred p, q, r; .reg .b32 v, i, n, v2, i2, n2, at;\n"
        "mov.b32 v, $0; mov.b32 i, $1;\n"
        "setp.nan.f32 p, $2, $2; selp.b32 n, 1, 0, p;\n" + shuffles +
        "and.b32 at, $3, 3; setp.eq.u32 p, at, 0; mov.b32 at, $7;\n"
        "add.u32 v2, at, $4; @p st.shared.b32 [v2], v;\n"
        "add.u32 v2, at, $5; @p st.shared.b32 [v2], i;\n"
        "add.u32 v2, at, $6; @p st.shared.b32 [v2], n; }",
        "f,r,f,r,r,r,r,r", has_side_effects=True)

  store(best, value_s, index_s, nan_s)


# --- the block's best per request, into the grid's keys ----------------------------------

def _publish_key_ptx(*, thread: str, slots: str, rows: int, phases: int) -> str:
  """PTX of ``publish_bests`` (operands $0-$3: the bests' values, indices, NaN flags and
  the flag word, in shared memory; ``thread`` and ``slots`` the thread's index and the
  global slots): predicate p (thread < ``rows``), the request's best over its
  ``phases`` warpgroups in v, i (its NaN in n), its key ``red.max``ed at [g], and a NaN
  seen into the flag word."""
  from wts_jax.pallas import grid_sync
  slot_bytes = 4 * grid_sync.KEY_ROW_WORDS
  offsets = [4 * REQUESTS * k for k in range(phases)]
  entries = "".join(
      f"add.u32 sa, base, {offset};\n"
      "add.u32 x, sa, $0; @p ld.shared.f32 v2, [x];\n"
      "add.u32 x, sa, $1; @p ld.shared.b32 i2, [x];\n"
      "add.u32 x, sa, $2; @p ld.shared.b32 n2, [x];\n"
      "setp.gt.f32 q, v2, v; setp.eq.f32 r, v2, v; setp.lt.s32 s, i2, i;\n"
      "and.pred r, r, s; or.pred q, q, r;\n"
      "@q mov.f32 v, v2; @q mov.b32 i, i2; or.b32 n, n, n2;\n" for offset in offsets)
  return (
      f"setp.lt.u32 p, {thread}, {rows};\n"
      "mov.f32 v, 0fFF800000; mov.b32 i, 0x40000000; mov.b32 n, 0;\n"
      # (row (t / 32) · phases of the bests, column t % 32)
      f"shr.u32 base, {thread}, 5; mul.lo.u32 base, base, {phases * 4 * REQUESTS};\n"
      f"and.b32 x, {thread}, 31; shl.b32 x, x, 2; add.u32 base, base, x;\n"
      + entries +
      # orderable(v) << 32 | (2^32 - 1 - i)
      "mov.b32 bits, v; setp.ge.u32 q, bits, 0x80000000;\n"
      "not.b32 hi, bits; @!q or.b32 hi, bits, 0x80000000;\n"
      "not.b32 lo, i; mov.b64 key, {lo, hi};\n"
      f"mul.wide.u32 off, {thread}, {slot_bytes}; add.u64 g, {slots}, off;\n"
      "@p red.relaxed.gpu.global.max.u64 [g], key;\n"
      "setp.ne.and.u32 q, n, 0, p; mov.b32 x, 1; @q st.shared.b32 [$3], x;\n")


def publish_bests(value_s, index_s, nan_s, flag_s, slots_g, *, rows: int, phases: int):
  """Thread t < ``rows`` of the calling warpgroup: request t's best over the ``phases``
  warpgroups that served it (rows ``(t / 32) · phases + k`` of the [4, 32] bests), as a
  64-bit exchange key ``red.max``ed into its slot of ``slots_g`` (``grid_sync``'s keys:
  8 words a slot); a NaN seen sets ``flag_s[0]``."""
  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 5)
  def publish(_, values, indices, nans, flag, slots):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import llvm
    from wts_jax.pallas.row_words import thread_and_addresses
    thread, shared, (slots_at,) = thread_and_addresses((values, indices, nans, flag),
                                                       (slots,))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [*shared, slots_at, thread],
        "{ .reg .pred p, q, r, s; .reg .f32 v, v2; .reg .b32 i, i2, n, n2, x, sa, base,"
        " hi, lo, bits, ci; .reg .b64 key, g, off, pa;\n"
        + _publish_key_ptx(thread="$5", slots="$4", rows=rows, phases=phases) + "}",
        "r,r,r,r,l,r", has_side_effects=True)

  publish(value_s, index_s, nan_s, flag_s, slots_g)


def tokens_from_keys(slots_g, tok_s, tok_g, step, *, rows: int, vocab: int):
  """Thread t < 64 of the calling warpgroup, once the grid counter says every block's
  key is in: request t's winning row (t < ``rows``; its key's low word, clamped into
  [0, V)), else 0, straight from its slot of ``slots_g`` into ``tok_s[t]`` and, in
  block 0, ``tok_g[t, step]`` (``tok_g`` [rows, K]) — no copy of the keys in shared
  memory and no second barrier (the stores are visible to other threads after the
  next one)."""
  from wts_jax.pallas import grid_sync

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 3 + (plgpu.Layout.WGMMA.reduce(1),))
  def read(_, slots, tokens, token_out, step_rows):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import llvm
    from wts_jax.pallas.row_words import thread_and_addresses
    thread, (tokens_at,), (slots_at, out_at) = thread_and_addresses((tokens,),
                                                                    (slots, token_out))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [tokens_at, slots_at, out_at, thread,
                                      _scalar(step_rows)],
        "{ .reg .pred p, q, r; .reg .b32 i, lo, hi, sa, ctaid; .reg .b64 key, g, off;\n"
        f"setp.lt.u32 p, $3, {rows}; setp.lt.u32 q, $3, {2 * REQUESTS};\n"
        "mov.b32 i, 0;\n"
        f"mul.wide.u32 off, $3, {4 * grid_sync.KEY_ROW_WORDS}; add.u64 g, $1, off;\n"
        "@p ld.relaxed.gpu.global.b64 key, [g];\n"
        "@p mov.b64 {lo, hi}, key; @p not.b32 i, lo;\n"
        f"min.s32 i, i, {vocab - 1}; max.s32 i, i, 0;\n"
        "shl.b32 sa, $3, 2; add.u32 sa, sa, $0; @q st.shared.b32 [sa], i;\n"
        + _token_out_ptx(steps=tok_g.shape[1], out="$2", thread="$3", step="$4") + "}",
        "r,l,l,r,r", has_side_effects=True)

  read(slots_g, tok_s, tok_g, row_array(step))


def _token_out_ptx(*, steps: int, out: str, thread: str, step: str,
                   valid: str = "p") -> str:
  """PTX: in block 0, where predicate ``valid`` holds (request ``thread`` is one of the
  walk's), ``i`` to the tokens' output [rows, K] at (thread, step)."""
  return (f"mov.u32 ctaid, %ctaid.x; setp.eq.and.u32 r, ctaid, 0, {valid};\n"
          f"mad.lo.u32 sa, {thread}, {steps}, {step};\n"
          f"mul.wide.u32 off, sa, 4; add.u64 g, {out}, off; @r st.global.b32 [g], i;\n")


def first_tokens(first_g, tok_s, flags_s, *, rows: int, vocab: int, status: int,
                 interpret: bool):
  """The walk's first tokens (``first_g`` [rows] int32) into ``tok_s`` (thread t < 64 of
  the calling warpgroup its request's, clamped into [0, V); past ``rows`` 0), and
  ``status`` or-ed into ``flags_s[1]`` (zero, its store visible) if any is outside
  [0, V)."""
  if interpret:
    given = jnp.pad(first_g[...], (0, 2 * REQUESTS - rows))
    live = jnp.arange(2 * REQUESTS) < rows
    tok_s[...] = jnp.where(live, jnp.clip(given, 0, vocab - 1), 0)
    outside = jnp.where(live & ((given < 0) | (given >= vocab)), 1, 0).max()
    flags_s[1] = jnp.where(outside > 0, status, 0)
    return

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),) * 3)
  def load(_, first, tokens, flag):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import llvm
    from wts_jax.pallas.row_words import thread_and_addresses
    thread, (tokens_at, flag_at), (first_at,) = thread_and_addresses((tokens, flag),
                                                                     (first,))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [tokens_at, flag_at, first_at, thread],
        "{ .reg .pred p, q, r; .reg .b32 i, c, sa; .reg .b64 g, off;\n"
        f"setp.lt.u32 p, $3, {rows}; setp.lt.u32 q, $3, {2 * REQUESTS};\n"
        "mov.b32 i, 0;\n"
        "mul.wide.u32 off, $3, 4; add.u64 g, $2, off; @p ld.global.b32 i, [g];\n"
        # (unsigned: a negative id is past V too)
        f"setp.ge.and.u32 r, i, {vocab}, p;\n"
        f"min.s32 c, i, {vocab - 1}; max.s32 i, c, 0;\n"
        f"mov.b32 c, {status}; @r red.shared.or.b32 [$1+4], c;\n"
        "shl.b32 sa, $3, 2; add.u32 sa, sa, $0; @q st.shared.b32 [sa], i; }",
        "r,r,l,r", has_side_effects=True)

  load(first_g, tok_s, flags_s)
