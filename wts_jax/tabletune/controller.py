"""TableTune's live controller: a ``DraftPolicy`` that re-derives K every iteration.

Each iteration it estimates the per-position acceptance of the traffic from the accepted
lengths it has seen (censored, exponentially forgotten; positions it has not drafted
lately take the prior's shape at the observed positions' level; per request, shrunk
towards the traffic's long-run estimate, where a new request starts), turns it into the
expected tokens of every draft length K, divides by the cost c(B, K) it currently
believes, and drafts the K with the highest expected tokens per second, switching only
when the gain passes a hysteresis margin.
K = 0 (no draft) is a choice like any other.

Costs: the profiled table is where the controller starts, not what it believes forever.
Every measured iteration (seconds at its K and rows) corrects the table it uses: a
Kalman filter on the log of each cell's error, with a prior that ties the cells together
(one level for the whole table, one for every drafting K against K = 0, one per draft
length, one per bucket, a slope in K per bucket, and the cell's own), so a measurement
at one (B, K) also moves the cells it says something about.

Probes: what the controller believes of a K it does not run goes stale — its cost, and
while K = 0 runs, the acceptance (an iteration without a draft says nothing about it).
So it runs the runner-up K for one iteration whenever the iterations since that K last
ran, times ``probe_budget``, pass the probe's expected loss (1 - the runner-up's expected
tokens per second over the current K's; at least the hysteresis margin): probing costs
about ``probe_budget`` of the throughput and goes where the choice is close; the loss is
counted less ``explore_sd`` relative standard deviations of the runner-up's expected
tokens (the acceptance estimate's binomial spread at its evidence), so a K whose
acceptance is little known is probed sooner. While K = 0 runs, the batch's evidence
fades by the share of its rows that are new requests (it was their predecessors'), so
that spread grows until a probe refreshes it. Before
that, it runs at once any K one measurement of which could tell its cost from the
current K's (its expected loss within ``explore_sd`` standard deviations of how far one
measurement would move their log-cost difference), so a new or stale table is measured
where it decides within a few iterations, and a K already measured about as well as a
noisy measurement allows is not run again for a small expected loss. This is how
drafting turns back on after K = 0 at the same batch, and how a stale table's costs get
measured where they matter.

Shifts: a two-sided Page-Hinkley test on the accepted length (observed minus predicted,
in units of the residuals' spread per row and never less than the spread of one row's
accepted length that the estimate predicts) drops most of the old acceptance evidence
when the traffic changes, and restarts the long-run counts from the recent ones, so the
estimate re-converges in a few iterations instead of a forgetting window.

The controller is a pytree: the cost table (``batches``, ``seconds``) and the prior are
its leaves, operands of the compiled loop (new numbers never recompile); the draft
lengths and the options are static. All methods are pure jax.numpy on static shapes.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.specdecode.policy import MeasuredIteration, check_draft_lens, searchsorted
from wts_jax.tabletune import acceptance as acc
from wts_jax.tabletune.controller_state import NEVER_RUN, ControllerState
from wts_jax.tabletune.cost_model import MODELLED_SOURCE
from wts_jax.tabletune.cost_table import CostTable, bucket_weights

IMPLS = ("xla", "pallas", "auto")
#: ``cost_draft_len_sd`` for a table whose costs a model gave rather than the device
#: (``from_table``): a roofline model's shape in K can be off where a profile's is not,
#: and with a measured table's narrow column spread a draft length the model prices too
#: dear would never be run to find out (docs/decisions.md).
MODELLED_DRAFT_LEN_SD = 0.3


def is_modelled(table: CostTable) -> bool:
  """Whether ``table``'s costs came from a model (``wts-tabletune profile --cost
  modelled``, and ``wts-tabletune``'s table without ``--costs``), not from the device."""
  return str(table.provenance.get("source", "")).startswith(MODELLED_SOURCE)


def _static(default):
  return dataclasses.field(default=default, metadata={"static": True})


