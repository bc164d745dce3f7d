"""z's int8 planes gathered from W1 straight into a WGMMA's A registers (Mosaic GPU).

The batched walk otherwise gathers each row's planes by a bulk copy into a staging,
waits, and moves them through registers into a swizzled WGMMA tile (a bulk copy cannot
swizzle). Here each thread loads its own fragments of the A operand (``WGMMA_LAYOUT_8BIT``:
4 int8 along K a register) from its rows' tokens' planes with ``ld.global.nc``: no
shared memory, no barrier, no round trip. Pallas has no gather into a register layout,
so the registers are built in ``plgpu.inline_mgpu``; in interpret mode (which runs no
inline Mosaic code) the same values come from Pallas loads, one row at a time.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

ROWS = 64   # the WGMMA's M


def stacked_row(m: int) -> tuple[int, int]:
  """Row ``m`` of a stacked operand: (request, plane). Rows 16w + g and 16w + g + 8 are
  request 8w + g's hi and lo planes, the two rows one thread of the WGMMA layout holds,
  so its accumulators of both planes meet in one thread (the public kernel's order)."""
  return (m // 16) * 8 + m % 8, (m // 8) % 2


def gather_planes(tok_ref, w1_ref, *, rank: int, stacked: bool = False,
                  interpret: bool = False, fragment_order: bool = False):
  """The A operand(s) of a token's int8 planes, ``w1_ref`` [V, 2r] int8 in global memory
  (a token's hi plane then its lo plane), ``tok_ref`` int32 tokens in shared memory, in
  range (their stores visible to every thread: a warpgroup barrier before). Returns
  (hi, lo), each [64, r] int8 whose row b is token ``tok_ref[b]``'s plane; or, with
  ``stacked``, one [64, r] whose row m is ``stacked_row(m)``'s plane of token
  ``tok_ref[request]`` (32 requests). In ``WGMMA_LAYOUT_8BIT`` on the GPU.
  ``fragment_order``: ``w1_ref`` is ``int8_state.fragment_ordered`` (GPU only)."""
  if interpret:
    if fragment_order:
      raise ValueError("fragment_order: the interpreted gather reads W1's own order")
    return _gather_by_loads(tok_ref, w1_ref, rank=rank, stacked=stacked)
  shape = (ROWS, rank)
  out = plgpu.ShapeDtypeStruct(shape, jnp.int8, layout=plgpu.Layout.WGMMA_8BIT)

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()),
                     return_type=out if stacked else (out, out))
  def gather(_, tok, w1):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    from jax.experimental.mosaic.gpu import utils as mgpu_utils
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    w1_at = llvm.ptrtoint(i64, mgpu_utils.memref_ptr(w1))

    def constant(value):
      return arith.constant(i32, value)

    if stacked:
      def source(row):   # (request, plane) of ``stacked_row``, on i32 values
        request = arith.addi(arith.muli(arith.divui(row, constant(16)), constant(8)),
                             arith.remui(row, constant(8)))
        return request, arith.remui(arith.divui(row, constant(8)), constant(2))
      return _fragments(tok, w1_at, shape, source, rank, fragment_order)
    return tuple(_fragments(tok, w1_at, shape,
                            lambda row, plane=plane: (row, constant(plane)), rank,
                            fragment_order)
                 for plane in range(2))

  return gather(tok_ref, w1_ref)


def _fragments(tok, w1_at, shape, source, rank: int, fragment_order: bool = False):
  """A ``WGMMA_LAYOUT_8BIT`` array whose register at (row, k) holds the 4 bytes
  ``w1[tok[request], plane * r + k : + 4]`` for (request, plane) = ``source(row)``
  (``fragment_order``: read from ``int8_state.fragment_ordered``'s place of those bytes, four
  registers a 16-byte load)."""
  import numpy as np
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm, memref
  from jax.experimental.mosaic.gpu import fragmented_array as fa
  i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
  index = ir.IndexType.get()
  word = ir.VectorType.get((4,), ir.IntegerType.get_signless(8))
  layout = fa.WGMMA_LAYOUT_8BIT
  registers = np.empty(layout.registers_shape(shape), dtype=object)
  four = ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")
  for reg, (row, col) in zip(np.ndindex(registers.shape), layout.thread_idxs(shape)):
    tile = reg[1]   # (the register's 16-column tile: its column is 16 · tile + 4 g)
    if fragment_order and tile % 4:
      continue   # (loaded with the tile three before it)
    request, plane = source(arith.index_cast(i32, row))
    token = memref.load(tok, [arith.index_cast(index, request)])
    col = arith.index_cast(i32, col)
    if fragment_order:   # g · r / 4 + 4 · tile
      col = arith.addi(arith.muli(arith.divui(arith.remui(col, arith.constant(i32, 16)),
                                              arith.constant(i32, 4)),
                                  arith.constant(i32, rank // 4)),
                       arith.constant(i32, 4 * tile))
    offset = arith.addi(arith.muli(token, arith.constant(i32, 2 * rank)),
                        arith.addi(arith.muli(plane, arith.constant(i32, rank)), col))
    address = arith.addi(w1_at, arith.extui(i64, offset))
    # (Read-only for the kernel's life: the non-coherent path.)
    if not fragment_order:
      loaded = llvm.inline_asm(i32, [address], "ld.global.nc.b32 $0, [$1];", "=r,l",
                               has_side_effects=False)
      registers[reg] = llvm.bitcast(word, loaded)
      continue
    loaded = llvm.inline_asm(four, [address], "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];",
                             "=r,=r,=r,=r,l", has_side_effects=False)
    for k in range(4):
      at = list(reg)
      at[1] = tile + k
      registers[tuple(at)] = llvm.bitcast(word, llvm.extractvalue(i32, loaded, [k]))
  return fa.FragmentedArray(_registers=registers, _layout=layout, _is_signed=True)


def _gather_by_loads(tok_ref, w1_ref, *, rank: int, stacked: bool):
  """``gather_planes``'s values by Pallas loads (interpret mode)."""
  tokens = ROWS // 2 if stacked else ROWS
  rows = jnp.concatenate([w1_ref[pl.ds(tok_ref[b], 1), :] for b in range(tokens)], axis=0)
  hi, lo = rows[:, :rank], rows[:, rank:]
  if not stacked:
    return hi, lo
  return jnp.stack([(hi, lo)[plane][request] for request, plane in map(stacked_row,
                                                                       range(ROWS))])
