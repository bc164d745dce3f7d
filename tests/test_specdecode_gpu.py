"""The decode loop on the GPU: run with ``WTS_GPU_TESTS=1 python -m pytest -m gpu``.

The persistent walk kernel inside the jitted while_loop: greedy output equals the
target's greedy decoding with every walk, and one iteration at the Qwen3-4B shapes
runs with each walk (a smoke run of the benchmark's path).
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.specdecode import attention
from wts_jax.specdecode.dspark import DSparkConfig, make_dspark
from wts_jax.specdecode.loop import generate
from wts_jax.specdecode.qwen3 import Qwen3Config, make_qwen3
from wts_jax.specdecode.timing import iteration_cost

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("WTS_GPU_TESTS") or jax.default_backend() != "gpu",
                       reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1"),
]


def test_every_walk_gives_the_same_greedy_output():
  target_config = Qwen3Config.tiny(vocab_size=512, num_layers=3)
  target = make_qwen3(target_config, seed=1, param_dtype=jnp.float32, dtype=jnp.float32)
  drafter = make_dspark(DSparkConfig.tiny(target_config, block_size=7, rank=64),
                        seed=2, param_dtype=jnp.bfloat16, dtype=jnp.float32)
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12]]
  outputs = {walk: generate(target, drafter, prompts, 24, draft_len=7, walk_impl=walk).rows()
             for walk in ("pallas", "xla", "none")}
  assert outputs["pallas"] == outputs["xla"] == outputs["none"]


def test_one_iteration_at_the_qwen3_4b_shapes():
  target = make_qwen3(Qwen3Config.qwen3_4b())
  drafter = make_dspark(DSparkConfig.qwen3_4b())
  cost = iteration_cost(target, drafter, batch=4, draft_len=7, prompt_len=128,
                        walk_impl="pallas", repeats=2, chain=2, pieces=("total",))
  assert cost["total_s"] > 0, cost


def test_the_cache_kernel_matches_xla_attention_at_the_qwen3_4b_shapes():
  """Rows at different lengths, k + 1 = 8, 6 (a padded block) and 1 new tokens written
  first (causal) and the drafter's block (all visible), 32 query heads over 8 kv heads,
  the kernel's own split count (merged by the second kernel) and one split."""
  batch, heads, kv_heads, head_dim = 4, 32, 8, 128
  width = attention.padded_cache_len(700)
  keys = jax.random.split(jax.random.key(0), 3)
  cache_k, cache_v = (jax.random.normal(k, (batch, kv_heads, width, head_dim), jnp.bfloat16)
                      for k in keys[1:])
  for steps in (8, 6, 1):
    q = jax.random.normal(jax.random.fold_in(keys[0], steps),
                          (batch, steps, heads, head_dim), jnp.bfloat16)
    cache_len = jnp.array([0, 100, 511, width - steps], jnp.int32)
    for causal in (True, False):
      want = np.asarray(jax.jit(lambda *a: attention.attend_written(
          *a, causal=causal, impl="xla"))(q, cache_k, cache_v, cache_len), np.float32)
      for splits in (None, 1):
        got = np.asarray(jax.jit(lambda *a, splits=splits: attention.attend_written(
            *a, causal=causal, impl="pallas", splits=splits))(q, cache_k, cache_v,
                                                              cache_len), np.float32)
        np.testing.assert_allclose(got, want, atol=3e-2, rtol=3e-2,
                                   err_msg=f"steps={steps} causal={causal} splits={splits}")


def test_the_loop_with_the_cache_kernel_gives_the_xla_loops_tokens():
  target_config = Qwen3Config.tiny(vocab_size=512, num_layers=3)
  target = make_qwen3(target_config, seed=1, param_dtype=jnp.float32, dtype=jnp.float32)
  drafter = make_dspark(DSparkConfig.tiny(target_config, block_size=7, rank=64),
                        seed=2, param_dtype=jnp.bfloat16, dtype=jnp.float32)
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12]]
  rows = {impl: generate(target, drafter, prompts, 24, draft_len=7, attention_impl=impl,
                         iterations_per_check=3).rows()
          for impl in ("pallas", "xla")}
  assert rows["pallas"] == rows["xla"]


def test_the_gpu_loop_equals_the_targets_own_greedy_decode_in_bf16():
  """Lossless on the device path a user gets by default: bf16 compute, the decode
  attention kernel, the persistent walk, the drafter's W2 as int8 planes."""
  from wts_jax.specdecode.autoregressive import decode_autoregressive
  target_config = Qwen3Config.tiny(vocab_size=512, num_layers=3)
  target = make_qwen3(target_config, seed=3)
  drafter = make_dspark(DSparkConfig.tiny(target_config, block_size=7, rank=64), seed=4)
  prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12], [13]]
  new_tokens = 32
  spec = generate(target, drafter, prompts, new_tokens, draft_len=7).rows()
  plain = np.asarray(decode_autoregressive(target, prompts, new_tokens)).tolist()
  assert spec == plain


def test_the_fused_qkv_attention_kernel_equals_its_xla_composition_on_the_gpu():
  """``qkv_attention.fused`` compiled for the device (Qwen3-4B heads, bf16) against the
  XLA composition: attention, and the caches written in place."""
  from wts_jax.specdecode import numerics, qkv_attention
  batch, steps, heads, kv_heads, head_dim = 4, 8, 32, 8, 128
  width = attention.padded_cache_len(700)
  keys = jax.random.split(jax.random.key(7), 5)
  qkv = jax.random.normal(keys[0], (batch, steps, (heads + 2 * kv_heads) * head_dim),
                          jnp.bfloat16)
  cache_k, cache_v = (jax.random.normal(k, (batch, kv_heads, width, head_dim), jnp.bfloat16)
                      for k in keys[1:3])
  q_norm, k_norm = (1 + 0.1 * jax.random.normal(k, (head_dim,), jnp.bfloat16)
                    for k in keys[3:5])
  for start in ([0, 100, 511, width - steps], [1, 255, 256, 600]):
    start = jnp.array(start, jnp.int32)
    cos, sin = numerics.rotation_tables(start[:, None] + jnp.arange(steps)[None],
                                             head_dim, 1e6)
    args = (qkv, cos, sin, q_norm, k_norm, cache_k, cache_v, start)
    want = jax.jit(functools.partial(qkv_attention.reference, num_heads=heads, eps=1e-6,
                                     causal=True))(*args)
    for splits in (None, 1):
      got = jax.jit(functools.partial(qkv_attention.fused, num_heads=heads, eps=1e-6,
                                      causal=True, splits=splits))(*args)
      np.testing.assert_allclose(np.asarray(got[0], np.float32),
                                 np.asarray(want[0], np.float32), atol=3e-2, rtol=3e-2)
      np.testing.assert_array_equal(np.asarray(got[2]), np.asarray(want[2]))
      np.testing.assert_allclose(np.asarray(got[1], np.float32),
                                 np.asarray(want[1], np.float32), atol=2e-2, rtol=2e-2)
