"""Counter-based Gumbel noise, shared by the reference walk and the kernels.

Sampling is Gumbel-max: ``x_k = argmax_v(logits_k[v] * inv_temperature + g[v])`` with
``g = -log(-log(u))``. The uniform ``u`` for (batch row, step, vocabulary index) comes from
a stateless integer hash of that counter and two seed words, so every implementation
(XLA on any backend, the Triton and Mosaic GPU kernels) draws the same noise without
sharing any random state, and any shard of the vocabulary can draw its own part.

Everything here is written with plain ``jax.lax`` ops — integer xor, shifts and wrapping
multiplies on ``uint32``, then IEEE float adds and multiplies — so the same functions
trace inside Pallas kernels and in XLA. XLA and the Triton kernels give the same bits; the
Mosaic GPU kernels differ from them by at most 2^-20 (its compiler contracts a different
set of multiply-adds: a few per cent of the values differ; where ``-log(u)`` is near 1 an
ulp of the inner log is many ulps of the small outer one), so a token can differ only
where two scores are within 2^-20, an ulp of a score of 8. The two logarithms are
``log_positive``, not ``jnp.log``: a backend's ``log`` may be an approximation whose error
near 1 is absolute, about 2^-23, and ``-log(u)`` for u near 1 is the small value that
makes a large, winning Gumbel value, so that error lands on exactly the scores that
decide a sampled step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# lowbias32 constants (C. Wellons, "hash prospector"): a bijective 32-bit mixer with
# very low bias, cheap on GPUs (2 multiplies, 3 xor-shifts).
MIX_MUL_1 = 0x21F0AAAD
MIX_MUL_2 = 0x735A2D97

# How far a Mosaic GPU kernel's noise may be from XLA's (the module docstring): 2^-20,
# absolute (docs/decisions.md, "Kernel choices measured on the H200").
KERNEL_NOISE_TOLERANCE = 2.0 ** -20

# Steps and rows are packed into one 32-bit counter: step in the low 16 bits.
MAX_ROWS = 1 << 16
MAX_STEPS = 1 << 16


def _u32(value) -> jax.Array:
  return jnp.asarray(value, dtype=jnp.uint32)


def mix32(x: jax.Array) -> jax.Array:
  """A bijection of uint32 with full avalanche (lowbias32)."""
  x = x ^ lax.shift_right_logical(x, _u32(16))
  x = x * _u32(MIX_MUL_1)
  x = x ^ lax.shift_right_logical(x, _u32(15))
  x = x * _u32(MIX_MUL_2)
  x = x ^ lax.shift_right_logical(x, _u32(15))
  return x


def seed_words(key: jax.Array) -> jax.Array:
  """Two uint32 seed words from a JAX PRNG key (new-style or raw uint32[2])."""
  if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)
  return jax.random.bits(key, (2,), jnp.uint32)


def stream_key(seed, row: jax.Array, step: jax.Array) -> jax.Array:
  """The per-(row, step) stream word. Distinct (row, step) give distinct streams.

  ``seed``: the two words, as a uint32[2] array or a pair of uint32 scalars.
  """
  counter = lax.shift_left(row.astype(jnp.uint32), _u32(16)) | step.astype(jnp.uint32)
  return mix32(mix32(counter ^ seed[0]) + seed[1])


def stream_bits(stream: jax.Array, vocab_index: jax.Array) -> jax.Array:
  """The 32 hash bits of (stream, vocabulary index) that a uniform is made from."""
  return mix32(mix32(vocab_index.astype(jnp.uint32) ^ stream) + stream)


def uniform_from_stream(stream: jax.Array, vocab_index: jax.Array) -> jax.Array:
  """u in (0, 1), never 0 or 1: (m + 0.5) * 2^-23 with m the top 23 bits of
  ``stream_bits`` (exact in fp32)."""
  bits = stream_bits(stream, vocab_index)
  mantissa = lax.shift_right_logical(bits, _u32(9)).astype(jnp.int32).astype(jnp.float32)
  return (mantissa + 0.5) * (1.0 / (1 << 23))


# log_positive: x = 2^k (1 + f) with 1 + f in [sqrt(1/2), sqrt(2)) (FreeBSD e_logf.c's
# reduction), then log(1 + f) = f - f^2 / 2 + f^3 P(f) with P a degree-7 polynomial fitted
# for relative error (5.8e-9 in float64): no divide (the GPU's divide left a warpgroup
# drawing noise latency-bound), under an ulp in float32 on every uniform and
# its exponential. ln 2 in two parts so k · ln2_hi is exact.
LN2_HI = 6.9313812256e-01
LN2_LO = 9.0580006145e-06
LOG1P_CUBIC_COEFFICIENTS = (0.3333333134651184, -0.2500081956386566, 0.20001226663589478,
                             -0.16623356938362122, 0.14201758801937103,
                             -0.13160184025764465, 0.1276157647371292,
                             -0.07634493708610535)
SQRT_HALF_BITS = 0x3F3504F3
ONE_BITS = 0x3F800000


def log_positive(x: jax.Array) -> jax.Array:
  """Natural log of positive normal fp32 ``x`` from integer and IEEE add/multiply ops
  only. Near x = 1 it keeps full relative precision (f = x - 1 exactly)."""
  bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  bits = bits + _u32(ONE_BITS - SQRT_HALF_BITS)
  k = lax.shift_right_logical(bits, _u32(23)).astype(jnp.int32) - 0x7F
  mantissa = (bits & _u32(0x007FFFFF)) + _u32(SQRT_HALF_BITS)
  f = lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0
  p = jnp.float32(LOG1P_CUBIC_COEFFICIENTS[-1])
  for coefficient in reversed(LOG1P_CUBIC_COEFFICIENTS[:-1]):
    p = p * f + coefficient
  f_squared = f * f
  rest = f_squared * f * p - 0.5 * f_squared
  dk = k.astype(jnp.float32)
  return dk * LN2_HI + (f + (rest + dk * LN2_LO))


def gumbel_from_uniform(u: jax.Array) -> jax.Array:
  return -log_positive(-log_positive(u))


def gumbel_noise(seed: jax.Array, rows: jax.Array, step: jax.Array,
                 vocab_index: jax.Array) -> jax.Array:
  """Gumbel noise for rows [B] at ``step`` over ``vocab_index`` [V] → [B, V] fp32."""
  stream = stream_key(seed, rows, step)
  return gumbel_from_uniform(uniform_from_stream(stream[:, None], vocab_index[None, :]))
