"""Cached attention: the decode kernel's path (JAX's Pallas GPU decode attention, run in
interpret mode here) against the XLA oracle, on rows of different lengths."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.specdecode import attention


def _inputs(seed, batch, steps, heads, kv_heads, head_dim, width):
  keys = jax.random.split(jax.random.key(seed), 5)
  q = jax.random.normal(keys[0], (batch, steps, heads, head_dim), jnp.float32)
  new_k = jax.random.normal(keys[1], (batch, kv_heads, steps, head_dim), jnp.float32)
  new_v = jax.random.normal(keys[2], (batch, kv_heads, steps, head_dim), jnp.float32)
  cache_k = jax.random.normal(keys[3], (batch, kv_heads, width, head_dim), jnp.float32)
  cache_v = jax.random.normal(keys[4], (batch, kv_heads, width, head_dim), jnp.float32)
  return q, new_k, new_v, cache_k, cache_v


def _reference(q, new_k, new_v, cache_k, cache_v, cache_len, causal):
  """Per row and head, numpy: softmax over the visible cache keys then the new keys."""
  q, new_k, new_v, cache_k, cache_v = map(np.asarray, (q, new_k, new_v, cache_k, cache_v))
  batch, steps, heads, head_dim = q.shape
  group = heads // new_k.shape[1]
  out = np.zeros((batch, steps, heads, head_dim))
  for b in range(batch):
    n = int(cache_len[b])
    for t in range(steps):
      for hd in range(heads):
        kv = hd // group
        visible = t + 1 if causal else steps
        keys = np.concatenate([cache_k[b, kv, :n], new_k[b, kv, :visible]])
        values = np.concatenate([cache_v[b, kv, :n], new_v[b, kv, :visible]])
        scores = keys @ q[b, t, hd] / np.sqrt(head_dim)
        weights = np.exp(scores - scores.max())
        out[b, t, hd] = weights @ values / weights.sum()
  return out.reshape(batch, steps, heads * head_dim)


@pytest.mark.parametrize("steps,heads,kv_heads,causal",
                         [(1, 4, 2, True), (5, 4, 2, True), (8, 8, 2, True),
                          (4, 4, 4, False)])
def test_xla_and_the_decode_kernel_match_a_per_row_reference(steps, heads, kv_heads, causal):
  batch, head_dim = 3, 16
  width = attention.padded_cache_len(40)
  q, new_k, new_v, cache_k, cache_v = _inputs(steps, batch, steps, heads, kv_heads,
                                              head_dim, width)
  cache_len = jnp.array([0, 17, width - steps], jnp.int32)   # empty, partial, nearly full
  expected = _reference(q, new_k, new_v, cache_k, cache_v, cache_len, causal)
  xla = attention.attend(q, new_k, new_v, causal=causal, cache_keys=cache_k,
                         cache_values=cache_v, cache_len=cache_len, impl="xla")
  np.testing.assert_allclose(np.asarray(xla), expected, atol=2e-5, rtol=2e-5)

  grouped = attention._grouped(q, kv_heads)
  rows = grouped.shape[2]
  new_scores = jnp.where(attention._new_token_mask(steps, causal, rows)[None, None],
                         attention._scores(grouped, new_k, head_dim ** -0.5), -jnp.inf)
  merged = attention._pallas_merged(grouped, new_scores, new_v, cache_k, cache_v,
                                    cache_len, head_dim ** -0.5, interpret=True)
  kernel = attention._ungrouped(merged, steps)
  np.testing.assert_allclose(np.asarray(kernel), expected, atol=2e-5, rtol=2e-5)


def test_without_a_cache_only_the_new_tokens_are_attended():
  q, new_k, new_v, _, _ = _inputs(0, 2, 6, 4, 2, 16, 16)
  out = attention.attend(q, new_k, new_v, causal=True)
  zeros = jnp.zeros((2, 2, 0, 16))
  expected = _reference(q, new_k, new_v, zeros, zeros, [0, 0], True)
  np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5)


def test_a_cache_the_kernel_cannot_split_is_refused_by_size():
  q, new_k, new_v, cache_k, cache_v = _inputs(0, 1, 1, 2, 2, 16, 100)
  grouped = attention._grouped(q, 2)
  with pytest.raises(ValueError, match="100 positions"):
    attention.cache_part(grouped, cache_k, cache_v, jnp.array([5]), 0.25, interpret=True)
  assert attention.padded_cache_len(100) == 256 and attention.padded_cache_len(256) == 256


def test_unknown_impl_is_named():
  with pytest.raises(ValueError, match="attention_impl='flash'"):
    attention.resolve("flash")


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (8, 8)])
def test_a_token_written_first_is_attended_over_the_cache_alone(heads, kv_heads):
  batch, head_dim = 3, 16
  width = attention.padded_cache_len(40)
  q, new_k, new_v, cache_k, cache_v = _inputs(heads, batch, 1, heads, kv_heads, head_dim,
                                              width)
  cache_len = jnp.array([0, 17, width - 1], jnp.int32)   # empty, partial, to the last slot
  expected = _reference(q, new_k, new_v, cache_k, cache_v, cache_len, True)
  put = jax.vmap(lambda c, n, at: jax.lax.dynamic_update_slice(c, n, (0, at, 0)))
  written_k, written_v = put(cache_k, new_k, cache_len), put(cache_v, new_v, cache_len)
  for impl, interpret in (("xla", False), ("pallas", True)):
    out = attention.attend_written(q, written_k, written_v, cache_len, impl=impl,
                                   interpret=interpret)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5,
                               err_msg=impl)
  with pytest.raises(ValueError, match="one new token per row, not 2"):
    attention.attend_written(jnp.concatenate([q, q], axis=1), written_k, written_v,
                             cache_len)
