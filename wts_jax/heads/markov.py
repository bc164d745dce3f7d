"""The two Markov heads: vanilla (``b_k = W2 · e_k``) and gated (``W2 · (g_k ⊙ e_k)``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.heads.base import SerialHead, hidden_terms
from wts_jax.heads.config import HeadConfig
from wts_jax.heads.layers import Linear


class VanillaMarkovHead(SerialHead):
  """``b_k = W2 · W1[x_{k-1}]``: no hidden input, no state."""

  head_type = "vanilla"

  def advance(self, state, e, hoisted_k):
    return state, e.astype(jnp.float32)


class GatedMarkovHead(SerialHead):
  """``g_k = σ(G_h h_k + G_e e_k + g_b)``, ``b_k = W2 · (g_k ⊙ e_k)``.

  ``gate_proj.weight`` is [r, d + r] with input order ``[h ; e]`` (DeepSpec).
  """

  head_type = "gated"

  def __init__(self, config: HeadConfig, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16):
    super().__init__(config, rngs=rngs, param_dtype=param_dtype)
    self.gate_proj = Linear(config.hidden_size + config.rank, config.rank, use_bias=True,
                            rngs=rngs, param_dtype=param_dtype)

  def gate_weights(self):
    """(G_h [r, d], G_e [r, r], g_b [r]) as fp32."""
    weight = self.gate_proj.weight[...].astype(jnp.float32)
    d = self.config.hidden_size
    return weight[:, :d], weight[:, d:], self.gate_proj.bias[...].astype(jnp.float32)

  def hoist(self, hidden):
    return hidden_terms(hidden, self.gate_proj.weight[...][:, :self.config.hidden_size],
                        self.gate_proj.bias[...])

  def advance(self, state, e, hoisted_k):
    _, gate_e, _ = self.gate_weights()
    e = e.astype(jnp.float32)
    gate = jax.nn.sigmoid(hoisted_k + jnp.einsum("br,sr->bs", e, gate_e,
                                                 precision=jax.lax.Precision.HIGHEST))
    return state, gate * e
