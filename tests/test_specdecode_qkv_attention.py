"""The layer's attention from its q/k/v product in one kernel (``qkv_attention.fused``, in
Pallas interpret mode here) against its XLA composition (``qkv_attention.reference``: the
heads normed and rotated, the cache written, then the XLA attention), and a Qwen3
forward through it against the unfused forward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.specdecode import cache_attention, numerics, qkv_attention
from wts_jax.specdecode.qwen3 import Qwen3Config, make_qwen3

SMALL_BLOCKS = cache_attention.Launch(block_k=16, num_warps=2, num_stages=3)


def _inputs(seed, batch, steps, heads, kv_heads, head_dim, dtype, *, starts=None):
  keys = jax.random.split(jax.random.key(seed), 6)
  width = cache_attention.padded_cache_len(300)
  qkv = jax.random.normal(keys[0], (batch, steps, (heads + 2 * kv_heads) * head_dim),
                          jnp.float32).astype(dtype)
  cache_k, cache_v = (jax.random.normal(k, (batch, kv_heads, width, head_dim), jnp.float32
                                        ).astype(dtype) for k in keys[1:3])
  start = (jax.random.randint(keys[3], (batch,), 0, width - steps) if starts is None
           else jnp.asarray(starts, jnp.int32))
  q_norm, k_norm = ((1 + 0.1 * jax.random.normal(k, (head_dim,))).astype(dtype)
                    for k in keys[4:6])
  positions = start[:, None] + jnp.arange(steps)[None]
  cos, sin = numerics.rotation_tables(positions, head_dim, 10_000.0)
  return qkv, cos, sin, q_norm, k_norm, cache_k, cache_v, start


@pytest.fixture
def interpreted(monkeypatch):
  """The kernel path of the models' forwards with the fused kernel interpreted."""
  monkeypatch.setattr(qkv_attention, "fused",
                      functools.partial(qkv_attention.fused, interpret=True,
                                        launch_as=SMALL_BLOCKS))


def _assert_caches_close(got, want):
  for a, b in zip(got.keys + got.values, want.keys + want.values):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps,causal,splits", [(8, True, 1), (8, True, 4), (1, True, 2),
                                                 (5, False, 2), (7, False, 1)])
