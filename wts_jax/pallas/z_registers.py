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

from wts_jax.pallas import mosaic_gpu_helpers as gpu

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

  @plgpu.inline_mgpu(arg_types=(gpu.read_ref(), gpu.read_ref()),
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
      return fragments(tok, w1_at, shape, source, rank, fragment_order)
    return tuple(fragments(tok, w1_at, shape,
                            lambda row, plane=plane: (row, constant(plane)), rank,
                            fragment_order)
                 for plane in range(2))

  return gather(tok_ref, w1_ref)


def fragments(tok, w1_at, shape, source, rank: int, fragment_order: bool = False,
               row_bytes: int | None = None):
  """A ``WGMMA_LAYOUT_8BIT`` array whose register at (row, k) holds the 4 bytes
  ``w1[tok[request], plane * r + k : + 4]`` for (request, plane) = ``source(row)``
  (``fragment_order``: read from ``int8_state.fragment_ordered``'s place of those bytes, four
  registers a 16-byte load). ``rank``: a plane's bytes; ``row_bytes``: a token's
  (default two planes)."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  from jax.experimental.mosaic.gpu import fragmented_array as fa
  i32 = ir.IntegerType.get_signless(32)
  if fragment_order:
    registers = _empty_registers(shape)
    for _, places, address in fragment_loads(tok, w1_at, shape, source, rank, row_bytes):
      _place(registers, places, llvm.inline_asm(
          _FOUR_WORDS(), [address], "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];",
          "=r,=r,=r,=r,l", has_side_effects=False))
    return fa.FragmentedArray(_registers=registers, _layout=fa.WGMMA_LAYOUT_8BIT,
                              _is_signed=True)
  from jax._src.lib.mlir.dialects import arith, memref
  import numpy as np
  index = ir.IndexType.get()
  layout = fa.WGMMA_LAYOUT_8BIT
  registers = _empty_registers(shape)
  for reg, (row, col) in zip(np.ndindex(registers.shape), layout.thread_idxs(shape)):
    request, plane = source(arith.index_cast(i32, row))
    token = memref.load(tok, [arith.index_cast(index, request)])
    address = _w1_address(w1_at, token, plane, arith.index_cast(i32, col), rank, row_bytes)
    # (Read-only for the kernel's life: the non-coherent path.)
    loaded = llvm.inline_asm(i32, [address], "ld.global.nc.b32 $0, [$1];", "=r,l",
                             has_side_effects=False)
    registers[reg] = llvm.bitcast(_WORD(), loaded)
  return fa.FragmentedArray(_registers=registers, _layout=layout, _is_signed=True)


# --- fragment order: a thread's registers four at a time ---------------------------------
# In ``int8_state.fragment_ordered`` a thread's four registers of 16-column tiles 4q to
# 4q + 3 (one row) are 16 contiguous bytes: 8 loads a thread for [64, 256] (2 rows × 4).

def _WORD():
  from jax._src.lib.mlir import ir
  return ir.VectorType.get((4,), ir.IntegerType.get_signless(8))


def _FOUR_WORDS():
  from jax._src.lib.mlir import ir
  return ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")


def _empty_registers(shape):
  import numpy as np
  from jax.experimental.mosaic.gpu import fragmented_array as fa
  return np.empty(fa.WGMMA_LAYOUT_8BIT.registers_shape(shape), dtype=object)


def _w1_address(w1_at, token, plane, col, rank: int, row_bytes: int | None = None):
  """W1's byte of ``token``'s ``plane`` (of ``rank`` bytes) at ``col``; a token's row
  is ``row_bytes`` (default two planes)."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith
  i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
  offset = arith.addi(arith.muli(token, arith.constant(i32, row_bytes or 2 * rank)),
                      arith.addi(arith.muli(plane, arith.constant(i32, rank)), col))
  return arith.addi(w1_at, arith.extui(i64, offset))


def _four_places(reg):
  """The four registers one 16-byte load fills: ``reg`` (a register of a 16-column tile
  4q) and the same register of tiles 4q + 1 to 4q + 3 — or None for a register that
  another load fills."""
  tile = reg[1]   # (the register's 16-column tile: its column is 16 · tile + 4 g)
  if tile % 4:
    return None   # (loaded with the tile three before it)
  return tuple((reg[0], tile + k, *reg[2:]) for k in range(4))


def fragment_loads(tok, w1_at, shape, source, rank: int, row_bytes: int | None = None):
  """This thread's 16-byte loads of a ``fragment_ordered`` W1 (see ``fragments``), in a
  fixed order: [(load number, the four register indices it fills, its global
  address)]."""
  import numpy as np
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, memref
  from jax.experimental.mosaic.gpu import fragmented_array as fa
  i32 = ir.IntegerType.get_signless(32)
  index = ir.IndexType.get()
  layout = fa.WGMMA_LAYOUT_8BIT
  loads = []
  for reg, (row, col) in zip(np.ndindex(layout.registers_shape(shape)),
                             layout.thread_idxs(shape)):
    places = _four_places(reg)
    if places is None:
      continue
    request, plane = source(arith.index_cast(i32, row))
    token = memref.load(tok, [arith.index_cast(index, request)])
    col = arith.index_cast(i32, col)   # g · r / 4 + 4 · tile
    col = arith.addi(arith.muli(arith.divui(arith.remui(col, arith.constant(i32, 16)),
                                            arith.constant(i32, 4)),
                                arith.constant(i32, rank // 4)),
                     arith.constant(i32, 4 * reg[1]))
    loads.append((len(loads), places,
                  _w1_address(w1_at, token, plane, col, rank, row_bytes)))
  return loads


def _place(registers, places, four):
  """The four 32-bit words of a 16-byte load into their registers."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  i32 = ir.IntegerType.get_signless(32)
  for k, place in enumerate(places):
    registers[place] = llvm.bitcast(_WORD(), llvm.extractvalue(i32, four, [k]))


def _gather_by_loads(tok_ref, w1_ref, *, rank: int, stacked: bool):
  """``gather_planes``'s values by Pallas loads (interpret mode)."""
  tokens = ROWS // 2 if stacked else ROWS
  rows = jnp.concatenate([w1_ref[pl.ds(tok_ref[b], 1), :] for b in range(tokens)], axis=0)
  hi, lo = rows[:, :rank], rows[:, rank:]
  if not stacked:
    return hi, lo
  return jnp.stack([(hi, lo)[plane][request] for request, plane in map(stacked_row,
                                                                       range(ROWS))])
