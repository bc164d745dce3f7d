"""The confidence head: ``c_k = w_h · h_k + w_e · e_k + c_b`` (a raw logit).

``proj.weight`` is [1, d + r] with input order ``[h ; e]`` when it reads the Markov
embedding (``confidence_head_with_markov``), else [1, d]. ``σ(c_k)`` estimates
P(draft k accepted | its prefix accepted).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.heads.config import HeadConfig
from wts_jax.heads.layers import Linear


class ConfidenceHead(nnx.Module):

  def __init__(self, config: HeadConfig, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16):
    self.with_markov = config.confidence_with_markov
    self.hidden_size = config.hidden_size
    in_features = config.hidden_size + (config.rank if self.with_markov else 0)
    self.proj = Linear(in_features, 1, use_bias=True, rngs=rngs, param_dtype=param_dtype)

  def weights(self):
    """(w_h [d], w_e [r] or None, c_b scalar) as fp32."""
    weight = self.proj.weight[...].astype(jnp.float32)[0]
    d = self.hidden_size
    w_e = weight[d:] if self.with_markov else None
    return weight[:d], w_e, self.proj.bias[...].astype(jnp.float32)[0]

  def hoist(self, hidden: jax.Array) -> jax.Array:
    """``w_h · h_k + c_b`` for all positions: [B, K]."""
    w_h, _, c_b = self.weights()
    return jnp.einsum("bkd,d->bk", hidden.astype(jnp.float32), w_h,
                      precision=jax.lax.Precision.HIGHEST) + c_b

  def serial(self, e: jax.Array) -> jax.Array:
    """``w_e · e_k`` [B] (0 when the head does not read the embedding)."""
    _, w_e, _ = self.weights()
    if w_e is None:
      return jnp.zeros(e.shape[:-1], jnp.float32)
    return jnp.einsum("br,r->b", e.astype(jnp.float32), w_e,
                      precision=jax.lax.Precision.HIGHEST)
