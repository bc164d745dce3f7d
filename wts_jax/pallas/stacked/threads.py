"""The stacked kernel's threads and what they hold (pieces built in ``plgpu.inline_mgpu``
because Pallas has no op for them; each has its interpret-mode counterpart in
``jax.numpy``: interpret mode runs no inline Mosaic code).

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
from jax.experimental.pallas import mosaic_gpu as plgpu


TILE = 64        # W2 rows a tile (the WGMMA's N)
REQUESTS = 32    # requests a stacked operand holds
CARRY = (64, 8)  # a per-thread value's array (GPU)
BIG_INDEX = 1 << 30


def i32():
  from jax._src.lib.mlir import ir
  return ir.IntegerType.get_signless(32)


def const(value, type_=None):
  from jax._src.lib.mlir.dialects import arith
  return arith.constant(type_ or i32(), value)


def thread_ids():
  """(block-wide thread index, warpgroup, warp in it, g, t) as i32 values."""
  from jax._src.lib.mlir.dialects import arith
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  thread = mgpu_utils.thread_idx()
  if thread.type != i32():
    thread = arith.index_cast(i32(), thread)
  in_wg = arith.remui(thread, const(128))
  lane = arith.remui(in_wg, const(32))
  return (thread, arith.divui(thread, const(128)), arith.divui(in_wg, const(32)),
          arith.divui(lane, const(4)), arith.remui(lane, const(4)))


def per_thread(values, dtype):
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


def scalar(array):
  """The one value a thread's registers of ``array`` hold (a ``per_thread`` array, or a
  ``row_array``)."""
  return register_element(array.registers.flat[0], 0)


def register_element(register, e: int):
  from jax._src.lib.mlir.dialects import vector
  return vector.extract(register, dynamic_position=[], static_position=[e])


def request_warp(warp, wg, rotate: bool):
  """The warp of requests (8 rw .. 8 rw + 7 of the warpgroup's 32) that warp ``warp``
  of warpgroup ``wg`` serves: itself, or (``rotate``) rotated by the warpgroup, so the
  first requests of a partly filled block fall on a different warp scheduler in each
  warpgroup (warp w of every warpgroup issues on scheduler w)."""
  from jax._src.lib.mlir.dialects import arith
  return arith.andi(arith.addi(warp, wg), const(3)) if rotate else warp


def thread_request(phases: int, rotate: bool = False):
  """(request index in the walk, the thread's (request warp, g, t)): the block of 32
  requests a warpgroup serves is its index over ``phases`` (``request_warp``)."""
  from jax._src.lib.mlir.dialects import arith
  _, wg, warp, g, t = thread_ids()
  first = arith.muli(arith.divui(wg, const(phases)), const(REQUESTS))
  warp = request_warp(warp, wg, rotate)
  return arith.addi(first, arith.addi(arith.muli(warp, const(8)), g)), (warp, g, t)


def first_request(wg, phases: int):
  from jax._src.lib.mlir.dialects import arith
  return arith.muli(arith.divui(wg, const(phases)), const(REQUESTS))


def stacked_source(first, wg=None):
  """``z_registers.stacked_row`` on i32 rows, past the warpgroup's first request; with
  ``wg`` (an i32 value), each row's warp rotated as ``request_warp`` does."""
  from jax._src.lib.mlir.dialects import arith

  def source(row):
    warp = arith.divui(row, const(16))
    if wg is not None:
      warp = request_warp(warp, wg, True)
    request = arith.addi(arith.muli(warp, const(8)), arith.remui(row, const(8)))
    return (arith.addi(first, request),
            arith.remui(arith.divui(row, const(8)), const(2)))
  return source


def tile_start(block, tile: int, *, tiles: int, vocab: int):
  """The first vocab row of a block's tile, clamped so a tile never reads past V (the
  last tiles overlap earlier rows: a row seen twice is the same candidate)."""
  return jnp.minimum(block * (tiles * TILE) + tile * TILE, vocab - TILE)


def row_array(value):
  """A scalar as a [64] array of the WGMMA row layout (``scalar`` reads it back)."""
  return plgpu.layout_cast(jnp.full((2 * REQUESTS,), value, jnp.int32),
                           plgpu.Layout.WGMMA.reduce(1))


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
