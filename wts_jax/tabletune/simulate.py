"""Replays a trace through a draft-length policy over a cost table (one jitted scan).

Per iteration: the policy chooses K and per-row caps; a policy with ``stop_in_walk``
may stop rows earlier from the block's signals, and the iteration then drafts the
longest row's stop. Each active row accepts its number of leading successes among the
positions it drafted (the trace's shared outcomes), plus the bonus token; the
iteration costs c(B_active, K) from the *true* table (which need not be the table the
policy was given). The policy then observes K, the accepted lengths and the confidence.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.tabletune.cost_table import CostTable, interpolate_rows
from wts_jax.tabletune.traces import Trace


@partial(jax.jit, static_argnames=("policy", "ragged_verify"))
def _replay(policy, active, outcomes, confidence, entropy, batches, seconds, ragged_verify):
  max_k = outcomes.shape[-1]
  position = jnp.arange(max_k)

  def step(state, inputs):
    active_t, outcomes_t, confidence_t, entropy_t = inputs
    k, cap, state = policy.choose(state, active_t)
    cap = jnp.minimum(cap, k)
    if hasattr(policy, "stop_in_walk"):
      cap = jnp.minimum(cap, policy.stop_in_walk(state, k, confidence_t, entropy_t, active_t))
      k = jnp.maximum(jnp.max(jnp.where(active_t, cap, 0)), 1)
    leading = jnp.sum(jnp.cumprod(outcomes_t & (position < k), axis=-1), axis=-1)
    accepted = jnp.where(active_t, jnp.minimum(leading, cap), 0).astype(jnp.int32)
    n_active = jnp.sum(active_t)
    row = interpolate_rows(batches, seconds, n_active.astype(seconds.dtype))
    if ragged_verify:
      # Priced by verified tokens: sum of caps / rows drafted positions a row, linear in K.
      per_row = (jnp.sum(jnp.where(active_t, cap, 0)) / jnp.maximum(n_active, 1)).astype(
          seconds.dtype)
      lower = jnp.floor(per_row).astype(jnp.int32)
      upper = jnp.minimum(lower + 1, max_k)
      cost = row[lower] + (per_row - lower) * (row[upper] - row[lower])
    else:
      cost = row[k]
    tokens = jnp.sum(jnp.where(active_t, accepted + 1, 0))
    state = policy.observe(state, k, accepted, confidence_t, active_t)
    return state, (tokens, jnp.where(n_active > 0, cost, 0.0), k)

  _, (tokens, cost, draft_len) = jax.lax.scan(
      step, policy.init(active.shape[1]), (active, outcomes, confidence, entropy))
  return tokens, cost, draft_len


def replay(policy: Any, trace: Trace, true_costs: CostTable, *,
           ragged_verify: bool = False) -> dict[str, Any]:
  """tokens/s of ``policy`` on ``trace``, and its per-iteration draft lengths.

  ragged_verify: price each iteration by the positions the rows were allowed (the mean
  cap), as an engine with ragged verification would, instead of B x (K + 1).
  """
  if true_costs.max_draft_len < trace.max_draft_len:
    raise ValueError(f"true_costs.max_draft_len={true_costs.max_draft_len} must be >= the "
                     f"trace's {trace.max_draft_len}")
  tokens, cost, draft_len = _replay(
      policy, jnp.asarray(trace.active), jnp.asarray(trace.outcomes),
      jnp.asarray(trace.confidence), jnp.asarray(trace.entropy),
      jnp.asarray(true_costs.batches, jnp.float32),
      jnp.asarray(true_costs.array()[:, :trace.max_draft_len + 1], jnp.float32),
      ragged_verify)
  tokens, cost, draft_len = (np.asarray(x) for x in (tokens, cost, draft_len))
  return {"tokens_per_s": float(tokens.sum() / cost.sum()), "tokens": int(tokens.sum()),
          "seconds": float(cost.sum()), "draft_len": draft_len}
