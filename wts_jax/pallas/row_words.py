"""Inline PTX run one thread a row (Mosaic GPU only): its operands, and a table's
32-bit words gathered that way.

Mosaic's scalar loads are warpgroup-uniform: every thread loads the same address, one
row after another, so B rows cost B dependent-free but serially issued loads before
any of their values can be combined into a vector. Here thread ``t`` of the calling
warpgroup reads its row's index from shared memory and loads that row's word itself:
B loads issued at once, one latency for all of them.
"""

from __future__ import annotations


def thread_and_addresses(shared_refs=(), global_refs=()):
  """For inline PTX run one thread a row (inside ``plgpu.inline_mgpu``): this thread's
  index as i32, the shared refs' addresses as i32 and the global refs' as i64."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
  thread = mgpu_utils.thread_idx()
  if thread.type != i32:
    thread = arith.index_cast(i32, thread)
  return (thread, [llvm.ptrtoint(i32, mgpu_utils.memref_ptr(r)) for r in shared_refs],
          [llvm.ptrtoint(i64, mgpu_utils.memref_ptr(r)) for r in global_refs])


def load_row_words(index_s, table_g, out_s, rows: int):
  """``out_s[t] = table_g[index_s[t]]`` for each thread ``t < rows`` of warpgroup 0
  (``index_s`` [>= rows] int32 in shared memory, in range; ``table_g`` a 32-bit global
  table; ``out_s`` [>= rows] 32-bit in shared memory). The indices' stores must be
  visible (a warpgroup barrier before); the words' are visible to other threads after
  the next one."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from wts_jax.pallas import mosaic_gpu_helpers as gpu

  for ref, name in ((index_s, "index_s"), (table_g, "table_g"), (out_s, "out_s")):
    if ref.dtype.itemsize != 4:
      raise ValueError(f"load_row_words: {name} holds {ref.dtype} (32-bit words only)")

  @plgpu.inline_mgpu(arg_types=(gpu.read_ref(), gpu.read_ref(), plgpu.RefType()))
  def load(_, indices, table, out):
    thread, (indices_at, out_at), (table_at,) = thread_and_addresses((indices, out),
                                                                     (table,))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [indices_at, table_at, out_at, thread],
        "{ .reg .pred p; .reg .b32 row, word, sa; .reg .b64 off, g;\n"
        f"setp.lt.u32 p, $3, {rows};\n"
        "shl.b32 sa, $3, 2;\n"
        "add.u32 row, sa, $0;\n"
        "@p ld.shared.b32 row, [row];\n"
        "@p mul.wide.u32 off, row, 4;\n"
        "@p add.u64 g, $1, off;\n"
        "@p ld.global.b32 word, [g];\n"
        "add.u32 sa, sa, $2;\n"
        "@p st.shared.b32 [sa], word;\n}",
        "r,l,r,r", has_side_effects=True)
  load(index_s, table_g, out_s)
