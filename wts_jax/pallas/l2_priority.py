"""L2 eviction priorities for the W2 chunks a walk streams every step.

A bf16 W2 at the Qwen3 shape (77.8 MB) is larger than the H200's L2 (60 MB), so the
chunks a block streams each step can push each other out of the L2 before the next step
reads them again. With ``BatchedPlan.l2_keep_chunks`` each streamed chunk is first named
to the L2 by a bulk prefetch carrying a cache policy — ``evict_last`` for the kept
chunks, ``evict_first`` for the rest — and then copied by the kernel's TMA copy as
before (Mosaic's copies take no cache hint). When its walk ends a warpgroup puts its kept
lines back to ``evict_normal``, so no other kernel finds the L2 holding them.

All are hints: they change no value the kernel reads, only where it comes from. Inline
PTX, compiled out in Pallas interpret mode.
"""

from __future__ import annotations

import math

LINE_BYTES = 128   # what applypriority acts on


def _warpgroup_thread():
  """This thread's index within its warpgroup (i32)."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  i32 = ir.IntegerType.get_signless(32)
  thread = mgpu_utils.thread_idx()
  if thread.type != i32:
    thread = arith.index_cast(i32, thread)
  return arith.remui(thread, mgpu_utils.c(mgpu_utils.WARPGROUP_SIZE, i32))


def _global_address(ref):
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  return llvm.ptrtoint(ir.IntegerType.get_signless(64), mgpu_utils.memref_ptr(ref))


def _ref_bytes(ref) -> int:
  from jax._src.lib.mlir import ir
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  memref = ir.MemRefType(ref.type)
  return math.prod(memref.shape) * mgpu_utils.bytewidth(memref.element_type)


def _bulk_bytes(size: int, what: str) -> int:
  """``size``, the bytes of one bulk prefetch, which moves whole 16 bytes."""
  if size % 16:
    raise ValueError(f"a bulk prefetch moves whole 16 bytes ({what} has {size})")
  return size


def prefetch_with_priority(chunk_g, *, keep: bool):
  """``cp.async.bulk.prefetch.L2`` of ``chunk_g`` (contiguous global memory, a multiple of
  16 bytes) under an ``evict_last`` (``keep``) or ``evict_first`` cache policy, issued by
  the warpgroup's first thread. Nothing waits for it."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  from jax.experimental.pallas import mosaic_gpu as plgpu
  priority = "evict_last" if keep else "evict_first"

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
  def prefetch(_, chunk):
    size = _bulk_bytes(_ref_bytes(chunk), "the chunk")
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [_global_address(chunk), _warpgroup_thread()],
        "{ .reg .pred p; .reg .b64 policy;\n"
        "setp.eq.u32 p, $1, 0;\n"
        f"createpolicy.fractional.L2::{priority}.b64 policy, 1.0;\n"
        f"@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$0], {size}, policy;\n}}",
        "l,r", has_side_effects=True)
  prefetch(chunk_g)


def restore_normal_priority(range_g):
  """``applypriority.global.L2::evict_normal`` on every 128-byte line that holds part of
  ``range_g`` (contiguous global memory), the warpgroup's threads a line each in turn."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
  def restore(_, lines_ref):
    # (The lines from the one holding the first byte: one more for a start off a line.)
    lines = -(-_ref_bytes(lines_ref) // LINE_BYTES) + 1
    body = "".join(
        f"setp.lt.u32 q, $1, {lines - first};\n"
        f"@q applypriority.global.L2::evict_normal [a+{first * LINE_BYTES}], {LINE_BYTES};\n"
        for first in range(0, lines, mgpu_utils.WARPGROUP_SIZE))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [_global_address(lines_ref), _warpgroup_thread()],
        "{ .reg .pred q; .reg .b64 a, off;\n"
        f"and.b64 a, $0, {-LINE_BYTES}; mul.wide.u32 off, $1, {LINE_BYTES};\n"
        "add.u64 a, a, off;\n" + body + "}",
        "l,r", has_side_effects=True)
  restore(range_g)