@dataclasses.dataclass(frozen=True, eq=False)
class TableTuneController:
  """Chooses K per iteration from a cost table, live measured costs and the live
  acceptance estimate.

  Arrays (``from_table`` fills them): batches [buckets] and seconds [buckets,
  len(draft_lens)], the profiled cost table; prior [max K], the per-position acceptance
  assumed before any evidence (e.g. the profile the table was built for), worth
  ``prior_weight`` blocks in the batch's estimate and ``population_prior_weight`` in the
  long-run one.

  Options (static): draft_lens, the K it chooses among (0: no draft);
  decay/row_decay/population_decay: forgetting of the batch's (recent), each request's
  and the traffic's long-run counts per iteration that drafted; row_prior_weight: how
  many blocks of the long-run estimate a request's estimate starts from; hysteresis:
  the relative throughput gain needed to switch K;
  drift_delta/drift_threshold: Page-Hinkley tolerance and alarm level, in standard
  errors of the iteration's mean accepted length (an EMA of rows times the squared
  residual, weight ``residual_weight``, at least the variance of one row's accepted
  length under the estimate, over the active rows); drift_keep: the share of the counts kept when a
  shift is detected; probe_budget: the share of throughput spent probing the runner-up
  K (module docstring); cost_*_sd: the prior spread (log scale) of the table's error —
  one level, one for drafting (every K >= 1 against K = 0), per draft length, per
  bucket, a slope in K per bucket, per cell; timing_sd: the spread of one measured
  iteration around its cell's cost; cost_relax: per measured iteration, how far the cost
  uncertainty relaxes towards the prior's structure with every spread at most a cell's
  (costs drift — the context grows, the machine changes — by a few per cent);
  explore_sd: a K whose expected loss is within this many standard deviations of what
  one measurement would move its log cost against the current K's is run at once (a
  new or stale table is measured where it decides), and the probe's expected loss is
  counted less this many relative standard deviations of the runner-up's expected
  tokens. The structured spreads are wide (a
  table from another loop version can be off by a factor and in shape); only the cell's
  own is the profiler's noise.

  impl: "xla" runs ``choose`` and ``observe`` as the jax.numpy below (the reference, and
  the CPU path); "pallas" as one Pallas kernel launch each (``controller_kernel``;
  ``interpret`` runs those kernels in Pallas interpret mode, for CPU tests); "auto" the
  kernels where JAX's default backend is a GPU (the default), else the jax.numpy.
  """

  batches: jax.Array
  seconds: jax.Array
  prior: jax.Array
  draft_lens: tuple[int, ...] = _static((0, 1, 2, 3, 4, 5, 6, 7))
  prior_weight: float = _static(12.0)
  decay: float = _static(0.985)
  row_decay: float = _static(0.95)
  row_prior_weight: float = _static(3.0)
  hysteresis: float = _static(0.02)
  drift_delta: float = _static(0.5)
  drift_threshold: float = _static(8.0)
  residual_weight: float = _static(0.05)
  drift_keep: float = _static(0.05)
  probe_budget: float = _static(0.0003)
  cost_level_sd: float = _static(1.0)
  cost_drafting_sd: float = _static(0.3)
  cost_draft_len_sd: float = _static(0.1)
  cost_batch_sd: float = _static(0.3)
  cost_slope_sd: float = _static(0.3)
  cost_cell_sd: float = _static(0.03)
  timing_sd: float = _static(0.03)
  cost_relax: float = _static(0.0005)
  explore_sd: float = _static(0.5)
  population_decay: float = _static(0.998)
  population_prior_weight: float = _static(50.0)
  impl: str = _static("auto")
  interpret: bool = _static(False)

  def __post_init__(self):
    # Only the static fields: inside a transformation the arrays are tracers.
    lens = check_draft_lens(self.draft_lens)
    if self.impl not in IMPLS:
      raise ValueError(f"impl={self.impl!r} must be one of {IMPLS}")
    if len(lens) < 2 or lens[-1] < 1:
      raise ValueError(f"draft_lens={self.draft_lens!r} must hold >= 2 draft lengths, one "
                       f">= 1")
    for name in ("decay", "row_decay", "population_decay", "drift_keep"):
      value = getattr(self, name)
      if not 0.0 < value <= 1.0:
        raise ValueError(f"{name}={value!r} must be in (0, 1]")
    if not 0.0 <= self.cost_relax < 1.0:
      raise ValueError(f"cost_relax={self.cost_relax!r} must be in [0, 1)")
    for name in ("prior_weight", "row_prior_weight", "population_prior_weight", "timing_sd"):
      if not getattr(self, name) > 0:
        raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")
    for name in ("hysteresis", "probe_budget", "cost_level_sd", "cost_drafting_sd",
                 "cost_draft_len_sd", "cost_batch_sd", "cost_slope_sd", "cost_cell_sd",
                 "explore_sd"):
      value = getattr(self, name)
      if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}={value!r} must be a finite number >= 0")

  @classmethod
  def from_table(cls, table: CostTable, prior_acceptance, *, draft_lens=None,
                 **options) -> TableTuneController:
    """The controller for ``table``: it chooses among ``draft_lens`` (default: the
    table's own; each must be one the table measured). A table a model gave (its
    provenance's source "modelled…") gets the wider column spread
    ``MODELLED_DRAFT_LEN_SD`` unless ``cost_draft_len_sd`` is among ``options``."""
    if is_modelled(table):
      options = {"cost_draft_len_sd": MODELLED_DRAFT_LEN_SD, **options}
    draft_lens = table.draft_lens if draft_lens is None else check_draft_lens(draft_lens)
    restricted = table.restricted(draft_lens)
    prior = np.asarray(prior_acceptance, np.float64).reshape(-1)
    if prior.size < draft_lens[-1]:
      raise ValueError(f"prior_acceptance has {prior.size} positions; draft_lens="
                       f"{draft_lens} need {draft_lens[-1]}")
    prior = prior[:draft_lens[-1]]
    if not np.all((prior >= 0) & (prior <= 1)):
      raise ValueError(f"prior_acceptance={prior.tolist()} must be in [0, 1]")
    return cls(batches=jnp.asarray(restricted.batches, jnp.float32),
               seconds=jnp.asarray(restricted.array(), jnp.float32),
               prior=jnp.asarray(prior, jnp.float32), draft_lens=draft_lens, **options)

  @property
  def max_draft_len(self) -> int:
    return self.draft_lens[-1]

  def corrected_seconds(self, state: ControllerState) -> jax.Array:
    """The cost table the controller now believes: [buckets, len(draft_lens)] seconds."""
    return self.seconds * jnp.exp(state.cost_error.reshape(self.seconds.shape))

  def with_learned_costs(self, state: ControllerState) -> TableTuneController:
    """The same controller (the same compiled loop) starting from the costs it learnt."""
    return dataclasses.replace(self, seconds=self.corrected_seconds(state))

  # -- the DraftPolicy methods --------------------------------------------------------

  def init(self, batch: int) -> ControllerState:
    k = self.max_draft_len
    zero = jnp.float32(0)
    cells = self.seconds.shape[0] * len(self.draft_lens)
    state = ControllerState(
        counts=acc.empty_counts((k,)), row_counts=acc.empty_counts((batch, k)),
        draft_len=jnp.int32(self.draft_lens[-1]), drift_up=zero, drift_down=zero,
        residual_var=zero, drifts=jnp.int32(0),
        since_run=jnp.full((len(self.draft_lens),), NEVER_RUN, jnp.int32),
        probes=jnp.int32(0), cost_error=jnp.zeros((cells,), jnp.float32),
        cost_cov=self.cost_prior(), timed=jnp.int32(0), population=acc.empty_counts((k,)))
    rate = self._rates(state, jnp.ones((batch,), bool), jnp.float32(batch))
    return state._replace(draft_len=self._lens()[jnp.argmax(rate)])

  def _kernels(self):
    """``controller_kernel`` where this controller runs as kernels, else None."""
    if self.impl == "xla" or (self.impl == "auto" and jax.default_backend() != "gpu"):
      return None
    from wts_jax.tabletune import controller_kernel
    return controller_kernel

  def choose(self, state: ControllerState, active, new_request=None, rows=None):
    if (kernels := self._kernels()) is not None:
      return kernels.choose(self, state, active, new_request, rows, interpret=self.interpret)
    if new_request is not None:
      keep = jnp.where(new_request, 0.0, 1.0)[:, None]
      # While no draft runs no evidence arrives, but requests still leave: the batch's
      # evidence fades by the share of its rows that are new (it was their predecessors'),
      # so an estimate of departed traffic cannot hold speculation off for good.
      new = jnp.sum(new_request & active)
      fade = jnp.where(state.draft_len == 0,
                       1.0 - new / jnp.maximum(jnp.sum(active), 1), 1.0)
      state = state._replace(
          row_counts=acc.AcceptanceCounts(keep * state.row_counts.survived,
                                          keep * state.row_counts.reached),
          counts=acc.AcceptanceCounts(fade * state.counts.survived,
                                      fade * state.counts.reached))
    rows = jnp.sum(active) if rows is None else rows
    rate = self._rates(state, active, jnp.asarray(rows, jnp.float32))
    lens = self._lens()
    busy = jnp.any(active)
    current = jnp.argmax(lens == state.draft_len)
    best = jnp.argmax(rate)
    switch = (rate[best] > rate[current] * (1.0 + self.hysteresis)) & busy
    index = jnp.where(switch, best, current)
    # The runner-up, probed once its staleness has paid for the probe's expected loss;
    # before that, any K one measurement of which could move its cost against the
    # current K's by more than its expected loss allows (only while it is the less known
    # of the two: running the current K measures it). What one measurement can tell, not
    # the whole uncertainty: a K measured often is known to about what the filter lets a
    # noisy measurement move it, and running it again tells little.
    others = rate.at[index].set(-jnp.inf)
    runner_up = jnp.argmax(others)
    losses = jnp.maximum(1.0 - others / jnp.maximum(rate[index], 1e-30), 0.0)
    own_sd, information = self._log_cost_information(state, rows, index)
    margin = self.explore_sd * information - losses
    # Exploring costs pays only where measurements arrive: a loop without a device clock
    # never corrects the table, so it runs the table's best K and probes on schedule.
    doubtful = ((margin > 0) & (own_sd >= own_sd[index]) & (others > -jnp.inf)
                & (state.timed > 0))
    doubt = jnp.argmax(jnp.where(doubtful, margin, -jnp.inf))
    # (A runner-up within the hysteresis margin, even one that looks better, counts as
    # a loss of the margin: probed every hysteresis / probe_budget iterations, not at
    # every one, so the current K keeps running and keeps its estimates fresh.)
    # The loss counted against the acceptance estimate's own spread: a K whose expected
    # tokens are uncertain (little or faded evidence) is probed sooner.
    doubt_tokens = self.explore_sd * self._tokens_spread(state)
    due = ((state.since_run[runner_up] + 1.0) * self.probe_budget
           >= jnp.maximum(losses[runner_up] - doubt_tokens[runner_up], self.hysteresis))
    probe = busy & (jnp.any(doubtful) | due)
    runner_up = jnp.where(jnp.any(doubtful), doubt, runner_up)
    chosen = jnp.where(probe, runner_up, index)
    k = lens[chosen]
    since_run = jnp.where(jnp.arange(len(self.draft_lens)) == chosen, 0,
                          jnp.minimum(state.since_run + 1, NEVER_RUN))
    return k, jnp.full(active.shape, k, jnp.int32), state._replace(
        draft_len=lens[index], probes=state.probes + probe.astype(jnp.int32),
        since_run=since_run)

  def observe(self, state: ControllerState, k, accepted, confidence, active,
              measured: MeasuredIteration | None = None):
    del confidence  # the confidence head adds nothing here (docs/decisions.md)
    if (kernels := self._kernels()) is not None:
      return kernels.observe(self, state, k, accepted, active, measured,
                             interpret=self.interpret)
    k = jnp.asarray(k, jnp.int32)
    accepted = jnp.asarray(accepted, jnp.int32)
    max_k = self.max_draft_len
    drafted = k > 0
    batch_p = self._batch_acceptance(state)
    predicted = acc.expected_tokens(batch_p)[jnp.clip(k, 0, max_k)] - 1.0
    # Page-Hinkley on the mean accepted length against the estimate's prediction, in
    # units of its recent spread so that one threshold serves every batch and regime.
    # An iteration without a draft has no residual.
    n_active = jnp.maximum(jnp.sum(active), 1)
    residual = jnp.sum(jnp.where(active, accepted, 0)) / n_active - predicted
    # Standardized by the residuals' recent spread, and never by less than the spread of
    # the mean accepted length that the estimate predicts: before the loop has
    # drafted enough to learn that spread (a batch that starts at K = 0), one probe far
    # off the estimate is already an alarm.
    # (Both per row, divided by the active rows: a spread learnt at 16 rows then holds
    # at 128.)
    standardized = residual / jnp.sqrt(jnp.maximum(
        state.residual_var, acc.accepted_variance(batch_p, k)) / n_active + 1e-6)
    drift_up = jnp.maximum(0.0, state.drift_up + standardized - self.drift_delta)
    drift_down = jnp.maximum(0.0, state.drift_down - standardized - self.drift_delta)
    drift = drafted & ((drift_up > self.drift_threshold) | (drift_down > self.drift_threshold))
    keep = jnp.where(drift, self.drift_keep, 1.0)
    decay = jnp.where(drafted, self.decay, 1.0) * keep
    reached, survived = acc.block_outcomes(k, accepted, max_k, active)
    block = acc.AcceptanceCounts(survived.sum(0), reached.sum(0))
    counts = acc.AcceptanceCounts(decay * state.counts.survived + block.survived,
                                  decay * state.counts.reached + block.reached)
    # The long-run counts forget slowly; after a shift they start again from the
    # recent evidence.
    long_run = jnp.where(drafted, self.population_decay, 1.0)
    population = acc.AcceptanceCounts(
        jnp.where(drift, counts.survived, long_run * state.population.survived
                  + block.survived),
        jnp.where(drift, counts.reached, long_run * state.population.reached + block.reached))
    # A row's counts belong to its request: they decay while it drafts, and a new request
    # (``choose``'s new_request) starts them afresh.
    row_decay = jnp.where(active & drafted, self.row_decay * keep, 1.0)[:, None]
    row_counts = acc.AcceptanceCounts(row_decay * state.row_counts.survived + survived,
                                      row_decay * state.row_counts.reached + reached)
    residual_var = ((1.0 - self.residual_weight) * state.residual_var
                    + self.residual_weight
                    * jnp.minimum(n_active * residual ** 2, 4.0 * state.residual_var + 1.0))
    def tracked(new, old):  # an iteration without a draft leaves the test as it was
      return jnp.where(drafted, new, old)
    state = state._replace(
        counts=counts, row_counts=row_counts, population=population,
        drift_up=jnp.where(drift, 0.0, tracked(drift_up, state.drift_up)),
        drift_down=jnp.where(drift, 0.0, tracked(drift_down, state.drift_down)),
        residual_var=tracked(residual_var, state.residual_var),
        drifts=state.drifts + drift.astype(jnp.int32))
    if measured is not None:
      state = self._fold_in_cost(state, measured)
    return state

  # -- acceptance -----------------------------------------------------------------------

  def _lens(self) -> jnp.ndarray:
    return jnp.asarray(self.draft_lens, jnp.int32)

  def _batch_acceptance(self, state: ControllerState) -> jnp.ndarray:
    prior = acc.shifted_prior(state.counts, self.prior, self.prior_weight)
    return acc.conditional_acceptance(state.counts, prior, self.prior_weight)

  def _row_acceptance(self, state: ControllerState) -> jnp.ndarray:
    # A request's estimate starts from the traffic's long-run level, not the recent
    # batch's: the recent rows are a few dozen particular requests (their level drifts
    # with the mix), and a new request is a fresh draw from the traffic. While K = 0
    # runs the recent estimate is also the one frozen at the level that turned drafting
    # off; the long-run one is not.
    return acc.conditional_acceptance(state.row_counts,
                                      self._population_acceptance(state)[None],
                                      self.row_prior_weight)

  def _population_acceptance(self, state: ControllerState) -> jnp.ndarray:
    # Its prior weighs more than the batch's: the long-run counts never fade while K = 0
    # runs, so a position seen in a few early blocks only (K = 1 probes see position 0
    # alone) would otherwise keep their chance level for good.
    prior = acc.shifted_prior(state.population, self.prior, self.population_prior_weight)
    return acc.conditional_acceptance(state.population, prior, self.population_prior_weight)

  def _tokens_spread(self, state: ControllerState) -> jnp.ndarray:
    """Each draft length's relative standard deviation of the batch's expected tokens,
    from the binomial spread of each position's estimate at its (decayed) evidence.
    The recent counts', not the long-run ones': they fade with request turnover while
    K = 0 runs, so this spread grows and the probes come sooner."""
    p = jnp.clip(self._batch_acceptance(state), 0.01, 0.99)
    var_p = p * (1.0 - p) / (state.counts.reached + self.prior_weight + 1.0)
    survival = jnp.cumprod(p)                                           # S_j
    k = self.max_draft_len
    lens = np.asarray(self.draft_lens)
    # d E_K / d p_i = sum_{i <= j < K} S_j / p_i: [len, K]
    upto = (np.arange(k)[None, :] < lens[:, None]).astype(np.float32)   # j < K
    tail = jnp.cumsum((upto * survival[None, :])[:, ::-1], axis=1)[:, ::-1]
    grad = upto * tail / p[None, :]
    tokens = acc.expected_tokens(p)[lens]
    return jnp.sqrt(jnp.sum(grad ** 2 * var_p[None, :], axis=1)) / tokens

  def _rates(self, state: ControllerState, active, rows) -> jnp.ndarray:
    """Expected tokens per second of each draft length for the active rows at an
    iteration over ``rows`` rows."""
    lens = np.asarray(self.draft_lens)
    row_tokens = acc.expected_tokens(self._row_acceptance(state))[:, lens]
    tokens = jnp.sum(jnp.where(active[:, None], row_tokens, 0.0), axis=0)
    return tokens / self._cost(state, rows)

  # -- costs ----------------------------------------------------------------------------

  def cost_prior(self, drift: bool = False) -> jnp.ndarray:
    """The prior covariance of the cells' log errors (cell = bucket * len(draft_lens) + j).
    ``drift``: the same structure with every spread at most a cell's — what the filter
    relaxes towards between measurements (costs drift by a few per cent, not by the
    factor a table from another loop can be off)."""
    def spread(value):
      return min(value, self.cost_cell_sd) if drift else value
    buckets, lens = self.seconds.shape[0], len(self.draft_lens)
    bucket = np.repeat(np.arange(buckets), lens)
    column = np.tile(np.arange(lens), buckets)
    lens_k = np.tile(np.asarray(self.draft_lens, np.float64), buckets)
    slope = lens_k / self.draft_lens[-1]
    drafting = lens_k > 0
    same_bucket = bucket[:, None] == bucket[None, :]
    same_column = column[:, None] == column[None, :]
    cov = (spread(self.cost_level_sd) ** 2
           + spread(self.cost_drafting_sd) ** 2 * (drafting[:, None] & drafting[None, :])
           + spread(self.cost_draft_len_sd) ** 2 * same_column
           + same_bucket * (spread(self.cost_batch_sd) ** 2
                            + spread(self.cost_slope_sd) ** 2 * slope[:, None] * slope[None, :])
           + self.cost_cell_sd ** 2 * np.eye(buckets * lens))
    return jnp.asarray(cov, jnp.float32)

  def _cells(self, rows):
    """The two cells per draft length that the cost at ``rows`` interpolates, and their
    weights: ([2, len], [2, len])."""
    lower, w_lower, w_upper = bucket_weights(self.batches, rows)
    lens = len(self.draft_lens)
    columns = jnp.arange(lens)
    cells = jnp.stack([lower * lens + columns, (lower + 1) * lens + columns])
    weights = jnp.stack([jnp.broadcast_to(w_lower, (lens,)), jnp.broadcast_to(w_upper, (lens,))])
    return cells, weights

  def _log_cost_information(self, state: ControllerState, rows, current):
    """At ``rows``, under the cost filter's covariance: the standard deviation of each
    draft length's log cost, and how far one measurement of it would move, in
    expectation, its log cost over the ``current`` one's (index into draft_lens): the
    standard deviation of that update, |cov(difference, measurement)| / sd(measurement).
    ([len], [len])."""
    cells, weights = self._cells(jnp.asarray(rows, jnp.float32))
    believed = weights * self.seconds.reshape(-1)[cells] * jnp.exp(state.cost_error[cells])
    share = believed / jnp.maximum(jnp.sum(believed, axis=0), 1e-9)   # d log cost / d error
    cov = state.cost_cov
    # [2, 2, len]: the covariance of each K's two cells, and with the current K's two.
    own = cov[cells[:, None, :], cells[None, :, :]]
    cross = cov[cells[:, None, :], cells[None, :, current][..., None]]
    own_var = jnp.maximum(jnp.einsum("il,ijl,jl->l", share, own, share), 0.0)
    covariance = jnp.einsum("il,ijl,j->l", share, cross, share[:, current])
    information = jnp.abs(own_var - covariance) / jnp.sqrt(own_var + self.timing_sd ** 2)
    return jnp.sqrt(own_var), information

  def _cost(self, state: ControllerState, rows) -> jnp.ndarray:
    """Each draft length's believed cost at ``rows``."""
    cells, weights = self._cells(rows)
    believed = self.seconds.reshape(-1)[cells] * jnp.exp(state.cost_error[cells])
    return jnp.maximum(jnp.sum(weights * believed, axis=0), 1e-9)

  def _fold_in_cost(self, state: ControllerState, measured: MeasuredIteration):
    """One Kalman update of the cells' log errors with a measured iteration."""
    seconds = jnp.asarray(measured.seconds, jnp.float32)
    k = jnp.asarray(measured.draft_len, jnp.int32)
    lens = self._lens()
    column = jnp.clip(searchsorted(jnp, lens, k), 0, len(self.draft_lens) - 1)
    valid = jnp.isfinite(seconds) & (seconds > 0) & (lens[column] == k)
    cells, weights = self._cells(jnp.asarray(measured.rows, jnp.float32))
    cells, weights = cells[:, column], weights[:, column]
    parts = weights * self.seconds.reshape(-1)[cells] * jnp.exp(state.cost_error[cells])
    predicted = jnp.maximum(jnp.sum(parts), 1e-9)
    share = parts / predicted                     # d log(cost) / d error[cell]
    drift = self.cost_prior(drift=True)
    # An invalid measurement changes nothing: no relaxation and a zero gain (arithmetic
    # that leaves the state exact, rather than a select of the old state, which makes
    # the compiled loop copy it every iteration).
    relax = jnp.where(valid, self.cost_relax, 0.0)
    cov = (1.0 - relax) * state.cost_cov + relax * drift
    cov_share = cov[:, cells[0]] * share[0] + cov[:, cells[1]] * share[1]
    innovation_var = share[0] * cov_share[cells[0]] + share[1] * cov_share[cells[1]] + (
        self.timing_sd ** 2)
    spread = jnp.sqrt(innovation_var)
    # A measurement far off (a stall, a host hiccup) moves the table by at most 3 spreads.
    innovation = jnp.clip(jnp.log(jnp.where(valid, seconds, 1.0)) - jnp.log(predicted),
                          -3.0 * spread, 3.0 * spread)
    gain = jnp.where(valid, cov_share / innovation_var, 0.0)
    return state._replace(cost_error=state.cost_error + gain * innovation,
                          cost_cov=cov - gain[:, None] * cov_share[None, :],
                          timed=state.timed + valid.astype(jnp.int32))


jax.tree_util.register_dataclass(TableTuneController)
