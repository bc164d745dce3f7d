"""Inputs whose tokens depend on the lo half of an fp32 z sent to W2 as a hi + lo bf16
pair: a kernel that drops the lo half picks another token."""

import jax.numpy as jnp
import numpy as np


def tie_broken_by_lo(head, base, first, hidden):
  """Base logits of step 0 that leave two candidates per row, (u, w), whose order under
  the exact fp32 z (u first) is the reverse of their order under z rounded to bf16 —
  so only a kernel that adds z's lo half picks u. Returns (base, u)."""
  serial = head.markov_head
  w2 = np.asarray(serial.markov_w2.weight[...], np.float64)
  e = jnp.asarray(serial.markov_w1.weight[...])[first].astype(jnp.float32)
  _, z = serial.advance(None, e, serial.hoisted_at(serial.hoist(hidden), 0))
  z = np.asarray(z, np.float64)
  exact = z @ w2.T
  rounded = np.asarray(jnp.asarray(z, jnp.float32).astype(jnp.bfloat16), np.float64) @ w2.T
  base = np.full(base.shape, -30.0, np.float32)
  chosen = []
  for b in range(base.shape[0]):
    # Pairs ordered one way exactly and the other way rounded, by the widest margin.
    gap, flip = exact[b][:, None] - exact[b][None, :], rounded[b][:, None] - rounded[b][None, :]
    margin = np.where((gap > 0) & (flip < 0), np.minimum(gap, -flip), 0.0)
    u, w = np.unravel_index(np.argmax(margin), margin.shape)
    assert margin[u, w] > 1e-4, "no pair the bf16 rounding reorders"
    base[b, 0, [u, w]] = 0.0
    chosen.append(u)
  return jnp.asarray(base, jnp.bfloat16), np.asarray(chosen)
