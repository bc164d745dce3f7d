"""The draft-length policies TableTune is compared with, re-implemented from their public
descriptions as ``DraftPolicy`` objects (pure, jittable, array state).

Policies that stop inside the walk (SpecDec++, AdaEDL) read the current block's
confidence or entropy as the walk produces it; our loop chooses K before drafting, so
the harness gives them ``stop_in_walk`` and charges the iteration at the longest row's
stop: the walk and the verification end when the last row stops (generous to them: the
drafter's parallel forward is charged at that length too).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.specdecode.policy import searchsorted
from wts_jax.tabletune import acceptance as acc
from wts_jax.tabletune.cost_table import CostTable, interpolate_draft_len, interpolate_rows
from wts_jax.tabletune.table import best_draft_len


def _first_stop(stop_here: jnp.ndarray, k) -> jnp.ndarray:
  """Per row: 1 + the first position where ``stop_here`` holds (that token is still
  verified), or k when it never does within the first k positions."""
  positions = jnp.arange(stop_here.shape[-1])
  stop_here = stop_here & (positions < k)
  first = jnp.argmax(stop_here, axis=-1)
  return jnp.where(jnp.any(stop_here, axis=-1), first + 1, k).astype(jnp.int32)


class _Stateless:
  """A policy that learns nothing from the iterations it runs."""

  def init(self, batch):
    del batch
    return ()

  def observe(self, state, k, accepted, confidence, active, measured=None):
    del k, accepted, confidence, active, measured
    return state


@dataclasses.dataclass(frozen=True)
class StaticTablePolicy(_Stateless):
  """K*(B_active) looked up in a table built offline for one acceptance profile (K = 0
  included where the table measured it)."""

  draft_len_by_batch: tuple[int, ...]  # index: active rows (0..max batch)

  @classmethod
  def build(cls, table: CostTable, acceptance, max_batch: int) -> StaticTablePolicy:
    best = best_draft_len(table, acceptance, np.arange(1, max_batch + 1))
    return cls(tuple(int(k) for k in np.concatenate([best[:1], best])))

  @property
  def draft_lens(self) -> tuple[int, ...]:
    return tuple(sorted(set(self.draft_len_by_batch)))

  @property
  def max_draft_len(self) -> int:
    return max(self.draft_len_by_batch)

  def choose(self, state, active, new_request=None, rows=None):
    del new_request, rows
    k = jnp.asarray(self.draft_len_by_batch, jnp.int32)[jnp.sum(active)]
    return k, jnp.full(active.shape, k, jnp.int32), state


@dataclasses.dataclass(frozen=True)
class SGLangAdaptivePolicy:
  """SGLang-style adaptive speculation: an EMA of the accepted length picks the draft
  step count among pre-built tiers (one captured graph each): the smallest tier that
  covers the EMA plus one token of headroom. It always drafts (no tier of 0 steps)."""

  tiers: tuple[int, ...]
  ema_weight: float = 0.2

  @classmethod
  def for_draft_lens(cls, draft_lens, count: int = 4, **options) -> SGLangAdaptivePolicy:
    """Up to ``count`` tiers spread over the draft lengths >= 1 (the nearest labels to
    evenly spaced step counts)."""
    lens = np.asarray([k for k in draft_lens if k >= 1])
    targets = np.linspace(lens[0], lens[-1], count)
    tiers = sorted({int(lens[np.argmin(np.abs(lens - t))]) for t in targets})
    return cls(tuple(tiers), **options)

  @property
  def draft_lens(self) -> tuple[int, ...]:
    return self.tiers

  @property
  def max_draft_len(self) -> int:
    return max(self.tiers)

  def init(self, batch):
    del batch
    return jnp.float32(self.max_draft_len)  # optimistic start: the largest tier

  def choose(self, ema, active, new_request=None, rows=None):
    del new_request, rows
    tiers = jnp.asarray(self.tiers, jnp.int32)
    covering = tiers >= ema + 1.0
    k = jnp.where(jnp.any(covering), tiers[jnp.argmax(covering)], tiers[-1])
    return k, jnp.full(active.shape, k, jnp.int32), ema

  def observe(self, ema, k, accepted, confidence, active, measured=None):
    del k, confidence, measured
    mean = jnp.sum(jnp.where(active, accepted, 0)) / jnp.maximum(jnp.sum(active), 1)
    return (1.0 - self.ema_weight) * ema + self.ema_weight * mean


class VerifyBudgetState(NamedTuple):
  counts: acc.AcceptanceCounts       # [K] batch
  row_counts: acc.AcceptanceCounts   # [B, K] per request
  caps: jnp.ndarray                  # [B] int32: slots admitted per row last iteration


@dataclasses.dataclass(frozen=True)
class VLLMAdaptiveVerifyPolicy:
  """vLLM-style adaptive verification: every (request, position) slot is scored by its
  survival probability (the running product of the request's per-position acceptance
  estimates); slots are admitted best first up to the token budget that maximises
  expected tokens per second under the cost model profiled at startup, c(B, N / B) for
  N admitted slots. Our loop verifies B x (K + 1) positions, so the iteration drafts the
  shortest of the table's draft lengths that holds the longest admitted row, and caps
  the others. At least one slot a row is admitted: it always drafts."""

  batches: tuple[int, ...]
  draft_lens: tuple[int, ...]
  seconds: tuple[tuple[float, ...], ...]
  prior: float = 0.7
  prior_weight: float = 2.0
  decay: float = 0.97
  row_decay: float = 0.85
  row_prior_weight: float = 3.0

  @classmethod
  def from_table(cls, table: CostTable, **options) -> VLLMAdaptiveVerifyPolicy:
    return cls(tuple(table.batches), tuple(table.draft_lens), tuple(map(tuple, table.seconds)),
               **options)

  @property
  def max_draft_len(self) -> int:
    return self.draft_lens[-1]

  def init(self, batch):
    k = self.max_draft_len
    return VerifyBudgetState(acc.empty_counts((k,)), acc.empty_counts((batch, k)),
                             jnp.full((batch,), k, jnp.int32))

  def choose(self, state, active, new_request=None, rows=None):
    del rows
    if new_request is not None:  # per request: a new one starts from the batch estimate
      keep = jnp.where(new_request, 0.0, 1.0)[:, None]
      state = state._replace(row_counts=acc.AcceptanceCounts(
          keep * state.row_counts.survived, keep * state.row_counts.reached))
    max_k = self.max_draft_len
    batch_p = acc.conditional_acceptance(state.counts, self.prior, self.prior_weight)
    row_p = acc.conditional_acceptance(state.row_counts, batch_p[None], self.row_prior_weight)
    survival = jnp.where(active[:, None], jnp.cumprod(row_p, axis=-1), -1.0)
    order = jnp.sort(survival.reshape(-1))[::-1]
    admitted = jnp.arange(1, order.size + 1, dtype=jnp.float32)
    n_active = jnp.maximum(jnp.sum(active), 1).astype(jnp.float32)
    cost_row = interpolate_rows(jnp.asarray(self.batches, jnp.float32),
                                jnp.asarray(self.seconds, jnp.float32), n_active)
    # The profiled model read as a function of verified tokens: c(B, N / B), linear in K.
    per_row = jnp.clip(admitted / n_active, 0.0, max_k)
    cost = interpolate_draft_len(jnp.asarray(self.draft_lens, jnp.float32), cost_row, per_row)
    gain = (n_active + jnp.cumsum(jnp.maximum(order, 0.0))) / cost
    gain = jnp.where(order >= 0, gain, -jnp.inf)
    threshold = order[jnp.argmax(gain)]
    caps = jnp.sum(survival >= threshold, axis=-1).astype(jnp.int32)
    caps = jnp.where(active, jnp.maximum(caps, 1), 0)
    lens = jnp.asarray(self.draft_lens, jnp.int32)
    k = lens[jnp.clip(searchsorted(jnp, lens, jnp.max(caps)), 0, len(self.draft_lens) - 1)]
    return k, caps, state._replace(caps=caps)

  def observe(self, state, k, accepted, confidence, active, measured=None):
    del confidence, measured
    drafted = jnp.minimum(state.caps, k)
    counts = acc.update(state.counts, drafted, accepted, active, decay=self.decay)
    reached, survived = acc.block_outcomes(drafted, accepted, self.max_draft_len, active)
    row_decay = jnp.where(active, self.row_decay, 0.0)[:, None]
    row_counts = acc.AcceptanceCounts(row_decay * state.row_counts.survived + survived,
                                      row_decay * state.row_counts.reached + reached)
    return state._replace(counts=counts, row_counts=row_counts)


class _StopInWalk(_Stateless):
  """A stateless rule that drafts up to ``max_draft_len`` and stops rows in the walk."""

  max_draft_len: int

  @property
  def draft_lens(self) -> tuple[int, ...]:
    return tuple(range(1, self.max_draft_len + 1))

  def choose(self, state, active, new_request=None, rows=None):
    del new_request, rows
    k = jnp.int32(self.max_draft_len)
    return k, jnp.full(active.shape, k, jnp.int32), state


@dataclasses.dataclass(frozen=True)
class ConfidenceStopPolicy(_StopInWalk):
  """SpecDec++-style: keep drafting until the predicted probability that the token is
  rejected, 1 - sigma(z) from the confidence head, passes ``threshold``."""

  max_draft_len: int
  threshold: float = 0.7

  def stop_in_walk(self, state, k, confidence, entropy, active):
    del state, entropy, active
    return _first_stop(1.0 - jax.nn.sigmoid(confidence) > self.threshold, k)


@dataclasses.dataclass(frozen=True)
class EntropyStopPolicy(_StopInWalk):
  """AdaEDL-style: stop when the entropy-based lower bound on the token's acceptance,
  1 - sqrt(gamma * H), falls below ``threshold``."""

  max_draft_len: int
  threshold: float = 0.3
  gamma: float = 0.5

  def stop_in_walk(self, state, k, confidence, entropy, active):
    del state, confidence, active
    return _first_stop(1.0 - jnp.sqrt(self.gamma * entropy) < self.threshold, k)


for _policy in (StaticTablePolicy, SGLangAdaptivePolicy, VLLMAdaptiveVerifyPolicy,
                ConfidenceStopPolicy, EntropyStopPolicy):
  jax.tree_util.register_static(_policy)