def test_fused_equals_the_xla_composition_in_fp32(steps, causal, splits):
  # rows from an empty context to one whose new tokens end the cache, each split's
  # boundary among them
  width = cache_attention.padded_cache_len(300)
  args = _inputs(steps, 4, steps, 8, 2, 32, jnp.float32,
                 starts=[0, 37, width // max(splits, 2) - 3, width - steps])
  want = qkv_attention.reference(*args, num_heads=8, eps=1e-6, causal=causal)
  got = qkv_attention.fused(*args, num_heads=8, eps=1e-6, causal=causal, splits=splits,
                            launch_as=SMALL_BLOCKS, interpret=True)
  for name, a, b in zip(("attention", "keys", "values"), want, got):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5, rtol=2e-5,
                               err_msg=name)


def test_fused_in_bf16_writes_the_caches_the_composition_writes():
  args = _inputs(1, 3, 8, 4, 2, 16, jnp.bfloat16)
  want = qkv_attention.reference(*args, num_heads=4, eps=1e-6, causal=True)
  got = qkv_attention.fused(*args, num_heads=4, eps=1e-6, causal=True, splits=2,
                            launch_as=SMALL_BLOCKS, interpret=True)
  np.testing.assert_allclose(np.asarray(got[0], np.float32), np.asarray(want[0], np.float32),
                             atol=2e-2, rtol=2e-2)
  # the values are copied as they are; a key may round apart by one bf16 step
  np.testing.assert_array_equal(np.asarray(got[2]), np.asarray(want[2]))
  np.testing.assert_allclose(np.asarray(got[1], np.float32), np.asarray(want[1], np.float32),
                             atol=1e-2, rtol=1e-2)


def test_fused_refuses_what_it_cannot_serve():
  qkv, cos, sin, q_norm, k_norm, cache_k, cache_v, start = _inputs(0, 1, 2, 4, 2, 16,
                                                                   jnp.float32)
  run = functools.partial(qkv_attention.fused, eps=1e-6, causal=True, interpret=True)
  with pytest.raises(ValueError, match="q/k/v product's width"):
    run(qkv, cos, sin, q_norm, k_norm, cache_k, cache_v, start, num_heads=6)
  with pytest.raises(ValueError, match="splits=3"):
    run(qkv, cos, sin, q_norm, k_norm, cache_k, cache_v, start, num_heads=4, splits=3)
  assert not qkv_attention.supported(6, 2, 16)      # a group of three
  assert qkv_attention.supported(32, 8, 128)


def test_a_forward_through_the_fused_kernel_equals_the_unfused_forward(interpreted):
  """Qwen3's forward on the GPU path (the fused kernel, interpreted) against its XLA
  path: logits and the written caches, a verify-sized forward over a cache."""
  config = Qwen3Config.tiny(vocab_size=64, num_layers=2)
  model = make_qwen3(config, seed=5, param_dtype=jnp.float32, dtype=jnp.float32)
  batch, steps = 2, 4
  cache = model.empty_cache(batch, 64)
  prompt = jax.random.randint(jax.random.key(1), (batch, 9), 0, 64)
  cache = model.forward(prompt, jnp.zeros(batch, jnp.int32), cache).cache
  tokens = jax.random.randint(jax.random.key(2), (batch, steps), 0, 64)
  start = jnp.array([9, 5], jnp.int32)
  want = model.forward(tokens, start, cache, attention_impl="xla")
  got = model.forward(tokens, start, cache, attention_impl="pallas")
  np.testing.assert_allclose(np.asarray(got.logits), np.asarray(want.logits), atol=1e-4,
                             rtol=1e-4)
  np.testing.assert_allclose(np.asarray(got.keys), np.asarray(want.keys), atol=1e-5)
  _assert_caches_close(got.cache, want.cache)


def test_fused_from_a_query_and_a_key_value_product_equals_the_composition():
  """The drafter's block: queries and keys/values from two products, all visible."""
  qkv, cos, sin, q_norm, k_norm, cache_k, cache_v, start = _inputs(3, 3, 7, 8, 2, 32,
                                                                   jnp.float32)
  products = (qkv[..., :8 * 32], qkv[..., 8 * 32:])
  want = qkv_attention.reference(qkv, cos, sin, q_norm, k_norm, cache_k, cache_v, start,
                                 num_heads=8, eps=1e-6, causal=False)
  got = qkv_attention.fused(products, cos, sin, q_norm, k_norm, cache_k, cache_v, start,
                            num_heads=8, eps=1e-6, causal=False, splits=2,
                            launch_as=SMALL_BLOCKS, interpret=True)
  for name, a, b in zip(("attention", "keys", "values"), want, got):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=2e-5, rtol=2e-5,
                               err_msg=name)
  with pytest.raises(ValueError, match="key/value product's width"):
    qkv_attention.fused((products[0], products[1][..., :-32]), cos, sin, q_norm, k_norm,
                        cache_k, cache_v, start, num_heads=8, eps=1e-6, causal=False,
                        interpret=True)


def test_a_drafter_block_through_the_fused_kernel_equals_the_unfused_block(interpreted):
  from wts_jax.specdecode.dspark import DSparkConfig, make_dspark
  target_config = Qwen3Config.tiny(vocab_size=64, num_layers=2)
  drafter = make_dspark(DSparkConfig.tiny(target_config, block_size=5, rank=16), seed=3,
                        param_dtype=jnp.float32, dtype=jnp.float32)
  batch = 2
  context = drafter.empty_cache(batch, 40)
  cfg = drafter.config
  features = jax.random.normal(
      jax.random.key(4), (batch, 9, len(cfg.target_layer_ids) * cfg.layers.hidden_size))
  start = jnp.zeros(batch, jnp.int32)
  context = context.write(*drafter.context_kv(features, start), start)
  last = jnp.array([3, 7], jnp.int32)
  at = jnp.array([9, 6], jnp.int32)
  want = drafter.block(last, at, context, attention_impl="xla")
  got = drafter.block(last, at, context, attention_impl="pallas")
  np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=1e-4, rtol=1e-4)
  _assert_caches_close(got[2], want[2])
