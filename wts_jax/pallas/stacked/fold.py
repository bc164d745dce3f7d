"""A tile folded into each request's running best (the planes' product joined, scaled,
the base logits added, greedy or with each request's Gumbel noise), and a sampled walk's
per-request state."""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import sampling
from wts_jax.int8_state import LO_STEPS
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.stacked.threads import (BIG_INDEX, CARRY, REQUESTS, TILE, const, i32,
                                            per_thread, register_element, row_array, scalar,
                                            thread_ids, thread_request)
from wts_jax.pallas.stacked.operands import (TMA_BASE_TRANSFORMS, base_slot_chunk,
                                             base_slot_word, tma_base_chunk, tma_base_word)


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

  @plgpu.inline_mgpu(arg_types=(gpu.read_ref(),) * 3 + (plgpu.Layout.WGMMA.reduce(1),),
                     return_type=types)
  def load(_, scales, noise, seed, step_rows):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, llvm
    from wts_jax.pallas.row_words import thread_and_addresses
    _, _, (scales_at, noise_at, seed_at) = thread_and_addresses((), (scales, noise, seed))
    request, _ = thread_request(phases, rotate)
    live = arith.extui(i32(), arith.cmpi(arith.CmpIPredicate.slt, request, const(rows)))
    i64 = ir.IntegerType.get_signless(64)
    offset = arith.extui(i64, arith.muli(request, const(4)))

    def word(base, type_, default, asm_type, live_=live, at=offset):
      return llvm.inline_asm(
          type_, [arith.addi(base, at), live_],
          "{ .reg .pred p; setp.ne.u32 p, $2, 0; mov.b32 $0, " + default + ";\n"
          f"@p ld.global.nc.{asm_type} $0, [$1]; }}", "=" + ("f" if asm_type == "f32"
                                                            else "r") + ",l,r",
          has_side_effects=False)
    f32 = ir.F32Type.get()
    scale = word(scales_at, f32, "0f3F800000", "f32")
    noise_on = word(noise_at, i32(), "0", "b32")
    seeds = [word(seed_at, i32(), "0", "b32", const(1), arith.constant(i64, 4 * k))
             for k in range(2)]
    counter = arith.ori(arith.shli(arith.addi(request, const(row_offset)), const(16)),
                        scalar(step_rows))
    stream = _mix32(arith.addi(_mix32(arith.xori(counter, seeds[0])), seeds[1]))
    return (per_thread(scale, jnp.float32), per_thread(noise_on, jnp.int32),
            per_thread(stream, jnp.int32))

  return load(scale_g, noise_g, seed_g, row_array(step))


def _mix32(x):
  """``sampling.mix32`` on an i32 value (wrapping, logical shifts)."""
  from jax._src.lib.mlir.dialects import arith
  for shift, multiplier in ((16, sampling.MIX_MUL_1), (15, sampling.MIX_MUL_2)):
    x = arith.muli(arith.xori(x, arith.shrui(x, const(shift))), const(multiplier))
  return arith.xori(x, arith.shrui(x, const(15)))


