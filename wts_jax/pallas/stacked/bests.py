"""The stacked kernel's step end: each request's best over its four lanes to shared
memory, the block's best per request into the grid's keys, the winning tokens back; and
the walk's first tokens."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.stacked.threads import (REQUESTS, const, request_warp, row_array, scalar,
                                            thread_ids)


def store_bests(best, value_s, index_s, nan_s, *, wg, interpret: bool,
                rotate: bool = False):
  """This warpgroup's best per request into row ``wg`` of ``value_s`` / ``index_s`` /
  ``nan_s`` ([4, 32] in shared memory): GPU, the four lanes of a request reduced by
  shuffles (ties to the lower row) and stored by lane t = 0 (``rotate``: the warps'
  requests as ``request_warp`` has them)."""
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
    _, wg_, warp, g, _ = thread_ids()
    slot_warp = request_warp(warp, wg_, rotate)
    slot = arith.addi(arith.muli(wg_, const(REQUESTS)),
                      arith.addi(arith.muli(slot_warp, const(8)), g))
    slot_at = arith.muli(slot, const(4))
    value, index, nan = (scalar(b) for b in best)
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
                                      scalar(step_rows)],
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

  @plgpu.inline_mgpu(arg_types=(gpu.read_ref(), plgpu.RefType(), plgpu.RefType()))
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
