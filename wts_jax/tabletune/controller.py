"""TableTune's live controller: a ``DraftPolicy`` that re-derives K every iteration.

Each iteration it estimates the per-position acceptance of the traffic from the accepted
lengths it has seen (censored, exponentially forgotten; positions it has not drafted
lately take the prior's shape at the observed positions' level; per row, shrunk towards
the batch's estimate; optionally sharpened by the confidence head), turns it into the
expected tokens of every K, divides by the profiled cost c(B_active, K) (static arrays)
and drafts the K with the highest expected tokens per second, switching only when the
gain passes a hysteresis margin. A two-sided Page-Hinkley test on the accepted length
(observed minus predicted) detects a shift in the traffic and then drops most of the old
evidence, so the estimate re-converges in a few iterations instead of a forgetting
window.

All methods are pure jax.numpy on a state of static-shape arrays, so the policy runs
inside the jitted decode loop (``lax.while_loop``) and never recompiles.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.tabletune import acceptance as acc
from wts_jax.tabletune.cost_table import CostTable, interpolate_rows


class ControllerState(NamedTuple):
  counts: acc.AcceptanceCounts       # [K]: the batch's censored counts
  row_counts: acc.AcceptanceCounts   # [B, K]: each row's (its request's) counts
  calibration: acc.AcceptanceCounts  # [K, bins]: acceptance per confidence bin
  draft_len: jnp.ndarray             # int32: the K in use
  drift_up: jnp.ndarray              # f32: Page-Hinkley sums (standard errors)
  drift_down: jnp.ndarray
  residual_var: jnp.ndarray          # f32: EMA of the squared residual (tokens^2)
  drifts: jnp.ndarray                # int32: shifts detected so far


@dataclasses.dataclass(frozen=True)
class TableTuneController:
  """Chooses K per iteration from a cost table and the live acceptance estimate.

  batches/seconds: the profiled cost table (``from_table`` fills them);
  prior_acceptance: the per-position acceptance assumed before any evidence (e.g. the
  profile the static table was built for), worth ``prior_weight`` blocks;
  decay/row_decay: per-iteration forgetting of the batch's and each row's counts;
  row_prior_weight: how many blocks of the batch estimate a row's estimate starts from;
  confidence_bins: > 0 calibrates the confidence head per (position, bin) and adds, for
  the drafted positions a row never reached (after its first rejection), the calibrated
  acceptance of its confidence as ``confidence_weight`` of a block of soft evidence;
  hysteresis: the relative throughput gain needed to switch K;
  drift_delta/drift_threshold: Page-Hinkley tolerance and alarm level, in standard
  errors of the iteration's mean accepted length (an EMA of the squared residual,
  weight ``residual_weight``, scales it: rows and blocks vary more than the
  per-position model says); drift_keep: the share of the counts kept when a shift is detected;
  row_stop_survival: > 0 caps each row at the first position whose predicted survival
  falls below it (only useful where verifying fewer tokens costs less);
  min_draft_len: the smallest K it may choose (the loop drafts at least 1);
  cost_at_active_batch: price an iteration at the number of active rows (an engine that
  batches only live requests) or, when False, at the full batch (a static-shape loop such
  as ``wts_jax.spec.generate``, where finished rows still take their slot).
  """

  batches: tuple[int, ...]
  seconds: tuple[tuple[float, ...], ...]
  prior_acceptance: tuple[float, ...]
  prior_weight: float = 4.0
  decay: float = 0.97
  row_decay: float = 0.85
  row_prior_weight: float = 3.0
  confidence_bins: int = 0
  confidence_weight: float = 0.5
  hysteresis: float = 0.01
  drift_delta: float = 0.5
  drift_threshold: float = 8.0
  residual_weight: float = 0.05
  drift_keep: float = 0.05
  row_stop_survival: float = 0.0
  min_draft_len: int = 1
  cost_at_active_batch: bool = True

  def __post_init__(self):
    max_k = len(self.seconds[0]) - 1
    if len(self.prior_acceptance) < max_k:
      raise ValueError(f"prior_acceptance has {len(self.prior_acceptance)} positions; "
                       f"the cost table needs {max_k}")
    for name in ("decay", "row_decay", "drift_keep"):
      value = getattr(self, name)
      if not 0.0 < value <= 1.0:
        raise ValueError(f"{name}={value!r} must be in (0, 1]")
    if not 1 <= self.min_draft_len <= max_k:
      raise ValueError(f"min_draft_len={self.min_draft_len!r} must be in [1, {max_k}]")
    if self.confidence_bins < 0:
      raise ValueError(f"confidence_bins={self.confidence_bins!r} must be >= 0")

  @classmethod
  def from_table(cls, table: CostTable, prior_acceptance, **options) -> TableTuneController:
    prior = tuple(float(p) for p in np.asarray(prior_acceptance)[:table.max_draft_len])
    return cls(batches=tuple(table.batches), seconds=tuple(map(tuple, table.seconds)),
               prior_acceptance=prior, **options)

  @property
  def max_draft_len(self) -> int:
    return len(self.seconds[0]) - 1

  # -- the DraftPolicy methods --------------------------------------------------------

  def init(self, batch: int) -> ControllerState:
    k = self.max_draft_len
    prior = jnp.asarray(self.prior_acceptance[:k], jnp.float32)
    start = self._best(acc.expected_tokens(prior)[None].repeat(batch, 0),
                       jnp.ones((batch,), bool))
    zero = jnp.float32(0)
    return ControllerState(
        counts=acc.empty_counts((k,)), row_counts=acc.empty_counts((batch, k)),
        calibration=acc.empty_counts((k, max(self.confidence_bins, 1))),
        draft_len=start, drift_up=zero, drift_down=zero, residual_var=jnp.float32(1.0),
        drifts=jnp.int32(0))

  def choose(self, state: ControllerState, active: jnp.ndarray):
    row_tokens = acc.expected_tokens(self._row_acceptance(state))
    best = self._best(row_tokens, active)
    rate = self._rates(row_tokens, active)
    current = state.draft_len
    switch = rate[best] > rate[current] * (1.0 + self.hysteresis)
    draft_len = jnp.where(switch, best, current).astype(jnp.int32)
    cap = jnp.full(active.shape, draft_len, jnp.int32)
    if self.row_stop_survival > 0:
      survival = jnp.cumprod(self._row_acceptance(state), axis=-1)
      cap = jnp.minimum(cap, jnp.sum(jnp.cumprod(survival >= self.row_stop_survival, -1), -1)
                        .astype(jnp.int32))
    return draft_len, cap, state._replace(draft_len=draft_len)

  def observe(self, state: ControllerState, k, accepted, confidence, active):
    k = jnp.asarray(k, jnp.int32)
    accepted = jnp.asarray(accepted, jnp.int32)
    max_k = self.max_draft_len
    batch_prior = self._batch_acceptance(state)
    predicted = acc.expected_tokens(batch_prior)[jnp.clip(k, 0, max_k)] - 1.0
    # Page-Hinkley on the mean accepted length against the estimate's prediction, in
    # units of its recent spread so that one threshold serves every batch and regime.
    n_active = jnp.maximum(jnp.sum(active), 1)
    residual = jnp.sum(jnp.where(active, accepted, 0)) / n_active - predicted
    standardized = residual / jnp.sqrt(state.residual_var + 1e-3)
    drift_up = jnp.maximum(0.0, state.drift_up + standardized - self.drift_delta)
    drift_down = jnp.maximum(0.0, state.drift_down - standardized - self.drift_delta)
    drift = (drift_up > self.drift_threshold) | (drift_down > self.drift_threshold)
    keep = jnp.where(drift, self.drift_keep, 1.0)

    counts = acc.update(state.counts, k, accepted, active, decay=self.decay * keep)
    reached, survived = acc.block_outcomes(k, accepted, max_k, active)
    calibration = state.calibration
    if self.confidence_bins and confidence is not None:
      calibration = acc.update_calibration(calibration, k, accepted, confidence, active,
                                           decay=self.decay * keep)
      # Drafted positions after the first rejection were never verified; the head's
      # calibrated confidence there is the only evidence about them.
      probability = acc.conditional_acceptance(calibration, batch_prior[:, None],
                                               self.prior_weight)
      bins = acc.confidence_bins(confidence[:, :max_k], self.confidence_bins)
      calibrated = jnp.take_along_axis(probability.T, bins, axis=0)
      unreached = ((jnp.arange(max_k) < k) & active[:, None]).astype(jnp.float32) - reached
      survived = survived + self.confidence_weight * unreached * calibrated
      reached = reached + self.confidence_weight * unreached
    # A row that is not active has finished its request: its slot starts afresh.
    row_decay = jnp.where(active, self.row_decay * keep, 0.0)[:, None]
    row_counts = acc.AcceptanceCounts(row_decay * state.row_counts.survived + survived,
                                      row_decay * state.row_counts.reached + reached)
    return state._replace(
        counts=counts, row_counts=row_counts, calibration=calibration,
        drift_up=jnp.where(drift, 0.0, drift_up), drift_down=jnp.where(drift, 0.0, drift_down),
        residual_var=(1.0 - self.residual_weight) * state.residual_var
        + self.residual_weight * jnp.minimum(residual ** 2, 4.0 * state.residual_var + 1.0),
        drifts=state.drifts + drift.astype(jnp.int32))

  # -- helpers --------------------------------------------------------------------------

  def _batch_acceptance(self, state: ControllerState) -> jnp.ndarray:
    prior = acc.shifted_prior(state.counts, self.prior_acceptance[:self.max_draft_len],
                              self.prior_weight)
    return acc.conditional_acceptance(state.counts, prior, self.prior_weight)

  def _row_acceptance(self, state: ControllerState) -> jnp.ndarray:
    return acc.conditional_acceptance(state.row_counts, self._batch_acceptance(state)[None],
                                      self.row_prior_weight)

  def _rates(self, row_tokens: jnp.ndarray, active: jnp.ndarray) -> jnp.ndarray:
    """Expected tokens per second of every K (index = K) for the active rows."""
    tokens = jnp.sum(jnp.where(active[:, None], row_tokens, 0.0), axis=0)
    priced_rows = (jnp.maximum(jnp.sum(active), 1) if self.cost_at_active_batch
                   else active.shape[0])
    cost = interpolate_rows(jnp.asarray(self.batches, jnp.float32),
                            jnp.asarray(self.seconds, jnp.float32),
                            jnp.asarray(priced_rows, jnp.float32))
    return tokens / cost

  def _best(self, row_tokens: jnp.ndarray, active: jnp.ndarray) -> jnp.ndarray:
    rate = self._rates(row_tokens, active)
    allowed = jnp.arange(self.max_draft_len + 1) >= self.min_draft_len
    return jnp.argmax(jnp.where(allowed, rate, -jnp.inf)).astype(jnp.int32)


jax.tree_util.register_static(TableTuneController)
