"""Synthetic traffic traces (modelled acceptance, seeded) for the evaluation harness.

A trace fixes, for every iteration t and batch slot b: whether the slot holds a request
(``active``), the true per-position acceptance probability of the request's next block
(``acceptance`` [T, B, K]) and the outcome of every position (``outcomes``: a Bernoulli
draw of it, shared by every method: common random numbers), plus the two signals the
draft-side stopping rules read: the confidence head's logit (correlated with the
outcome) and the drafter's entropy (anti-correlated). A block's accepted length is its
number of leading successes.

Acceptance of a request = a regime's per-position profile (chat-like, code-like,
reasoning-like), shifted on the logit scale per request (requests differ) and per
iteration (tokens differ); requests end after a geometric number of iterations and the
slot takes a new one drawn from the current regime mix.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Per-position conditional acceptance (position 0 first) of each regime, K = 16 long;
# truncated to the block size in use. Levels chosen to span what speculative decoders
# report: chat ~2-3 accepted tokens a block of 7, code ~5, reasoning ~1.5.
REGIME_RATES = {"chat": (0.78, 0.965), "code": (0.92, 0.99), "reasoning": (0.62, 0.95)}


def regime_profile(regime: str, max_draft_len: int) -> np.ndarray:
  if regime not in REGIME_RATES:
    raise ValueError(f"regime={regime!r} must be one of {sorted(REGIME_RATES)}")
  first, decay = REGIME_RATES[regime]
  return first * decay ** np.arange(max_draft_len)


@dataclasses.dataclass(frozen=True)
class Trace:
  name: str
  description: str
  active: np.ndarray       # [T, B] bool
  acceptance: np.ndarray   # [T, B, K] f32 true probabilities
  outcomes: np.ndarray     # [T, B, K] bool
  confidence: np.ndarray   # [T, B, K] f32 raw logits
  entropy: np.ndarray      # [T, B, K] f32 nats
  profiled_regime: str     # the regime the static table was built for
  running_regimes: tuple[str, ...]
  stale: bool = False      # profiled under one regime, run under another

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
               max_draft_len: int, profiled_regime: str, stale: bool = False,
               seed: int = 0, request_sd: float = 0.5, token_sd: float = 0.6,
               mean_request_iterations: float = 60.0, confidence_noise: float = 0.9,
               entropy_noise: float = 0.6) -> Trace:
  """Builds a trace from phases (each: iterations, active rows, regime mix)."""
  rng = np.random.default_rng(seed)
  total = sum(phase.iterations for phase in phases)
  active = np.zeros((total, batch), bool)
  logits = np.zeros((total, batch, max_draft_len))
  regime_names = sorted(REGIME_RATES)
  profiles = {r: _logit(regime_profile(r, max_draft_len)) for r in regime_names}
  row_logit = np.zeros((batch, max_draft_len))
  remaining = np.zeros(batch, int)
  t = 0
  for phase in phases:
    if not 1 <= phase.active_rows <= batch:
      raise ValueError(f"active_rows={phase.active_rows!r} must be in [1, {batch}]")
    weights = np.array([phase.regime_mix.get(r, 0.0) for r in regime_names])
    weights = weights / weights.sum()
    if phase.new_requests:
      remaining[:] = 0
    for _ in range(phase.iterations):
      for b in np.flatnonzero(remaining <= 0):
        regime = regime_names[rng.choice(len(regime_names), p=weights)]
        row_logit[b] = profiles[regime] + request_sd * rng.standard_normal()
        remaining[b] = rng.geometric(1.0 / mean_request_iterations)
      remaining -= 1
      active[t, :phase.active_rows] = True
      logits[t] = row_logit + token_sd * rng.standard_normal((batch, 1))
      t += 1
  acceptance = 1.0 / (1.0 + np.exp(-logits))
  outcomes = rng.random(acceptance.shape) < acceptance
  sign = np.where(outcomes, 1.0, -1.0)
  confidence = logits + 0.8 * sign + confidence_noise * rng.standard_normal(logits.shape)
  entropy = np.log1p(np.exp(-logits + 0.5 * -sign
                            + entropy_noise * rng.standard_normal(logits.shape)))
  running = tuple(sorted({r for phase in phases for r, w in phase.regime_mix.items() if w}))
  return Trace(name=name, description=description, active=active,
               acceptance=acceptance.astype(np.float32), outcomes=outcomes,
               confidence=confidence.astype(np.float32), entropy=entropy.astype(np.float32),
               profiled_regime=profiled_regime, running_regimes=running, stale=stale)


def standard_traces(*, batch: int = 64, max_draft_len: int = 7, iterations: int = 1200,
                    seed: int = 0) -> list[Trace]:
  """The evaluation's traces: stationary levels, a shift, alternation, batch mixes and
  churn, stale tables. Row counts are for 64 slots, scaled to ``batch``."""
  n = iterations

  def rows(at_64: int) -> int:
    return max(1, at_64 * batch // 64)

  def trace(name, description, phases, profiled, stale=False, offset=0):
    return make_trace(name, description, phases, batch=batch, max_draft_len=max_draft_len,
                      profiled_regime=profiled, stale=stale, seed=seed + offset)

  mixed = {"chat": 0.5, "code": 0.3, "reasoning": 0.2}
  churn_rows = np.random.default_rng(seed + 9).integers(1, batch + 1, max(n // 10, 1))
  return [
      trace(f"stationary_chat_b{rows(16)}", f"chat-like acceptance, {rows(16)} rows",
            [Phase(n, rows(16), {"chat": 1})], "chat", offset=1),
      trace(f"stationary_code_b{rows(48)}", f"code-like acceptance, {rows(48)} rows",
            [Phase(n, rows(48), {"code": 1})], "code", offset=2),
      trace(f"stationary_reasoning_b{rows(64)}",
            f"reasoning-like (low) acceptance, {rows(64)} rows",
            [Phase(n, rows(64), {"reasoning": 1})], "reasoning", offset=3),
      trace(f"shift_chat_to_code_b{rows(32)}",
            f"chat-like, then code-like from mid-trace, {rows(32)} rows",
            [Phase(n // 2, rows(32), {"chat": 1}), Phase(n - n // 2, rows(32), {"code": 1})],
            "chat", offset=4),
      trace("batch_mix", "active rows 64 / 4 / 32 / 1 / 48 / 12 (of 64) in phases, "
            "mixed regimes",
            [Phase(n // 6, rows(64), {"chat": 0.6, "code": 0.2, "reasoning": 0.2}),
             Phase(n // 6, rows(4), {"code": 1}),
             Phase(n // 6, rows(32), {"chat": 0.5, "code": 0.5}),
             Phase(n // 6, 1, {"chat": 1}),
             Phase(n // 6, rows(48), {"reasoning": 0.5, "code": 0.5}),
             Phase(n - 5 * (n // 6), rows(12), {"chat": 0.3, "code": 0.4, "reasoning": 0.3})],
            "chat", offset=5),
      trace(f"alternating_chat_code_b{rows(32)}",
            f"chat-like and code-like alternating every 25 iterations, {rows(32)} rows",
            [Phase(25, rows(32), {"chat" if i % 2 == 0 else "code": 1})
             for i in range(max(n // 25, 1))], "chat", offset=8),
      trace("churn_batch", f"active rows redrawn in 1..{batch} every 10 iterations, "
            "mixed regimes",
            [Phase(10, int(r), mixed, new_requests=False) for r in churn_rows],
            "chat", offset=9),
      trace(f"stale_code_table_chat_traffic_b{rows(32)}",
            f"table profiled under code-like acceptance, traffic chat-like, {rows(32)} rows",
            [Phase(n, rows(32), {"chat": 1})], "code", stale=True, offset=6),
      trace(f"stale_reasoning_table_code_traffic_b{rows(48)}",
            f"table profiled under reasoning-like acceptance, traffic code-like, "
            f"{rows(48)} rows",
            [Phase(n, rows(48), {"code": 1})], "reasoning", stale=True, offset=7),
  ]
