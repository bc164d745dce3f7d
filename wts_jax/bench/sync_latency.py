"""The measured cost of one grid-wide step exchange of the persistent kernel.

The benchmark's floor model charges ``K × t_sync``. We measure ``t_sync`` with the real
kernel on a vocabulary so small (one 64-row tile per program) that a step is almost only
its exchange: the per-walk time at K=9 minus K=1, over 8 steps. It is an upper bound
on the barrier alone (it includes one tiny tile and the reduction of the slots).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def _walks_per_second(head, base, firsts, config) -> float:
  from wts_jax.api import walk

  @jax.jit
  def chain(head, base, firsts):
    return [walk(head, base, first, impl="pallas", config=config).tokens
            for first in firsts]

  jax.block_until_ready(chain(head, base, firsts))
  best = float("inf")
  for _ in range(5):
    start = time.perf_counter()
    jax.block_until_ready(chain(head, base, firsts))
    best = min(best, time.perf_counter() - start)
  return best / len(firsts)


def measure_sync_latency_us(walks: int = 50) -> float:
  """µs per grid exchange (GPU only), from the kernel itself at K=9 vs K=1."""
  from wts_jax import device
  from wts_jax.heads import HeadConfig, make_head
  from wts_jax.walk_config import MosaicRowConfig

  programs = device.current().num_sms
  config = HeadConfig(vocab_size=programs * 64, rank=256, hidden_size=256)
  head = make_head(config, seed=0)
  kernel_config = MosaicRowConfig(residency="none")
  firsts = [jnp.full((1,), i, jnp.int32) for i in range(walks)]
  times = {}
  for steps in (1, 9):
    base = jax.random.normal(jax.random.key(steps), (1, steps, config.vocab_size),
                             jnp.float32).astype(jnp.bfloat16)
    times[steps] = _walks_per_second(head, base, firsts, kernel_config)
  return (times[9] - times[1]) / 8 * 1e6
