"""Per-tile math shared by the persistent and the step-wise kernels (Pallas Triton).

Everything here works on values inside a kernel: one tile of W2 rows against the batch,
the add of the base logits, and the running top-1 / log-sum-exp of one program. The
selection rules are the reference's: fp32 logits, ``score = logits * scale + noise``,
ties to the lowest vocabulary index, padding rows never selected.

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


def gemv(z_operand: jax.Array, w_tile: jax.Array) -> jax.Array:
  """``z [BP, r] · w_tileᵀ [r, T]`` → [BP, T] fp32 (fp32 accumulation).

  One batch row runs on CUDA cores (a broadcast multiply and a row sum); more rows run a
  tensor-core dot (``BP >= 16``). Quantized tiles are converted to the operand dtype,
  which holds their values exactly.
  """
  if z_operand.shape[0] == 1:
    products = w_tile.astype(jnp.float32) * z_operand.astype(jnp.float32)
    return jnp.sum(products, axis=1)[None, :]
  return pl_triton.dot(z_operand, w_tile.astype(z_operand.dtype), trans_b=True)


def matvec_rows(vectors: jax.Array, weight_block: jax.Array) -> jax.Array:
  """``vectors [BP, r] · weight_blockᵀ [r, n]`` → [BP, n] fp32, bf16 operands, for the
  small serial matvecs of the gated and recurrent heads. Always a tensor-core dot: one
  batch row is broadcast to the dot's minimum of 16 rows and row 0 is kept."""
  operand = vectors.astype(jnp.bfloat16)
  weight_block = weight_block.astype(jnp.bfloat16)
  if vectors.shape[0] > 1:
    return pl_triton.dot(operand, weight_block, trans_b=True)
  out = pl_triton.dot(jnp.broadcast_to(operand, (16, operand.shape[1])), weight_block,
               trans_b=True)
  first_row = lax.broadcasted_iota(jnp.int32, out.shape, 0) == 0
  return jnp.sum(jnp.where(first_row, out, 0.0), axis=0, keepdims=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Candidates:
  """A program's running selection state for one step, per batch row ([BP] each)."""

  best_score: jax.Array    # max of score over the rows seen so far
  best_index: jax.Array    # its vocabulary index (lowest on ties)
  chosen_scaled: jax.Array  # logits * scale at best_index (for the log-probability)
  lse_max: jax.Array       # running log-sum-exp of logits * scale: max ...
  lse_sum: jax.Array       # ... and sum of exp(x - max)
  nan_seen: jax.Array      # int32 flag

  @classmethod
  def empty(cls, batch_rows: int) -> "Candidates":
    neg = jnp.full((batch_rows,), NEG_INF, jnp.float32)
    return cls(best_score=neg, best_index=jnp.zeros((batch_rows,), jnp.int32),
               chosen_scaled=neg, lse_max=neg,
               lse_sum=jnp.zeros((batch_rows,), jnp.float32),
               nan_seen=jnp.zeros((batch_rows,), jnp.int32))


@dataclasses.dataclass(frozen=True)
class Selection:
  """How a step scores its logits: greedy, or Gumbel-max with the shared generator."""

  greedy: bool
  track_lse: bool
  score_scale: jax.Array | None = None   # [BP] fp32
  noise_on: jax.Array | None = None      # [BP] bool
  streams: jax.Array | None = None       # [BP] uint32 stream words of this step


def update_candidates(cand: Candidates, logits: jax.Array, rows: jax.Array,
                      row_valid: jax.Array, batch_valid: jax.Array,
                      selection: Selection) -> Candidates:
  """Fold one tile's logits [BP, T] (vocabulary ids ``rows`` [T]) into ``cand``."""
  valid = row_valid[None, :]
  nan = jnp.isnan(logits) & valid & batch_valid[:, None]
  nan_seen = cand.nan_seen | jnp.max(nan.astype(jnp.int32), axis=1)
  if selection.greedy:
    scaled = logits
    score = logits
  else:
    scaled = logits * selection.score_scale[:, None]
    noise = sampling.gumbel_from_uniform(
        sampling.uniform_from_stream(selection.streams[:, None], rows[None, :]))
    score = scaled + jnp.where(selection.noise_on[:, None], noise, 0.0)
  score = jnp.where(valid, score, NEG_INF)
  tile_best = jnp.max(score, axis=1)
  column = lax.broadcasted_iota(jnp.int32, score.shape, 1)
  tile_arg = jnp.min(jnp.where(score == tile_best[:, None], column, INDEX_SENTINEL), axis=1)
  tile_chosen = jnp.sum(jnp.where(column == tile_arg[:, None], scaled, 0.0), axis=1)
  tile_index = jnp.min(jnp.where(column == tile_arg[:, None], rows[None, :],
                                 INDEX_SENTINEL), axis=1)
  # Strict ">": an earlier tile (lower vocabulary ids) keeps a tie.
  better = tile_best > cand.best_score
  lse_max, lse_sum = cand.lse_max, cand.lse_sum
  if selection.track_lse:
    masked = jnp.where(valid, scaled, NEG_INF)
    new_max = jnp.maximum(lse_max, jnp.max(masked, axis=1))
    safe_max = jnp.where(new_max == NEG_INF, 0.0, new_max)
    lse_sum = lse_sum * jnp.exp(lse_max - safe_max) + jnp.sum(
        jnp.exp(masked - safe_max[:, None]), axis=1)
    lse_max = new_max
  return Candidates(
      best_score=jnp.where(better, tile_best, cand.best_score),
      best_index=jnp.where(better, tile_index, cand.best_index),
      chosen_scaled=jnp.where(better, tile_chosen, cand.chosen_scaled),
      lse_max=lse_max, lse_sum=lse_sum, nan_seen=nan_seen)


def reduce_candidates(best_score, best_index, chosen_scaled, lse_max, lse_sum,
                      program_valid, vocab_size: int):
  """Reduce [G, BP] candidates of all programs → (token, chosen_scaled, lse) per row.

  Every program runs this on the same data with the same arithmetic, so all agree.
  """
  valid = program_valid[:, None]
  best_score = jnp.where(valid, best_score, NEG_INF)
  top = jnp.max(best_score, axis=0)
  token = jnp.min(jnp.where(valid & (best_score == top[None, :]), best_index,
                            INDEX_SENTINEL), axis=0)
  winner = valid & (best_index == token[None, :]) & (best_score == top[None, :])
  chosen = jnp.max(jnp.where(winner, chosen_scaled, NEG_INF), axis=0)
  lse_max = jnp.where(valid, lse_max, NEG_INF)
  total_max = jnp.max(lse_max, axis=0)
  safe_max = jnp.where(total_max == NEG_INF, 0.0, total_max)
  total = jnp.sum(jnp.where(valid, lse_sum * jnp.exp(lse_max - safe_max[None, :]), 0.0),
                  axis=0)
  lse = safe_max + jnp.log(total)
  # A NaN everywhere leaves no maximum: keep the token in range (status reports it).
  token = jnp.where(token < vocab_size, token, 0)
  return token, chosen, lse
