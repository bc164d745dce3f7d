"""Parameter containers in PyTorch layout, so checkpoint keys map one to one.

DeepSpec stores ``nn.Linear.weight`` as ``[out, in]`` and ``nn.Embedding.weight`` as
``[num, dim]``. We keep both layouts unchanged: for ``markov_w2`` ``[V, r]`` is also the
layout the kernels want (one vocabulary row contiguous), and conversion needs no
transposes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def _normal(rngs: nnx.Rngs, shape, std: float, dtype) -> jax.Array:
  return (jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(dtype)


class Embedding(nnx.Module):
  """``weight`` [num, dim]; a lookup returns rows in the stored dtype."""

  def __init__(self, num: int, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16):
    self.weight = nnx.Param(_normal(rngs, (num, dim), 1.0, param_dtype))

  def __call__(self, ids: jax.Array) -> jax.Array:
    return jnp.take(self.weight[...], ids, axis=0, mode="clip")


class Linear(nnx.Module):
  """``weight`` [out, in] (and ``bias`` [out]); ``y = x Wᵀ + b`` accumulated in fp32."""

  def __init__(self, in_features: int, out_features: int, *, use_bias: bool,
               rngs: nnx.Rngs, param_dtype=jnp.bfloat16, std: float | None = None):
    std = in_features ** -0.5 if std is None else std
    self.weight = nnx.Param(_normal(rngs, (out_features, in_features), std, param_dtype))
    self.bias = (nnx.Param(_normal(rngs, (out_features,), std, param_dtype))
                 if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    y = jnp.einsum("...i,oi->...o", x.astype(jnp.float32),
                   self.weight[...].astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST)
    if self.bias is not None:
      y = y + self.bias[...].astype(jnp.float32)
    return y
