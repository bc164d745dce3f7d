"""Fresh random walk inputs (tests, benchmarks, the demo): never zeros."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wts_jax.heads.config import HeadConfig


def random_inputs(config: HeadConfig, batch: int, steps: int, key: jax.Array, *,
                  dtype=jnp.bfloat16, logit_scale: float = 2.0):
  """(base_logits [B, K, V], first_tokens [B] int32, hidden [B, K, d] or None).

  Base logits are N(0, logit_scale²): the head's bias (about unit scale with the random
  heads of ``make_head``) then moves the argmax often, so a wrong bias shows in tokens.
  """
  logits_key, tokens_key, hidden_key = jax.random.split(key, 3)
  base_logits = (jax.random.normal(logits_key, (batch, steps, config.vocab_size),
                                   jnp.float32) * logit_scale).astype(dtype)
  first_tokens = jax.random.randint(tokens_key, (batch,), 0, config.vocab_size, jnp.int32)
  hidden = None
  if config.needs_hidden:
    hidden = jax.random.normal(hidden_key, (batch, steps, config.hidden_size),
                               jnp.float32).astype(dtype)
  return base_logits, first_tokens, hidden
