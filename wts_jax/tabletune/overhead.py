"""The controller's own cost per iteration: a jitted ``lax.while_loop`` that runs only
choose + observe (on random accepted lengths and measured iteration times, every call
the loop makes: new-request flags, the rows, the timing) against the same loop with a
fixed draft length; the difference is what the controller adds to an iteration of the
decode loop (it runs on whatever device JAX uses)."""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.specdecode.policy import FixedDraftLength, MeasuredIteration, max_draft_len


def _policy_loop(batch: int, iterations: int):
  @jax.jit
  def run(policy, key):
    max_k = max_draft_len(policy)
    active = jnp.ones((batch,), bool)

    def body(carry):
      i, state, key, total = carry
      key, draw_key, time_key, new_key = jax.random.split(key, 4)
      new_request = jax.random.bernoulli(new_key, 0.02, (batch,))
      k, cap, state = policy.choose(state, active, new_request, jnp.int32(batch))
      accepted = jnp.minimum(jax.random.randint(draw_key, (batch,), 0, max_k + 1), cap)
      seconds = 0.01 * jnp.exp(0.02 * jax.random.normal(time_key))
      state = policy.observe(state, k, accepted, None, active,
                             MeasuredIteration(seconds, k, jnp.int32(batch)))
      return i + 1, state, key, total + k + jnp.sum(accepted)

    return jax.lax.while_loop(lambda c: c[0] < iterations, body,
                              (0, policy.init(batch), key, jnp.int32(0)))[3]

  return run


def _seconds(fn, policy, repeats: int) -> float:
  key = jax.random.PRNGKey(0)
  jax.block_until_ready(fn(policy, key))  # compile and warm up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(policy, key))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def controller_overhead(policy: Any, *, batch: int, iterations: int = 2000,
                        repeats: int = 5) -> dict[str, float]:
  """Seconds per iteration: the policy loop, the fixed-length loop, their difference."""
  loop = _policy_loop(batch, iterations)
  with_policy = _seconds(loop, policy, repeats) / iterations
  fixed = _seconds(loop, FixedDraftLength(max_draft_len(policy)), repeats) / iterations
  return {"policy_s": with_policy, "fixed_s": fixed,
          "overhead_s": max(with_policy - fixed, 0.0),
          "impl": getattr(policy, "impl", None),
          "device_kind": jax.devices()[0].device_kind, "batch": batch,
          "iterations": iterations}
