"""Synthetic traffic traces (modelled acceptance, seeded) for the evaluation harness.

A trace fixes, for every iteration t and batch slot b: whether the slot holds a request
(``active``), whether that request is new to the slot (``new_request``), the true
per-position acceptance probability of the request's next block (``acceptance`` [T, B,
K]) and the outcome of every position (``outcomes``: a Bernoulli draw of it, shared by
every method: common random numbers), plus the two signals the draft-side stopping rules
read: the confidence head's logit (correlated with the outcome) and the drafter's
entropy (anti-correlated), and one standard normal per iteration that a timed loop's
measurement noise is drawn from. A block's accepted length is its number of leading
successes.

Acceptance of a request = a regime's per-position profile (geometric ones — chat-like,
code-like, reasoning-like, hard — and a non-geometric one, ``cliff``: good for three
positions, poor after), shifted on the logit scale per request (requests differ) and per
iteration (tokens differ); requests end after a geometric number of iterations and the
slot takes a new one drawn from the current regime mix.

A trace is a sequence of phases (each a number of iterations at some active rows and
regime mix); ``phase`` [T] says which phase an iteration belongs to. The evaluation
treats each phase as a fixed amount of work (its active row-iterations), so a policy
that serves a busy phase faster is not charged for spending less time in it.

A trace may be *stale*: the policies' table was built for acceptance other than the
traffic's (``stale="acceptance"``, ``profiled_regime`` differs from the running ones), or
its costs are off (``stale="costs"``, ``cost_error``: the policies' table is the true
one times ``stale_cost_factors``). The cost-stale traces sit where a 5 % error changes
the evaluated table's choice (``stale_cost_point``: inside a run of such rows, for the
regime where it costs most; fixed rows of hard traffic when no table is given).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

# Per-position conditional acceptance (position 0 first) of the geometric regimes:
# (first, decay). Levels chosen to span what speculative decoders report: chat ~2-3
# accepted tokens a block of 7, code ~5, reasoning ~1.5, hard < 1 (where not drafting
# at a large batch wins).
REGIME_RATES = {"chat": (0.78, 0.965), "code": (0.92, 0.99), "reasoning": (0.62, 0.95),
                "hard": (0.35, 0.93)}
# A drafter that predicts three positions well and little after: a shape no geometric
# prior has.
CLIFF_PROFILE = (0.9, 0.88, 0.85, 0.3, 0.25, 0.2, 0.2, 0.2)
REGIMES = (*REGIME_RATES, "cliff")


def regime_profile(regime: str, max_draft_len: int) -> np.ndarray:
  if regime == "cliff":
    profile = np.asarray(CLIFF_PROFILE, np.float64)
    return np.concatenate([profile, np.full(max(max_draft_len - profile.size, 0),
                                            profile[-1])])[:max_draft_len]
  if regime not in REGIME_RATES:
    raise ValueError(f"regime={regime!r} must be one of {sorted(REGIMES)}")
  first, decay = REGIME_RATES[regime]
  return first * decay ** np.arange(max_draft_len)


def stale_cost_point(costs, cost_error: tuple[float, float], max_rows: int,
                     regimes=tuple(REGIME_RATES), seed: int = 0
                     ) -> tuple[str, int, float] | None:
  """(regime, rows, loss): where a table off by ``cost_error`` chooses another draft
  length than the true table for that regime's traffic (its acceptance as measured,
  ``profiled_prior``), over 1 … ``max_rows`` rows: the middle of a run of such rows at
  least ``max_rows`` / 16 wide (the traffic's own spread of acceptance must not move the
  point out of it), the run whose middle loses most (``loss``: there, 1 - the stale
  choice's tokens/s over the best's). None where the error changes no choice so
  widely."""
  # Imported here: the table module pulls in jax, and the traces are numpy alone.
  from wts_jax.tabletune.table import tokens_per_second  # pylint: disable=import-outside-toplevel
  stale = costs.scaled(stale_cost_factors(costs.draft_lens, cost_error), "stale")
  rows = np.arange(1, max_rows + 1)
  found = None
  for regime in regimes:
    profile = profiled_prior(regime, costs.max_draft_len, seed)
    true_rate = tokens_per_second(costs, profile, rows)                  # [rows, lens]
    chosen = np.argmax(tokens_per_second(stale, profile, rows), axis=-1)
    loss = 1.0 - true_rate[rows - 1, chosen] / true_rate.max(axis=-1)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], (loss > 0).astype(int), [0]])))
    for start, stop in zip(edges[::2], edges[1::2]):    # rows[start:stop] choose wrong
      if stop - start < max(max_rows // 16, 1):
        continue
      at = (start + stop - 1) // 2
      if found is None or loss[at] > found[2]:
        found = (regime, int(rows[at]), float(loss[at]))
  return found


def stale_cost_factors(draft_lens, cost_error: tuple[float, float]) -> np.ndarray:
  """[len(draft_lens)]: the factor on each column of a table whose costs are off by
  ``cost_error = (drafting, tilt)``: every K >= 1 times (1 + drafting), and a tilt from
  (1 - tilt) at K = 0 to (1 + tilt) at the longest K."""
  drafting, tilt = cost_error
  lens = np.asarray(draft_lens, np.float64)
  return (1.0 + drafting * (lens > 0)) * (1.0 + tilt * (2.0 * lens / lens[-1] - 1.0))


@dataclasses.dataclass(frozen=True)
class Trace:
  name: str
  description: str
  active: np.ndarray       # [T, B] bool
  new_request: np.ndarray  # [T, B] bool: the slot's request differs from its last active one
  acceptance: np.ndarray   # [T, B, K] f32 true probabilities
  outcomes: np.ndarray     # [T, B, K] bool
  confidence: np.ndarray   # [T, B, K] f32 raw logits
  entropy: np.ndarray      # [T, B, K] f32 nats
  timing_noise: np.ndarray  # [T] f32 standard normal
  phase: np.ndarray        # [T] int32: the phase each iteration belongs to
  profiled_regime: str     # the regime the policies' prior and static table were built for
  running_regimes: tuple[str, ...]
  stale: str | None = None  # None, "acceptance" or "costs"
  cost_error: tuple[float, float] = (0.0, 0.0)  # stale="costs": (drafting, tilt)

  @property
  def max_draft_len(self) -> int:
    return self.acceptance.shape[-1]


@dataclasses.dataclass(frozen=True)
class Phase:
  iterations: int
  active_rows: int
  regime_mix: dict[str, float]
  new_requests: bool = True  # every slot starts a new request when the phase begins


def _logit(p):
  return np.log(p) - np.log1p(-p)


def make_trace(name: str, description: str, phases: list[Phase], *, batch: int,
               max_draft_len: int, profiled_regime: str, stale: str | None = None,
               cost_error: tuple[float, float] = (0.0, 0.0),
               seed: int = 0, request_sd: float = 0.5, token_sd: float = 0.6,
               mean_request_iterations: float = 60.0, confidence_noise: float = 0.9,
               entropy_noise: float = 0.6) -> Trace:
  """Builds a trace from phases (each: iterations, active rows, regime mix)."""
  if stale not in (None, "acceptance", "costs"):
    raise ValueError(f"stale={stale!r} must be None, 'acceptance' or 'costs'")
  rng = np.random.default_rng(seed)
  total = sum(phase.iterations for phase in phases)
  active = np.zeros((total, batch), bool)
  phase_of = np.zeros(total, np.int32)
  request = np.zeros((total, batch), np.int64)
  logits = np.zeros((total, batch, max_draft_len))
  profiles = {r: _logit(regime_profile(r, max_draft_len)) for r in REGIMES}
  row_logit = np.zeros((batch, max_draft_len))
  remaining = np.zeros(batch, int)
  request_id = np.zeros(batch, np.int64)
  requests = 0
  t = 0
  for index, phase in enumerate(phases):
    if not 1 <= phase.active_rows <= batch:
      raise ValueError(f"active_rows={phase.active_rows!r} must be in [1, {batch}]")
    unknown = set(phase.regime_mix) - set(REGIMES)
    if unknown:
      raise ValueError(f"regime_mix has {sorted(unknown)}; regimes are {list(REGIMES)}")
    weights = np.array([phase.regime_mix.get(r, 0.0) for r in REGIMES])
    weights = weights / weights.sum()
    if phase.new_requests:
      remaining[:] = 0
    for _ in range(phase.iterations):
      for b in np.flatnonzero(remaining <= 0):
        regime = REGIMES[rng.choice(len(REGIMES), p=weights)]
        row_logit[b] = profiles[regime] + request_sd * rng.standard_normal()
        remaining[b] = rng.geometric(1.0 / mean_request_iterations)
        requests += 1
        request_id[b] = requests
      remaining -= 1
      active[t, :phase.active_rows] = True
      phase_of[t] = index
      request[t] = request_id
      logits[t] = row_logit + token_sd * rng.standard_normal((batch, 1))
      t += 1
  # A slot's request is new when it differs from the one the slot last ran (a request
  # drawn while the slot was idle counts when the slot next runs).
  new_request = np.zeros_like(active)
  last = np.zeros(batch, np.int64)
  for t in range(total):
    new_request[t] = active[t] & (request[t] != last)
    last = np.where(active[t], request[t], last)
  acceptance = 1.0 / (1.0 + np.exp(-logits))
  outcomes = rng.random(acceptance.shape) < acceptance
  sign = np.where(outcomes, 1.0, -1.0)
  confidence = logits + 0.8 * sign + confidence_noise * rng.standard_normal(logits.shape)
  entropy = np.log1p(np.exp(-logits + 0.5 * -sign
                            + entropy_noise * rng.standard_normal(logits.shape)))
  timing_noise = rng.standard_normal(total)
  running = tuple(sorted({r for phase in phases for r, w in phase.regime_mix.items() if w}))
  return Trace(name=name, description=description, active=active, new_request=new_request,
               acceptance=acceptance.astype(np.float32), outcomes=outcomes,
               confidence=confidence.astype(np.float32), entropy=entropy.astype(np.float32),
               timing_noise=timing_noise.astype(np.float32), phase=phase_of,
               profiled_regime=profiled_regime, running_regimes=running, stale=stale,
               cost_error=tuple(cost_error))


def standard_traces(*, batch: int = 64, max_draft_len: int = 7, iterations: int = 1200,
                    seed: int = 0, costs=None) -> list[Trace]:
  """The evaluation's traces: stationary levels, a shift, alternation, batch mixes and
  churn, low acceptance where not drafting wins (a surge, a ramp to 2 x ``batch`` rows),
  a non-geometric profile, tables stale in acceptance and in costs. Row counts are for
  64 slots, scaled to ``batch``; the large-batch traces have 2 x ``batch`` slots.
  ``costs``: the true cost table, whose ``stale_cost_point`` places the cost-stale traces
  (rows and regime); without it they run hard traffic at 72 and 120 rows (of 64)."""
  n = iterations
  large = 2 * batch

  def rows(at_64: int) -> int:
    return max(1, at_64 * batch // 64)

  def trace(name, description, phases, profiled, offset, slots=batch, **options):
    return make_trace(name, description, phases, batch=slots, max_draft_len=max_draft_len,
                      profiled_regime=profiled, seed=seed + offset, **options)

  mixed = {"chat": 0.5, "code": 0.3, "reasoning": 0.2}
  churn_rows = np.random.default_rng(seed + 9).integers(1, batch + 1, max(n // 10, 1))
  ramp = [max(1, min(large, 2 ** i)) for i in range(int(np.log2(large)) + 1)]
  ramp = ramp + ramp[-2::-1]
  ramp_mix = {"chat": 0.3, "code": 0.2, "reasoning": 0.2, "hard": 0.3}
  return [
      trace(f"stationary_chat_b{rows(16)}", f"chat-like acceptance, {rows(16)} rows",
            [Phase(n, rows(16), {"chat": 1})], "chat", 1),
      trace(f"stationary_code_b{rows(48)}", f"code-like acceptance, {rows(48)} rows",
            [Phase(n, rows(48), {"code": 1})], "code", 2),
      trace(f"stationary_reasoning_b{rows(64)}",
            f"reasoning-like (low) acceptance, {rows(64)} rows",
            [Phase(n, rows(64), {"reasoning": 1})], "reasoning", 3),
      trace(f"shift_chat_to_code_b{rows(32)}",
            f"chat-like, then code-like from mid-trace, {rows(32)} rows",
            [Phase(n // 2, rows(32), {"chat": 1}), Phase(n - n // 2, rows(32), {"code": 1})],
            "chat", 4),
      trace("batch_mix", "active rows 64 / 4 / 32 / 1 / 48 / 12 (of 64) in phases, "
            "mixed regimes",
            [Phase(n // 6, rows(64), {"chat": 0.6, "code": 0.2, "reasoning": 0.2}),
             Phase(n // 6, rows(4), {"code": 1}),
             Phase(n // 6, rows(32), {"chat": 0.5, "code": 0.5}),
             Phase(n // 6, 1, {"chat": 1}),
             Phase(n // 6, rows(48), {"reasoning": 0.5, "code": 0.5}),
             Phase(n - 5 * (n // 6), rows(12), {"chat": 0.3, "code": 0.4, "reasoning": 0.3})],
            "chat", 5),
      trace(f"alternating_chat_code_b{rows(32)}",
            f"chat-like and code-like alternating every 25 iterations, {rows(32)} rows",
            [Phase(25, rows(32), {"chat" if i % 2 == 0 else "code": 1})
             for i in range(max(n // 25, 1))], "chat", 8),
      trace("churn_batch", f"active rows redrawn in 1..{batch} every 10 iterations, "
            "mixed regimes",
            [Phase(10, int(r), mixed, new_requests=False) for r in churn_rows], "chat", 9),
      trace(f"low_acceptance_b{large}", f"hard (low) acceptance, {large} rows",
            [Phase(n, large, {"hard": 1})], "hard", 10, large),
      trace(f"surge_low_acceptance_b{rows(16)}_{large}",
            f"chat-like at {rows(16)} rows, a surge of hard (low-acceptance) traffic at "
            f"{large} rows, chat-like again",
            [Phase(n // 4, rows(16), {"chat": 1}), Phase(n // 2, large, {"hard": 1}),
             Phase(n - 3 * (n // 4), rows(16), {"chat": 1})], "chat", 11, large),
      trace(f"ramp_1_{large}", f"active rows 1, 2, 4 … {large} … 1, a phase each, "
            "mixed regimes with hard traffic",
            [Phase(max(n // len(ramp), 1), r, ramp_mix, new_requests=False) for r in ramp],
            "chat", 12, large),
      trace(f"shift_hard_to_chat_b{large}",
            f"hard (low) acceptance, then chat-like from mid-trace, {large} rows",
            [Phase(n // 2, large, {"hard": 1}), Phase(n - n // 2, large, {"chat": 1})],
            "hard", 18, large),
      trace(f"cliff_b{rows(32)}", f"non-geometric acceptance (good for 3 positions), "
            f"{rows(32)} rows; prior chat-like",
            [Phase(n, rows(32), {"cliff": 1})], "chat", 13),
      trace(f"stale_code_table_chat_traffic_b{rows(32)}",
            f"table profiled under code-like acceptance, traffic chat-like, {rows(32)} rows",
            [Phase(n, rows(32), {"chat": 1})], "code", 6, stale="acceptance"),
      trace(f"stale_reasoning_table_code_traffic_b{rows(48)}",
            f"table profiled under reasoning-like acceptance, traffic code-like, "
            f"{rows(48)} rows",
            [Phase(n, rows(48), {"code": 1})], "reasoning", 7, stale="acceptance"),
      trace(f"stale_chat_table_hard_traffic_b{large}",
            f"table profiled under chat-like acceptance, traffic hard, {large} rows",
            [Phase(n, large, {"hard": 1})], "chat", 14, large, stale="acceptance"),
      *(stale_cost_trace(functools.partial(trace, offset=offset), error, default, n, large,
                         costs, seed)
        for error, default, offset in ((0.05, rows(72), 15), (-0.05, rows(120), 16))),
  ]


def stale_cost_trace(trace, error: float, default_rows: int, iterations: int, slots: int,
                     costs, seed: int) -> Trace:
  """A trace (``trace``: standard_traces' maker) whose policies' table has every K >= 1
  ``error`` off (> 0: dearer than the truth, drafting got faster since the profile), at
  ``stale_cost_point`` of ``costs`` (else hard traffic at ``default_rows``)."""
  point = None if costs is None else stale_cost_point(costs, (error, 0.0), slots,
                                                      seed=seed)
  regime, active = ("hard", default_rows) if point is None else point[:2]
  name, direction = ("dear", "dearer") if error > 0 else ("cheap", "cheaper")
  return trace(f"stale_costs_drafting_{name}_{regime}_b{active}",
               f"policies' table with every K >= 1 {abs(error):.0%} {direction} than the "
               f"truth, {regime} traffic, {active} rows", [Phase(iterations, active,
                                                                {regime: 1})],
               regime, slots=slots, stale="costs", cost_error=(error, 0.0))


def measured_profile(trace: Trace) -> np.ndarray:
  """[K]: the trace's pooled per-position acceptance over its active rows (censored at the
  first rejection, as the loop sees it): the profile a static table built for this very
  traffic would use (its expected tokens are the trace's mean tokens per block)."""
  outcomes = trace.outcomes[trace.active]
  reached = np.cumprod(np.concatenate([np.ones(outcomes.shape[:-1] + (1,), bool),
                                       outcomes[..., :-1]], -1), -1)
  return (outcomes & reached).sum(0) / np.maximum(reached.sum(0), 1)


@functools.lru_cache(maxsize=64)
def _profiled_prior(regime: str, max_draft_len: int, seed: int) -> tuple[float, ...]:
  trace = make_trace("profiling", f"{regime} traffic measured for a prior",
                     [Phase(600, 64, {regime: 1})], batch=64, max_draft_len=max_draft_len,
                     profiled_regime=regime, seed=seed + 2000)
  return tuple(float(p) for p in measured_profile(trace))


def profiled_prior(regime: str, max_draft_len: int, seed: int = 0) -> np.ndarray:
  """[K]: a regime's acceptance as a deployment would know it: measured (pooled,
  censored) on traffic of that regime with its own seed, not the regime's nominal
  per-request profile. The two differ: requests differ, and the rows that reach a later
  position are the better ones, so pooled acceptance falls more slowly along the block."""
  return np.asarray(_profiled_prior(regime, max_draft_len, seed))
