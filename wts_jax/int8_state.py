"""The int8 × int8 numerics contract: the serial vector as two int8 planes.

An int8 W2 meets the serial vector ``z`` on the tensor cores only if ``z`` is int8 too.
One int8 plane holds 7 bits; two hold about 15: ``z ≈ s · (q_hi + q_lo / 256)``, both
planes int8, one scale ``s`` per vector. Then every product is an exact integer dot:

    d_hi = Σ_j q2[v, j] · q_hi[j],   d_lo = Σ_j q2[v, j] · q_lo[j]   (|d| < 2^22)
    D = 256 · d_hi + d_lo                                           (|D| < 2^30, int32)
    bias[v] = (f32(D) · (s / 256)) · scale2[v]

Why the scale is a power of two: ``z / s`` and ``z − s · q_hi`` are then exact in fp32,
so the planes are a deterministic function of ``z`` on any backend (XLA, Triton, Mosaic)
— no division whose last ulp depends on the compiler. ``s`` is the smallest power of two
with ``127 · s ≥ max|z|`` (found from the exponent of ``max|z|``; exact comparisons).
|z − s_lo · (256 q_hi + q_lo)| <= s_lo / 2. ``f32(D) · (s / 256)`` is exact too, so the only roundings are the int32 → fp32 convert
and the product with the row scale — the same two operations in every implementation
(a compiler may fuse that product with the base-logit add into one FMA: at most an ulp
of a logit, as for the float contract).

Kernels may compute ``D`` as ``256 · d_hi + d_lo`` in fp32 from exact fp32 partial sums
(every partial sum is an integer below 2^24): one rounding of the same exact integer,
bit-identical to ``f32(int32 D)``.

The vanilla head's ``z`` is a W1 row: ``quantize_w2`` stores W1's planes once
(``W1Planes``), and they equal ``state_planes`` of the row by construction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PLANE_MAX = 127      # |q_hi| <= 127; q_lo in [-128, 127]
LO_STEPS = 256       # q_lo counts units of s / 256


def state_planes(z: jax.Array):
  """``z`` [..., r] (any float) → (q_hi, q_lo) int8 [..., r] and ``s_lo = s / 256``
  fp32 [...], with ``z ≈ s_lo · (256 · q_hi + q_lo)``."""
  z = z.astype(jnp.float32)
  max_abs = jnp.max(jnp.abs(z), axis=-1)
  mantissa, exponent = jnp.frexp(max_abs)   # max_abs = mantissa · 2^exponent, [0.5, 1)
  # 127 · 2^(e − 7) ≥ mantissa · 2^e  ⟺  mantissa ≤ 127 / 128 (exact in fp32).
  hi_exponent = exponent - 7 + jnp.where(mantissa > PLANE_MAX / 128, 1, 0)
  inv_s = jnp.ldexp(jnp.float32(1), -hi_exponent)[..., None]
  s = jnp.ldexp(jnp.float32(1), hi_exponent)[..., None]
  q_hi = jnp.round(z * inv_s)                                 # in [-127, 127]
  residue = z - q_hi * s                                      # exact, |residue| <= s / 2
  q_lo = jnp.round(residue * (inv_s * LO_STEPS))              # in [-128, 128]
  # +128 is one unit of q_hi (never at q_hi = 127: there the residue is <= 0).
  carry = q_lo == LO_STEPS // 2
  q_hi, q_lo = q_hi + carry, jnp.where(carry, -LO_STEPS // 2, q_lo)
  s_lo = jnp.ldexp(jnp.float32(1), hi_exponent - 8)
  return q_hi.astype(jnp.int8), q_lo.astype(jnp.int8), s_lo.astype(jnp.float32)


def planes_dot(q_hi: jax.Array, q_lo: jax.Array, w2_q: jax.Array) -> jax.Array:
  """``D = 256 · (W2 · q_hi) + W2 · q_lo``: [..., r] planes × [V, r] int8 → [..., V]
  int32, exact."""
  def dot(q):
    return jnp.einsum("...r,vr->...v", q, w2_q, preferred_element_type=jnp.int32)
  return dot(q_hi) * LO_STEPS + dot(q_lo)


def planes_vocab_bias(z: jax.Array, w2_q: jax.Array, w2_scale: jax.Array) -> jax.Array:
  """``W2 · z`` under the contract above: [..., r] → [..., V] fp32."""
  q_hi, q_lo, s_lo = state_planes(z)
  products = planes_dot(q_hi, q_lo, w2_q).astype(jnp.float32) * s_lo[..., None]
  return products * w2_scale


def interleaved_planes(w1: jax.Array):
  """W1 [V, r] → its rows' planes interleaved, [2V, r] int8 (row 2x: q_hi of token x,
  row 2x + 1: its q_lo), and ``s_lo`` [V] fp32. The kernels copy 8 consecutive rows
  (4 tokens' planes) into shared memory as the WGMMA's B operand."""
  q_hi, q_lo, s_lo = state_planes(w1)
  planes = jnp.stack([q_hi, q_lo], axis=1)
  return planes.reshape(2 * w1.shape[0], w1.shape[1]), s_lo


def fragment_ordered(planes: jax.Array, plane_width: int | None = None) -> jax.Array:
  """W1's planes [V, 2r] int8 (a token's hi plane then its lo plane; the interleaved
  [2V, r] reshaped) with each plane's bytes in the order one thread of the WGMMA's
  8-bit A-operand layout holds them (4 bytes in each 16-column tile, at the same place
  in every tile): byte ``16 t + 4 g + j`` of a plane moves to ``g · r / 4 + 4 t + j``,
  so a thread loads its share of a row by 16-byte loads (the stacked walk).
  ``plane_width``: the row holds planes of that many bytes (default r)."""
  vocab, width = planes.shape
  rank = plane_width or width // 2
  return (planes.reshape(vocab, width // rank, rank // 16, 4, 4).transpose(0, 1, 3, 2, 4)
          .reshape(vocab, width))


def thread_rows_ordered(w2):
  """W2 [V, r] (V a multiple of 64) with each 64-row tile's rows in the order the
  WGMMA's accumulator columns meet them when a thread's 16 columns are 16 consecutive
  rows: tile position 8j + 2t + e holds the tile's row 16t + 2j + e (the stacked walk's
  ``w2_order="thread_rows"``: a thread's base logits are 32 contiguous bytes)."""
  vocab, rank = w2.shape
  return (w2.reshape(vocab // 64, 4, 8, 2, rank).transpose(0, 2, 1, 3, 4)
          .reshape(vocab, rank))
