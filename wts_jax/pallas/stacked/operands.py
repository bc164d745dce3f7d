"""What the stacked kernel reads each step: z's planes stacked into the WGMMA's A operand
in registers, each request's s_lo, and a tile's base logits (loaded into registers, or
copied into shared-memory slots by ``cp.async`` or TMA)."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas import z_registers
from wts_jax.pallas.stacked.threads import (CARRY, REQUESTS, TILE, const, first_request,
                                            i32, per_thread, request_warp, row_array,
                                            scalar, stacked_source, thread_ids,
                                            thread_request, tile_start)


def gather(tok_s, w1_g, s_lo_g, *, rank: int, phases: int, wg, interpret: bool,
           fragment_order: bool = False, rotate: bool = False):
  """(A, s_lo) of this warpgroup's 32 requests (tokens ``tok_s``, in range, their stores
  visible): A [64, r] int8 stacked planes of W1 (``w1_g`` [V, 2r]: hi then lo;
  ``fragment_order``: ``int8_state.fragment_ordered``), s_lo the requests' plane scale.
  GPU: A in ``WGMMA_LAYOUT_8BIT`` registers, s_lo a per-thread array. Interpreted:
  A [64, r] and s_lo [32]. ``rotate`` (GPU): the warps' requests as ``request_warp``
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

  @plgpu.inline_mgpu(arg_types=(gpu.read_ref(),) * 3, return_type=(a_type, s_type))
  def load(_, tok, w1, s_lo):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, memref
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    i64 = ir.IntegerType.get_signless(64)
    index = ir.IndexType.get()
    _, wg_, *_ = thread_ids()
    shape = (2 * REQUESTS, rank)
    a = z_registers.fragments(tok, llvm.ptrtoint(i64, mgpu_utils.memref_ptr(w1)),
                               shape, stacked_source(first_request(wg_, phases),
                                                      wg_ if rotate else None),
                               rank, fragment_order)
    request, _ = thread_request(phases, rotate)
    token = memref.load(tok, [arith.index_cast(index, request)])
    address = arith.addi(llvm.ptrtoint(i64, mgpu_utils.memref_ptr(s_lo)),
                         arith.extui(i64, arith.muli(token, const(4))))
    scale = llvm.inline_asm(ir.F32Type.get(), [address], "ld.global.nc.f32 $0, [$1];",
                            "=f,l", has_side_effects=False)
    return a, per_thread(scale, jnp.float32)

  return load(tok_s, w1_g, s_lo_g)


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

  @plgpu.inline_mgpu(arg_types=(gpu.read_ref(), plgpu.Layout.WGMMA.reduce(1),
                                plgpu.Layout.WGMMA.reduce(1)), return_type=out)
  def load(_, base, start_rows, step_rows):
    import numpy as np
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm, vector
    from jax.experimental.mosaic.gpu import fragmented_array as fa
    i64 = ir.IntegerType.get_signless(64)
    bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
    at, live = _base_address(base, scalar(start_rows), scalar(step_rows), steps=steps,
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
          i32(), [arith.addi(at, arith.constant(i64, 16 * j)),
                   arith.extui(i32(), live)],
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
  request, (_, _, t) = thread_request(phases, rotate)
  first_col = arith.addi(start, arith.muli(t, const(columns_a_thread)))
  live = arith.cmpi(arith.CmpIPredicate.slt, request, const(batch))
  row = arith.select(live, request, const(0))
  element = arith.addi(arith.muli(arith.addi(arith.muli(row, const(steps)), step),
                                  const(width)), first_col)
  at = arith.addi(llvm.ptrtoint(i64, mgpu_utils.memref_ptr(base)),
                  arith.muli(arith.extui(i64, element), arith.constant(i64, 2)))
  return at, live


def base_slot_word(staged, slot, slots: int):
  """This thread's first word in its warpgroup's ``slot`` (an i32 value) of the base
  slots ``staged`` (``copy_base``'s layout), as a shared-memory address."""
  from jax._src.lib.mlir.dialects import arith
  thread, slot_at = _slot_address(staged, slot, slots, BASE_SLOT_BYTES)
  return arith.addi(slot_at, arith.muli(arith.remui(thread, const(128)), const(4)))


def base_slot_chunk(staged, slot, slots: int):
  """This thread's first 16-byte chunk in its warpgroup's ``slot`` (``copy_base`` with
  ``thread_rows``): chunk c of thread t at (c · 128 + t) · 16, so a warp's copies and
  reads of one chunk are contiguous."""
  from jax._src.lib.mlir.dialects import arith
  thread, slot_at = _slot_address(staged, slot, slots, BASE_SLOT_BYTES)
  return arith.addi(slot_at, arith.muli(arith.remui(thread, const(128)), const(16)))


def _slot_address(staged, slot, slots: int, slot_bytes: int):
  """(this thread's block-wide index, the shared-memory address of its warpgroup's
  ``slot`` (an i32 value) of ``slots`` a warpgroup of ``slot_bytes`` each in ``staged``)."""
  from jax._src.lib.mlir.dialects import arith
  from wts_jax.pallas.row_words import thread_and_addresses
  thread, (staged_at,), _ = thread_and_addresses((staged,))
  _, wg, *_ = thread_ids()
  return thread, arith.addi(staged_at, arith.muli(
      arith.addi(arith.muli(wg, const(slots)), slot), const(slot_bytes)))


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

  @plgpu.inline_mgpu(arg_types=(gpu.read_ref(), plgpu.RefType())
                     + (plgpu.Layout.WGMMA.reduce(1),) * 3)
  def copy(_, base, staged, start_rows, step_rows, slot_rows):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    at, live = _base_address(base, scalar(start_rows), scalar(step_rows), steps=steps,
                             width=width, batch=batch, phases=phases, rotate=rotate,
                             columns_a_thread=16 if thread_rows else 2)
    if thread_rows:
      dst = base_slot_chunk(staged, scalar(slot_rows), slots)
      size = arith.select(live, const(16), const(0))
      llvm.inline_asm(ir.Type.parse("!llvm.void"), [dst, at, size],
                      "cp.async.cg.shared.global [$0], [$1], 16, $2;\n"
                      "cp.async.cg.shared.global [$0+2048], [$1+16], 16, $2;\n"
                      "cp.async.commit_group;", "r,l,r", has_side_effects=True)
      return
    dst = base_slot_word(staged, scalar(slot_rows), slots)
    size = arith.select(live, const(4), const(0))   # (0 bytes read: zeros written)
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


def tma_base_word(staged, slot, slots: int, rotate: bool = False):
  """This thread's word 0 in its warpgroup's ``slot`` (an i32 value) of the TMA base
  slots ``staged`` (``slots`` a warpgroup) as a shared-memory address: its word j is at
  that address XOR 16 j (its request's row, chunk j swizzled, byte 4 t)."""
  from jax._src.lib.mlir.dialects import arith
  at, g, t = _tma_base_row(staged, slot, slots, rotate)
  return arith.addi(at, arith.addi(arith.muli(g, const(16)), arith.muli(t, const(4))))


def _tma_base_row(staged, slot, slots: int, rotate: bool = False):
  """(the address of this thread's request's row in its warpgroup's TMA ``slot``, the
  thread's g and t): the row the swizzle XORs its chunks by (row % 8 = g)."""
  from jax._src.lib.mlir.dialects import arith
  _, at = _slot_address(staged, slot, slots, BASE_SLOT_BYTES)
  _, wg, warp, g, t = thread_ids()
  row = arith.addi(arith.muli(request_warp(warp, wg, rotate), const(8)), g)
  return arith.addi(at, arith.muli(row, const(2 * TILE))), g, t


def tma_base_chunk(staged, slot, slots: int, rotate: bool = False):
  """With W2 in its threads' rows: this thread's first 16-byte chunk (its request's row,
  chunk 2t, swizzled: at 16 · (2t ^ g) in the row) in its warpgroup's TMA ``slot``; its
  second, chunk 2t + 1, is at the first's address XOR 16 within the row."""
  from jax._src.lib.mlir.dialects import arith
  at, g, t = _tma_base_row(staged, slot, slots, rotate)
  return arith.addi(at, arith.muli(arith.xori(arith.muli(t, const(2)), g), const(16)))


def zero_unread_rows(base_s, *, batch: int, phases: int, slots: int, rotate: bool = False):
  """Zeros in the TMA base slots' rows past the batch (the copies write the live rows
  only), each thread its own words in its warpgroup's slots: the fold of a request past
  the batch then reads zeros, as the async copies' zero fill gives it."""
  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(transforms=TMA_BASE_TRANSFORMS),))
  def zero(_, staged):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    request, _ = thread_request(phases, rotate)
    dead = arith.extui(i32(), arith.cmpi(arith.CmpIPredicate.sge, request, const(batch)))
    for slot in range(slots):
      at = tma_base_word(staged, const(slot), slots, rotate)
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

  @plgpu.inline_mgpu(arg_types=(gpu.read_ref(),) + (plgpu.Layout.WGMMA.reduce(1),) * 3)
  def prefetch(_, base, first_rows, count_rows, step_rows):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    from wts_jax.pallas.row_words import thread_and_addresses
    thread, _, (base_at,) = thread_and_addresses((), (base,))
    request = arith.remui(thread, const(128))
    live = arith.cmpi(arith.CmpIPredicate.slt, request, const(batch))
    row = arith.select(live, request, const(0))
    element = arith.addi(arith.muli(arith.addi(arith.muli(row, const(steps)),
                                               scalar(step_rows)), const(width)),
                         scalar(first_rows))
    i64 = ir.IntegerType.get_signless(64)
    at = arith.addi(base_at, arith.muli(arith.extui(i64, element), arith.constant(i64, 2)))
    size = arith.muli(scalar(count_rows), const(2))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [at, size, arith.extui(i32(), live)],
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
