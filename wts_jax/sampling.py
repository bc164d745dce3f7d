"""Counter-based Gumbel noise, shared bit for bit by the reference walk and the kernels.

Sampling is Gumbel-max: ``x_k = argmax_v(logits_k[v] * inv_temperature + g[v])`` with
``g = -log(-log(u))``. The uniform ``u`` for (batch row, step, vocabulary index) comes from
a stateless integer hash of that counter and two seed words, so every implementation
(XLA on any backend, the Triton and Mosaic GPU kernels) draws the same noise without
sharing any random state, and any shard of the vocabulary can draw its own part.

Everything here is written with plain ``jax.lax`` integer ops on ``uint32`` values
(xor, logical shifts, wrapping multiplies) so the same functions trace inside Pallas
kernels and in XLA. The only floating-point steps are an exact int→float conversion and
two ``log`` calls; backends may differ in the last ulp of ``log``, which can flip a token
only on a near-tie of the noisy scores.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# lowbias32 constants (C. Wellons, "hash prospector"): a bijective 32-bit mixer with
# very low bias, cheap on GPUs (2 multiplies, 3 xor-shifts).
_MIX_MUL_1 = 0x21F0AAAD
_MIX_MUL_2 = 0x735A2D97

# Steps and rows are packed into one 32-bit counter: step in the low 16 bits.
MAX_ROWS = 1 << 16
MAX_STEPS = 1 << 16


def _u32(value) -> jax.Array:
  return jnp.asarray(value, dtype=jnp.uint32)


def mix32(x: jax.Array) -> jax.Array:
  """A bijection of uint32 with full avalanche (lowbias32)."""
  x = x ^ lax.shift_right_logical(x, _u32(16))
  x = x * _u32(_MIX_MUL_1)
  x = x ^ lax.shift_right_logical(x, _u32(15))
  x = x * _u32(_MIX_MUL_2)
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


def uniform_from_stream(stream: jax.Array, vocab_index: jax.Array) -> jax.Array:
  """u in (0, 1), never 0 or 1: (m + 0.5) * 2^-23 with m a 23-bit hash (exact in fp32)."""
  bits = mix32(mix32(vocab_index.astype(jnp.uint32) ^ stream) + stream)
  mantissa = lax.shift_right_logical(bits, _u32(9)).astype(jnp.int32).astype(jnp.float32)
  return (mantissa + 0.5) * (1.0 / (1 << 23))


def gumbel_from_uniform(u: jax.Array) -> jax.Array:
  return -jnp.log(-jnp.log(u))


def gumbel_noise(seed: jax.Array, rows: jax.Array, step: jax.Array,
                 vocab_index: jax.Array) -> jax.Array:
  """Gumbel noise for rows [B] at ``step`` over ``vocab_index`` [V] → [B, V] fp32."""
  stream = stream_key(seed, rows, step)
  return gumbel_from_uniform(uniform_from_stream(stream[:, None], vocab_index[None, :]))
