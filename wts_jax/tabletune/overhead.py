"""The controller's own cost per iteration: a jitted ``lax.while_loop`` that runs only
choose + observe (on random accepted lengths and confidences) against the same loop
with a fixed draft length; the difference is what the controller adds to an iteration
of the decode loop (it runs on whatever device JAX uses)."""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.spec.policy import FixedDraftLength


def _policy_loop(policy: Any, batch: int, iterations: int):
  max_k = policy.max_draft_len

  @jax.jit
  def run(key):
    active = jnp.ones((batch,), bool)

    def body(carry):
      i, state, key, total = carry
      key, draw_key, conf_key = jax.random.split(key, 3)
      k, cap, state = policy.choose(state, active)
      accepted = jnp.minimum(jax.random.randint(draw_key, (batch,), 0, max_k + 1), cap)
      confidence = jax.random.normal(conf_key, (batch, max_k))
      state = policy.observe(state, k, accepted, confidence, active)
      return i + 1, state, key, total + k + jnp.sum(accepted) + jnp.int32(confidence[0, 0] > 0)

    return jax.lax.while_loop(lambda c: c[0] < iterations, body,
                              (0, policy.init(batch), key, jnp.int32(0)))[3]

  return run


def _seconds(fn, repeats: int) -> float:
  key = jax.random.PRNGKey(0)
  jax.block_until_ready(fn(key))  # compile and warm up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(key))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def controller_overhead(policy: Any, *, batch: int, iterations: int = 2000,
                        repeats: int = 5) -> dict[str, float]:
  """Seconds per iteration: the policy loop, the fixed-length loop, their difference."""
  with_policy = _seconds(_policy_loop(policy, batch, iterations), repeats) / iterations
  fixed = _seconds(_policy_loop(FixedDraftLength(policy.max_draft_len), batch, iterations),
                   repeats) / iterations
  return {"policy_s": with_policy, "fixed_s": fixed,
          "overhead_s": max(with_policy - fixed, 0.0),
          "device_kind": jax.devices()[0].device_kind, "batch": batch,
          "iterations": iterations}
