"""Per-tile math shared by the persistent and the step-wise kernels (Pallas Triton).

Everything here works on values inside a kernel: one tile of W2 rows against the batch,
the add of the base logits, and a program's running top-1 / log-sum-exp. The selection
rules are the reference's: fp32 logits, ``score = logits * scale + noise``, ties to the
lowest vocabulary index, padding rows never selected.

Layout choices, for speed:
- the rank axis is cut into ``column chunks`` of at most 64 (``RankChunks``): every
  tile, weight block and r-vector is a list of chunks, so no operand is wider than 64
  columns (Triton has no slicing, and wide dot operands overflow shared memory at B=64);
- candidates are kept *per lane* ([BP, T], one running best per tile column) and reduced
  across lanes once per step, not once per tile: cross-thread reductions are the costly
  part of a tile;
- an fp32 vector meets bf16 weights on tensor cores as two bf16 parts (hi + lo: ~16
  mantissa bits), so a dot agrees with the fp32 reference to fp32 rounding; on CUDA
  cores (one batch row) it is multiplied in fp32 directly.

Indices into refs are always traced values (``zero + i``), never Python ints: the
interpreter used by the CPU suite discharges only traced indices.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as pl_triton

from wts_jax import sampling

NEG_INF = float("-inf")
INDEX_SENTINEL = 2 ** 30  # larger than any vocabulary index
MIN_DOT_ROWS = 16         # tensor-core dots need at least 16 rows


def chunk_width(rank: int) -> int:
  return min(64, rank)


@dataclasses.dataclass(frozen=True)
class Operand:
  """An r-vector chunk [BP, c] ready for products with bf16 weights: ``hi`` (bf16), and
  ``lo`` (bf16, the rounding residue) unless ``hi`` is exact; ``f32`` for CUDA cores."""

  f32: jax.Array
  hi: jax.Array
  lo: jax.Array | None


def make_operand(chunk: jax.Array, exact_in_bf16: bool) -> Operand:
  hi = chunk.astype(jnp.bfloat16)
  lo = None if exact_in_bf16 else (chunk - hi.astype(jnp.float32)).astype(jnp.bfloat16)
  return Operand(f32=chunk, hi=hi, lo=lo)


def _dot_rows(lhs: jax.Array, weight: jax.Array) -> jax.Array:
  """``lhs [BP, c] · weightᵀ`` on tensor cores; one row is padded to 16 (row 0 kept)."""
  rows = lhs.shape[0]
  if rows >= MIN_DOT_ROWS:
    return pl_triton.dot(lhs, weight, trans_b=True)
  out = pl_triton.dot(jnp.broadcast_to(lhs, (MIN_DOT_ROWS, lhs.shape[1])), weight,
                      trans_b=True)
  first_row = lax.broadcasted_iota(jnp.int32, out.shape, 0) == 0
  return jnp.sum(jnp.where(first_row, out, 0.0), axis=0, keepdims=True)


def product(operands: list[Operand], weight_chunks: list[jax.Array]) -> jax.Array:
  """``Σ_c operand_c · weight_cᵀ`` → [BP, n] fp32 (fp32 accumulation).

  ``weight_chunks[c]`` is [n, c_width] (bf16, or int8/fp8 converted to bf16 exactly).
  One batch row: CUDA cores in fp32. More rows: tensor cores, hi (+ lo) parts.
  """
  total = None
  for operand, weight in zip(operands, weight_chunks):
    if operand.f32.shape[0] == 1:
      part = jnp.sum(weight.astype(jnp.float32) * operand.f32, axis=1)[None, :]
    else:
      weight = weight.astype(jnp.bfloat16)
      part = pl_triton.dot(operand.hi, weight, trans_b=True)
      if operand.lo is not None:
        part = part + pl_triton.dot(operand.lo, weight, trans_b=True)
    total = part if total is None else total + part
  return total


def small_product(operands: list[Operand], weight_chunks: list[jax.Array]) -> jax.Array:
  """Like ``product`` but always on tensor cores (the serial matvecs of the gated and
  recurrent heads: [n, c] weight blocks, too wide for a broadcast product in registers)."""
  total = None
  for operand, weight in zip(operands, weight_chunks):
    weight = weight.astype(jnp.bfloat16)
    part = _dot_rows(operand.hi, weight)
    if operand.lo is not None:
      part = part + _dot_rows(operand.lo, weight)
    total = part if total is None else total + part
  return total


def slice_product(vectors: list[jax.Array], weight_chunks: list[jax.Array]) -> jax.Array:
  """``Σ_c vector_c · weight_cᵀ`` for a narrow weight slice on CUDA cores in fp32:
  vectors [BP, c] fp32, weights [w, c] (bf16, exact in fp32) → [BP, w] fp32 (one fp32
  product per term, fp32 accumulation: the reference's arithmetic, no hi/lo split).
  The chunks are summed elementwise first, so the step pays one cross-thread reduction."""
  total = None
  for vector, weight in zip(vectors, weight_chunks):
    part = vector[:, None, :] * weight.astype(jnp.float32)[None, :, :]
    total = part if total is None else total + part
  return jnp.sum(total, axis=2)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Candidates:
  """A program's running selection state for one step: per lane ([BP, T]) while the
  shard is scanned, per row ([BP]) after ``reduce_lanes``."""

  best_score: jax.Array     # max of score seen in this lane
  best_index: jax.Array     # its vocabulary index (lowest on ties; SENTINEL if none)
  chosen_scaled: jax.Array  # logits * scale at best_index (for the log-probability)
  lse_max: jax.Array        # online log-sum-exp of logits * scale: max ...
  lse_sum: jax.Array        # ... and sum of exp(x - max)
  nan_seen: jax.Array       # int32 flag

  @classmethod
  def empty(cls, shape) -> "Candidates":
    neg = jnp.full(shape, NEG_INF, jnp.float32)
    return cls(best_score=neg, best_index=jnp.full(shape, INDEX_SENTINEL, jnp.int32),
               chosen_scaled=neg, lse_max=neg, lse_sum=jnp.zeros(shape, jnp.float32),
               nan_seen=jnp.zeros(shape, jnp.int32))


@dataclasses.dataclass(frozen=True)
class Selection:
  """How a step scores its logits: greedy, or Gumbel-max with the shared generator."""

  greedy: bool
  track_lse: bool
  score_scale: jax.Array | None = None   # [BP] fp32
  noise_on: jax.Array | None = None      # [BP] bool
  streams: jax.Array | None = None       # [BP] uint32 stream words of this step


def _safe_max(value):
  return jnp.where(value == NEG_INF, 0.0, value)


def update_lanes(cand: Candidates, logits: jax.Array, rows: jax.Array,
                 row_valid: jax.Array, batch_valid: jax.Array,
                 selection: Selection) -> Candidates:
  """Fold one tile's logits [BP, T] (vocabulary ids ``rows`` [T]) into the lanes:
  elementwise only, no cross-thread work."""
  valid = row_valid[None, :]
  nan = jnp.isnan(logits) & valid & batch_valid[:, None]
  if selection.greedy:
    scaled = logits
    score = logits
  else:
    scaled = logits * selection.score_scale[:, None]
    noise = sampling.gumbel_from_uniform(
        sampling.uniform_from_stream(selection.streams[:, None], rows[None, :]))
    score = scaled + jnp.where(selection.noise_on[:, None], noise, 0.0)
  score = jnp.where(valid, score, NEG_INF)
  # Strict ">": tiles arrive in increasing vocabulary order, so a tie keeps the lower id.
  better = score > cand.best_score
  lse_max, lse_sum = cand.lse_max, cand.lse_sum
  if selection.track_lse:
    masked = jnp.where(valid, scaled, NEG_INF)
    new_max = jnp.maximum(lse_max, masked)
    safe = _safe_max(new_max)
    lse_sum = lse_sum * jnp.exp(lse_max - safe) + jnp.exp(masked - safe)
    lse_max = new_max
  return Candidates(
      best_score=jnp.where(better, score, cand.best_score),
      best_index=jnp.where(better, jnp.broadcast_to(rows[None, :], score.shape),
                           cand.best_index),
      chosen_scaled=jnp.where(better, scaled, cand.chosen_scaled),
      lse_max=lse_max, lse_sum=lse_sum, nan_seen=cand.nan_seen | nan.astype(jnp.int32))


def reduce_lanes(cand: Candidates, axis: int, valid=None):
  """Reduce candidates along ``axis`` (lanes of one program, or programs): the max
  score, the lowest index reaching it, its scaled logit, the combined log-sum-exp."""
  best, index = cand.best_score, cand.best_index
  if valid is not None:
    best = jnp.where(valid, best, NEG_INF)
    index = jnp.where(valid, index, INDEX_SENTINEL)
  top = jnp.max(best, axis=axis)
  top_b = jnp.expand_dims(top, axis)
  at_top = best == top_b
  token = jnp.min(jnp.where(at_top, index, INDEX_SENTINEL), axis=axis)
  winner = at_top & (index == jnp.expand_dims(token, axis))
  chosen = jnp.max(jnp.where(winner, cand.chosen_scaled, NEG_INF), axis=axis)
  lse_max = cand.lse_max if valid is None else jnp.where(valid, cand.lse_max, NEG_INF)
  total_max = jnp.max(lse_max, axis=axis)
  safe = _safe_max(total_max)
  lse_sum = cand.lse_sum if valid is None else jnp.where(valid, cand.lse_sum, 0.0)
  total = jnp.sum(lse_sum * jnp.exp(lse_max - jnp.expand_dims(safe, axis)), axis=axis)
  return Candidates(best_score=top, best_index=token, chosen_scaled=chosen,
                    lse_max=total_max, lse_sum=total,
                    nan_seen=jnp.max(cand.nan_seen, axis=axis))


def chosen_token(reduced: Candidates, vocab_size: int):
  """(token, chosen_scaled, lse) from fully reduced candidates. A row with no finite
  score (all -inf) takes index 0, as argmax does; NaN is reported by the status. Any
  index outside [0, V) — the sentinel, or a slot a peer never wrote after a barrier
  timeout (uninitialised memory, possibly negative) — becomes 0 too: the token indexes
  W1 next, and a negative row was an illegal address on the H200 (starved-barrier
  test)."""
  in_range = (reduced.best_index >= 0) & (reduced.best_index < vocab_size)
  token = jnp.where(in_range, reduced.best_index, 0)
  lse = reduced.lse_max + jnp.log(reduced.lse_sum)
  return token, reduced.chosen_scaled, lse
