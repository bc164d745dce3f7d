"""A quantized W2 (int8 or fp8 e4m3, one fp32 scale per vocabulary row).

Halving W2 lets the whole rank-256 projection stay on chip. The quantized walk has its
own contract, shared by the reference and the kernels: ``b = (Σ_j q[v, j] · z_j) ·
scale[v]`` with ``z`` rounded to bf16 (which holds every int8/e4m3 value exactly) and fp32
accumulation. ``wts-bench`` reports how often its tokens agree with the bf16 walk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.heads.draft_head import DraftHead

SCHEMES = {"int8": (jnp.int8, 127.0), "fp8": (jnp.float8_e4m3fn, 448.0)}


class QuantizedLinear(nnx.Module):
  """``weight`` [V, r] int8/fp8 and ``scale`` [V] fp32: ``W ≈ weight · scale[:, None]``."""

  def __init__(self, weight: jax.Array, scale: jax.Array):
    self.weight = nnx.Param(weight)
    self.scale = nnx.Param(scale)


def quantize_rows(weight: jax.Array, scheme: str = "int8"):
  """Per-row symmetric quantization of ``weight`` [V, r] → (q [V, r], scale [V] fp32)."""
  if scheme not in SCHEMES:
    raise ValueError(f"scheme={scheme!r} must be one of {sorted(SCHEMES)}")
  dtype, top = SCHEMES[scheme]
  weight = weight.astype(jnp.float32)
  max_abs = jnp.max(jnp.abs(weight), axis=1)
  scale = jnp.where(max_abs > 0, max_abs / top, 1.0)
  scaled = weight / scale[:, None]
  if scheme == "int8":
    q = jnp.clip(jnp.round(scaled), -127, 127).astype(dtype)
  else:
    q = jnp.clip(scaled, -top, top).astype(dtype)
  return q, scale.astype(jnp.float32)


def quantize_w2(head: DraftHead, scheme: str = "int8") -> DraftHead:
  """A head sharing every weight with ``head`` but with W2 quantized per row."""
  graphdef, state = nnx.split(head)
  quantized = nnx.merge(graphdef, state)
  q, scale = quantize_rows(head.markov_head.markov_w2.weight[...], scheme)
  quantized.markov_head.markov_w2 = QuantizedLinear(q, scale)
  return quantized
