"""Per-position draft acceptance, estimated online from accepted lengths.

Position j (0-based) of a block is *reached* when every drafted position before it was
accepted; it *survives* when it is accepted too. A row that drafted n positions and had
a accepted reached positions 0..min(a, n-1) and survived 0..a-1. A fully accepted block
(a == n) is censored: it says nothing about positions >= n, so they are not counted as
reached. The conditional acceptance of position j is survived[j] / reached[j], shrunk
towards a prior with a few pseudo-counts, and the expected tokens of one iteration with
K drafted positions is 1 + sum_{j<K} prod_{i<=j} p_i (the bonus token plus the expected
accepted prefix).

Counts decay by a factor each update (exponential forgetting), so the estimate follows
shifting traffic.

Everything is pure jax.numpy on arrays of static shape (usable inside lax.while_loop);
the same functions take numpy arrays for offline use.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.special
import numpy as np


class AcceptanceCounts(NamedTuple):
  """Decayed censored counts; the last axis is the draft position (0-based)."""

  survived: jnp.ndarray  # [..., K] f32
  reached: jnp.ndarray   # [..., K] f32


def empty_counts(shape: tuple[int, ...]) -> AcceptanceCounts:
  zeros = jnp.zeros(shape, jnp.float32)
  return AcceptanceCounts(zeros, zeros)


def block_outcomes(drafted: jnp.ndarray, accepted: jnp.ndarray, max_draft_len: int,
                   active: jnp.ndarray | None = None) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Per row and position: (reached, survived) as f32 [B, max_draft_len].

  drafted: [B] (or scalar) positions each row could accept this iteration (k, or the
  row's cap); accepted: [B] draft tokens accepted. Positions >= drafted are censored.
  """
  position = jnp.arange(max_draft_len, dtype=jnp.int32)
  accepted = jnp.asarray(accepted, jnp.int32)[:, None]
  drafted = jnp.broadcast_to(jnp.asarray(drafted, jnp.int32), accepted.shape[:1])[:, None]
  reached = (position < drafted) & (position <= accepted)
  survived = position < jnp.minimum(accepted, drafted)
  if active is not None:
    reached &= active[:, None]
    survived &= active[:, None]
  return reached.astype(jnp.float32), survived.astype(jnp.float32)


def update(counts: AcceptanceCounts, drafted, accepted, active=None, *,
           decay: float | jnp.ndarray = 1.0) -> AcceptanceCounts:
  """Counts after one iteration: old counts times ``decay`` plus this block's rows."""
  reached, survived = block_outcomes(drafted, accepted, counts.reached.shape[-1], active)
  return AcceptanceCounts(decay * counts.survived + survived.sum(0),
                          decay * counts.reached + reached.sum(0))


def conditional_acceptance(counts: AcceptanceCounts, prior, prior_weight) -> jnp.ndarray:
  """P(position j accepted | positions < j accepted), shrunk to ``prior``.

  prior: [..., K] (or scalar) acceptance used where there is little evidence;
  prior_weight: its pseudo-count (> 0 keeps the estimate defined at unseen positions).
  """
  return ((counts.survived + prior_weight * prior)
          / (counts.reached + prior_weight))


def shifted_prior(counts: AcceptanceCounts, prior, prior_weight) -> jnp.ndarray:
  """The prior profile moved, on the logit scale, by the evidence's mean offset from it.

  Positions beyond the drafted length are never observed (censoring); left at a stale
  prior they would keep a pessimistic estimate from ever drafting far enough to be
  corrected. The prior keeps its shape across positions and takes its level from the
  positions that were observed: the mean, weighted by reached counts, of each position's
  estimate (shrunk to the prior, so that one block moves the level by one block's worth)
  against the prior, on the logit scale.
  """
  prior = jnp.clip(jnp.asarray(prior, jnp.float32), 0.02, 0.98)
  estimate = jnp.clip(conditional_acceptance(counts, prior, prior_weight), 0.02, 0.98)
  offset = (jnp.sum(counts.reached * (jax.scipy.special.logit(estimate)
                                      - jax.scipy.special.logit(prior)),
                    axis=-1, keepdims=True)
            / jnp.maximum(jnp.sum(counts.reached, axis=-1, keepdims=True), 1e-6))
  return jax.nn.sigmoid(jax.scipy.special.logit(prior) + offset)


def expected_tokens(acceptance: jnp.ndarray) -> jnp.ndarray:
  """E[accepted + 1 | K] for K = 0..max: [..., max + 1] from per-position acceptance."""
  xp = jnp if isinstance(acceptance, jax.Array) else np
  survival = xp.cumprod(acceptance, axis=-1)
  zero = xp.zeros(survival.shape[:-1] + (1,), survival.dtype)
  return 1.0 + xp.concatenate([zero, xp.cumsum(survival, axis=-1)], axis=-1)


def accepted_variance(acceptance: jnp.ndarray, draft_len) -> jnp.ndarray:
  """Var[accepted | K = draft_len] of one row under per-position ``acceptance`` [K_max]:
  accepted = sum_j 1[a > j], so E[a^2] = sum_{j<K} (2j + 1) S_j with S_j the survival."""
  position = jnp.arange(acceptance.shape[-1])
  survival = jnp.where(position < draft_len, jnp.cumprod(acceptance, axis=-1), 0.0)
  mean = jnp.sum(survival, axis=-1)
  return jnp.sum((2.0 * position + 1.0) * survival, axis=-1) - mean ** 2


def fit_profile(accepted, drafted, max_draft_len: int, prior: float = 0.5,
                prior_weight: float = 1.0) -> np.ndarray:
  """Offline: the per-position acceptance [K] of a recorded set of blocks."""
  accepted = jnp.asarray(accepted, jnp.int32).reshape(-1)
  counts = update(empty_counts((max_draft_len,)), drafted, accepted)
  return np.asarray(conditional_acceptance(counts, prior, prior_weight))
