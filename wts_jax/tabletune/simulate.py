"""Replays a trace through a draft-length policy over a cost table (one jitted scan).

Per iteration: the policy chooses K and per-row caps (told which rows are active, which
started a new request, and that the iteration computes the active rows); a policy with
``stop_in_walk`` may stop rows earlier from the block's signals, and the iteration then
drafts the longest row's stop. Each active row accepts its number of leading successes
among the positions it drafted (the trace's shared outcomes), plus the bonus token (K = 0:
the bonus token alone); the iteration costs c(B_active, K) from the *true* table (which
need not be the table the policy was given; linear in K between its labels). The policy
then observes K, the accepted lengths, the confidence and the iteration's measured time:
the true cost times the trace's timing noise, as a loop timing its iterations would see.

Throughput over a fixed workload: each phase of the trace is a fixed amount of work (its
active row-iterations, W_p), served at the policy's rate in that phase (r_p = its tokens
/ its seconds there), so tokens/s = sum W_p / sum (W_p / r_p). Plain tokens / seconds
over the trace would weigh each phase by the time the policy spent in it and reward a
policy for serving a busy phase slowly (the trace's phases last iterations, not work);
it is reported too (``tokens_per_s_by_time``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.specdecode.policy import MeasuredIteration
from wts_jax.tabletune.cost_table import CostTable, interpolate_draft_len, interpolate_rows
from wts_jax.tabletune.traces import Trace


@partial(jax.jit, static_argnames=("ragged_verify",))
def _replay(policy, active, new_request, outcomes, confidence, entropy, timing_noise,
            batches, draft_lens, seconds, ragged_verify):
  max_k = outcomes.shape[-1]
  position = jnp.arange(max_k)

  def cost_at(row, k):
    return interpolate_draft_len(draft_lens, row, k.astype(seconds.dtype))

  def step(state, inputs):
    active_t, new_t, outcomes_t, confidence_t, entropy_t, noise_t = inputs
    n_active = jnp.sum(active_t)
    k, cap, state = policy.choose(state, active_t, new_t, n_active)
    cap = jnp.minimum(cap, k)
    if hasattr(policy, "stop_in_walk"):
      cap = jnp.minimum(cap, policy.stop_in_walk(state, k, confidence_t, entropy_t, active_t))
      k = jnp.maximum(jnp.max(jnp.where(active_t, cap, 0)), 1)
    leading = jnp.sum(jnp.cumprod(outcomes_t & (position < k), axis=-1), axis=-1)
    accepted = jnp.where(active_t, jnp.minimum(leading, cap), 0).astype(jnp.int32)
    row = interpolate_rows(batches, seconds, n_active.astype(seconds.dtype))
    if ragged_verify:
      # Priced by verified tokens: sum of caps / rows drafted positions a row, linear in K.
      per_row = jnp.sum(jnp.where(active_t, cap, 0)) / jnp.maximum(n_active, 1)
      cost = cost_at(row, per_row)
    else:
      cost = cost_at(row, k)
    tokens = jnp.sum(jnp.where(active_t, accepted + 1, 0))
    measured = MeasuredIteration(jnp.where(n_active > 0, cost * noise_t, jnp.nan),
                                 k.astype(jnp.int32), n_active.astype(jnp.int32))
    state = policy.observe(state, k, accepted, confidence_t, active_t, measured)
    return state, (tokens, jnp.where(n_active > 0, cost, 0.0), k)

  _, (tokens, cost, draft_len) = jax.lax.scan(
      step, policy.init(active.shape[1]),
      (active, new_request, outcomes, confidence, entropy, timing_noise))
  return tokens, cost, draft_len


def replay(policy: Any, trace: Trace, true_costs: CostTable, *,
           ragged_verify: bool = False, timing_sd: float = 0.02) -> dict[str, Any]:
  """tokens/s of ``policy`` on ``trace``, and its per-iteration draft lengths.

  ragged_verify: price each iteration by the positions the rows were allowed (the mean
  cap), as an engine with ragged verification would, instead of B x (K + 1).
  timing_sd: the lognormal spread of a measured iteration around its true cost.
  """
  if true_costs.max_draft_len < trace.max_draft_len:
    raise ValueError(f"true_costs.max_draft_len={true_costs.max_draft_len} must be >= the "
                     f"trace's {trace.max_draft_len}")
  tokens, cost, draft_len = _replay(
      policy, jnp.asarray(trace.active), jnp.asarray(trace.new_request),
      jnp.asarray(trace.outcomes), jnp.asarray(trace.confidence), jnp.asarray(trace.entropy),
      jnp.asarray(np.exp(timing_sd * trace.timing_noise), jnp.float32),
      jnp.asarray(true_costs.batches, jnp.float32),
      jnp.asarray(true_costs.draft_lens, jnp.float32),
      jnp.asarray(true_costs.array(), jnp.float32), ragged_verify)
  tokens, cost, draft_len = (np.asarray(x, np.float64) for x in (tokens, cost, draft_len))
  work = np.bincount(trace.phase, weights=trace.active.sum(1))
  phase_tokens = np.bincount(trace.phase, weights=tokens, minlength=work.size)
  phase_seconds = np.bincount(trace.phase, weights=cost, minlength=work.size)
  busy = work > 0
  seconds_for_work = np.sum(work[busy] * phase_seconds[busy] / phase_tokens[busy])
  return {"tokens_per_s": float(work[busy].sum() / seconds_for_work),
          "tokens_per_s_by_time": float(tokens.sum() / cost.sum()),
          "tokens": int(tokens.sum()), "seconds": float(cost.sum()),
          "draft_len": draft_len.astype(np.int64)}
