"""The decoder's numerics, shared by the target (``qwen3``), the drafter
(``dspark``) and the fused attention (``qkv_attention``): RMSNorm, the weight product, RoPE,
and the cache's row write. Each is written as the Hugging Face model computes it, in the
dtypes the decode loop runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wts_jax.specdecode.cache_attention import precision


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, *,
             scale_apart: bool = False) -> jax.Array:
  """RMSNorm in fp32 (as transformers' Qwen3RMSNorm), returned in ``x``'s dtype.

  scale_apart: the per-row scale is computed by a reduction of its own and applied in
  the consumers' kernels; otherwise XLA may fuse the norm into one normalization
  kernel that writes its output in fp32 for the consumers to read."""
  x32 = x.astype(jnp.float32)
  scale = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  if scale_apart:
    scale = jax.lax.optimization_barrier(scale)
  return (weight.astype(jnp.float32) * (x32 * scale)).astype(x.dtype)


def linear(x: jax.Array, weight: jax.Array) -> jax.Array:
  """``x Wᵀ`` for a ``[out, in]`` weight, in ``x``'s dtype with fp32 accumulation.

  The product is asked for ``x``'s dtype directly (the GPU's GEMMs accumulate in fp32
  and round once): asked for fp32 and converted after, XLA ran one-row products as
  fp32 GEMVs over a converted copy of the weight."""
  return jnp.einsum("...i,oi->...o", x, weight.astype(x.dtype),
                    preferred_element_type=x.dtype, precision=precision(x.dtype))


def rotation_tables(positions: jax.Array, head_dim: int, theta: float
                    ) -> tuple[jax.Array, jax.Array]:
  """RoPE's cos and sin [B, T, h] in fp32 at ``positions`` [B, T], each half-width table
  repeated over both halves (the rotate-half layout): computed once a forward, read by
  every layer (and by the fused attention kernel, which cannot slice them)."""
  half = head_dim // 2
  inv_freq = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2 / head_dim))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq      # [B, T, half]
  return (jnp.concatenate([jnp.cos(angles)] * 2, axis=-1),
          jnp.concatenate([jnp.sin(angles)] * 2, axis=-1))


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """RoPE on ``x`` [B, T, heads, h] by ``rotation_tables``' cos and sin (rotate-half
  layout), in fp32, returned in ``x``'s dtype."""
  half = x.shape[-1] // 2
  c, s = cos[:, :, None, :half], sin[:, :, None, :half]
  x32 = x.astype(jnp.float32)
  first, second = x32[..., :half], x32[..., half:]
  out = jnp.concatenate([first * c - second * s, second * c + first * s], axis=-1)
  return out.astype(x.dtype)


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """RoPE on ``x`` [B, T, heads, h] at ``positions`` [B, T] (rotate-half layout)."""
  return rotate(x, *rotation_tables(positions, x.shape[-1], theta))


def write_rows(layer_cache: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
  """One layer's cache [B, Kv, S, h] with ``new`` [B, Kv, T, h] at ``start[b] + t``."""
  def row(cache_row, new_row, at):
    return jax.lax.dynamic_update_slice(cache_row, new_row.astype(cache_row.dtype),
                                        (0, at, 0))
  return jax.vmap(row)(layer_cache, new, start)