def _log_positive(x):
  """``sampling.log_positive`` on an f32 value, the same operations in the same order."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith
  f32 = ir.F32Type.get()

  def real(value):
    return arith.constant(f32, value)
  bits = arith.addi(arith.bitcast(i32(), x),
                    const(sampling.ONE_BITS - sampling.SQRT_HALF_BITS))
  k = arith.subi(arith.shrui(bits, const(23)), const(0x7F))
  mantissa = arith.addi(arith.andi(bits, const(0x007FFFFF)), const(sampling.SQRT_HALF_BITS))
  f = arith.subf(arith.bitcast(f32, mantissa), real(1.0))
  coefficients = sampling.LOG1P_CUBIC_COEFFICIENTS
  p = real(coefficients[-1])
  for coefficient in reversed(coefficients[:-1]):
    p = arith.addf(arith.mulf(p, f), real(coefficient))
  f_squared = arith.mulf(f, f)
  rest = arith.subf(arith.mulf(arith.mulf(f_squared, f), p),
                    arith.mulf(real(0.5), f_squared))
  dk = arith.sitofp(f32, k)
  return arith.addf(arith.mulf(dk, real(sampling.LN2_HI)),
                    arith.addf(f, arith.addf(rest, arith.mulf(dk, real(sampling.LN2_LO)))))


def _gumbel(vocab_index, stream):
  """``gumbel_from_uniform(uniform_from_stream(stream, vocab_index))`` on i32 values."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith
  f32 = ir.F32Type.get()
  bits = _mix32(arith.addi(_mix32(arith.xori(vocab_index, stream)), stream))
  mantissa = arith.sitofp(f32, arith.shrui(bits, const(9)))
  u = arith.mulf(arith.addf(mantissa, arith.constant(f32, 0.5)),
                 arith.constant(f32, 1.0 / (1 << 23)))
  return arith.negf(_log_positive(arith.negf(_log_positive(u))))


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
  ``request_warp`` has them. ``live_rows`` (GPU): a warp whose requests are all at or
  past it (the batch; ``phases`` as ``thread_request``'s) folds nothing, its best kept.
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
                 gpu.read_ref(), (plgpu.Layout.WGMMA,) * 3, plgpu.Layout.WGMMA.reduce(1))
      + extra_types,
      return_type=(carry, carry_i, carry))
  def fold(_, acc, base, s_lo, scales, best, start_rows, *rest):
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, scf
    value, index, top = (scalar(b) for b in best)
    if live_rows is None:
      folded = fold_values(acc, base, s_lo, scales, start_rows, rest, value, index, top)
    else:   # (warp-uniform: a warp's 8 requests, from its first)
      request, (_, g, _) = thread_request(phases, rotate)
      warp_first = arith.subi(request, g)
      live = arith.cmpi(arith.CmpIPredicate.slt, warp_first, const(live_rows))
      branch = scf.IfOp(live, [value.type, index.type, top.type], has_else=True)
      with ir.InsertionPoint(branch.then_block):
        scf.YieldOp(list(fold_values(acc, base, s_lo, scales, start_rows, rest, value,
                                     index, top)))
      with ir.InsertionPoint(branch.else_block):
        scf.YieldOp([value, index, top])
      folded = branch.results
    value, index, top = folded
    return (per_thread(value, jnp.float32), per_thread(index, jnp.int32),
            per_thread(top, jnp.float32))

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
          word_at = tma_base_chunk(rest[0], scalar(base), slots, rotate)
          reads = ("{ .reg .b32 a;\n"
                   f"xor.b32 a, ${count}, 16;\n"
                   f"ld.shared.v4.b32 {{$0, $1, $2, $3}}, [${count}];\n"
                   "ld.shared.v4.b32 {$4, $5, $6, $7}, [a]; }")
        else:
          word_at = base_slot_chunk(rest[0], scalar(base), slots)
          reads = (f"cp.async.wait_group {copies_pending};\n"
                   f"ld.shared.v4.b32 {{$0, $1, $2, $3}}, [${count}];\n"
                   f"ld.shared.v4.b32 {{$4, $5, $6, $7}}, [${count}+2048];")
      elif thread_rows:   # (pair k: chunk k // 4, word k % 4)
        word_at = base_slot_chunk(rest[0], scalar(base), slots)
        reads = f"cp.async.wait_group {copies_pending};\n" + "".join(
            f"ld.shared.b32 ${k - first_pair}, [${count}+{2048 * (k // 4) + 4 * (k % 4)}];\n"
            for k in read)
      elif tma_slots:   # (word k at word 0's address XOR 16 k: the swizzle)
        word_at = tma_base_word(rest[0], scalar(base), slots, rotate)
        reads = "{ .reg .b32 a;\n" + "".join(
            f"xor.b32 a, ${count}, {16 * k}; ld.shared.b32 ${k - first_pair}, [a];\n"
            for k in read) + "}"
      else:
        word_at = base_slot_word(rest[0], scalar(base), slots)
        reads = f"cp.async.wait_group {copies_pending};\n" + "".join(
            f"ld.shared.b32 ${k - first_pair}, [${count}+{128 * 4 * k}];\n"
            for k in read)
      words_type = ir.Type.parse("!llvm.struct<(" + ", ".join(["i32"] * count) + ")>")
      words = llvm.inline_asm(words_type, [word_at], reads,
                              ",".join(["=r"] * count) + ",r", has_side_effects=True)
      bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
      base_words = {k: llvm.bitcast(bf16x2, llvm.extractvalue(i32(), words, [k - first_pair]))
                    for k in read}
    else:
      base_words = {j: base.registers[0, j, 0, 0, 0, 0, 0, 0, 0] for j in read}
    f32x2 = ir.VectorType.get((2,), f32)
    index_type = ir.IndexType.get()
    _, _, _, _, t = thread_ids()
    scale_lo = vector.broadcast(f32x2, scalar(s_lo))
    lo_steps = vector.broadcast(ir.VectorType.get((2,), i32()), const(LO_STEPS))
    # (the thread's first column's row in the tile, and its pairs' step)
    pair = arith.muli(t, const(16 if thread_rows else 2))
    pair_step = 2 if thread_rows else 8
    first = arith.addi(scalar(start_rows), pair)
    # A thread meets its request's rows in ascending order through the step (tiles in
    # ascending order, columns ascending in each; a clamped last tile only repeats rows
    # with their own index), so a strictly greater score is the only way to win.
    if sampling_state:
      score_scale, noise_on, stream = (scalar(v) for v in sampling_state[0])
      noise_on = arith.cmpi(arith.CmpIPredicate.ne, noise_on, const(0))
    column_won = const(-1)
    for j in folded:
      hi = acc.registers[0, j - first_pair, 0, 0, 0, 0, 0, 0, 0]
      lo = acc.registers[0, j - first_pair, 0, 0, 1, 0, 0, 0, 0]
      d = arith.addi(arith.muli(hi, lo_steps), lo)
      logits = arith.mulf(arith.sitofp(f32x2, d), scale_lo)
      column = arith.index_cast(index_type, arith.addi(pair, const(pair_step * j)))
      logits = arith.mulf(logits, vector.load(f32x2, scales, [column]))
      logits = arith.addf(logits, arith.extf(f32x2, base_words[j]))
      for e in range(2):
        logit = register_element(logits, e)
        if sampling_state:
          noise = _gumbel(arith.addi(first, const(pair_step * j + e)), stream)
          logit = arith.addf(arith.mulf(logit, score_scale),
                             arith.select(noise_on, noise, arith.constant(f32, 0.0)))
        better = arith.cmpf(arith.CmpFPredicate.OGT, logit, value)
        column_won = arith.select(better, const(pair_step * j + e), column_won)
        value = arith.maximumf(value, logit)   # (NaN-propagating)
    won = arith.cmpi(arith.CmpIPredicate.sge, column_won, const(0))
    index = arith.select(won, arith.addi(first, column_won), index)
    return value, index, value

  return fold(acc, base, s_lo, scales_s, best, starts, *extra)
