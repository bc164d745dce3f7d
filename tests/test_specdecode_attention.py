"""Cached attention: the split-K cache kernel (run in interpret mode here) and the XLA
oracle against a per-row numpy reference, on rows of different lengths, the new tokens
written into the cache first."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.specdecode import attention, cache_attention


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


def _written(cache, new, cache_len):
  put = jax.vmap(lambda c, n, at: jax.lax.dynamic_update_slice(c, n, (0, at, 0)))
  return put(cache, new, cache_len)


@pytest.mark.parametrize("steps,heads,kv_heads,causal",
                         [(1, 4, 2, True), (1, 8, 8, True), (5, 4, 2, True),
                          (8, 8, 2, True), (4, 4, 4, False), (7, 8, 2, False),
                          (3, 6, 2, True)])
def test_tokens_written_first_are_attended_over_the_cache_alone(steps, heads, kv_heads,
                                                                causal):
  batch, head_dim = 3, 16
  width = attention.padded_cache_len(40)
  q, new_k, new_v, cache_k, cache_v = _inputs(steps, batch, steps, heads, kv_heads,
                                              head_dim, width)
  # empty, partial, and the new tokens in the cache's last slots
  cache_len = jnp.array([0, 17, width - steps], jnp.int32)
  expected = _reference(q, new_k, new_v, cache_k, cache_v, cache_len, causal)
  written_k, written_v = _written(cache_k, new_k, cache_len), _written(cache_v, new_v,
                                                                       cache_len)
  for impl, interpret in (("xla", False), ("pallas", True)):
    out = attention.attend_written(q, written_k, written_v, cache_len, causal=causal,
                                   impl=impl, interpret=interpret)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5,
                               err_msg=impl)


def test_the_kernel_stops_each_step_at_its_own_length():
  """Steps whose lengths end inside, at the edge of, and across the kernel's key blocks
  and splits (T = 6, G = 2: neither a power of two nor 16 rows, so the kernel's blocks
  are padded), against the XLA reference and a numpy one; the keys and values past each
  row's longest length are huge, so one that leaked into a step would show."""
  batch, steps, heads, kv_heads, head_dim = 2, 6, 4, 2, 16
  width = cache_attention.padded_cache_len(300)
  keys = jax.random.split(jax.random.key(7), 3)
  q = jax.random.normal(keys[0], (batch, steps, heads, head_dim), jnp.float32)
  cache_k = jax.random.normal(keys[1], (batch, kv_heads, width, head_dim), jnp.float32)
  cache_v = jax.random.normal(keys[2], (batch, kv_heads, width, head_dim), jnp.float32)
  lengths = jnp.array([[1, 16, 17, 32, 33, 300], [127, 128, 129, 255, 256, 257]],
                      jnp.int32)
  past = jnp.arange(width)[None, None, :, None] >= lengths.max(axis=1)[:, None, None, None]
  cache_k = jnp.where(past, 1e4, cache_k)
  cache_v = jnp.where(past, 1e4, cache_v)
  qs, k, v = map(np.asarray, (q, cache_k, cache_v))
  expected = np.zeros(q.shape)
  for b, t, head in np.ndindex(batch, steps, heads):
    n, kv = int(lengths[b, t]), head // (heads // kv_heads)
    scores = k[b, kv, :n] @ qs[b, t, head] * 0.25
    weights = np.exp(scores - scores.max())
    expected[b, t, head] = weights @ v[b, kv, :n] / weights.sum()
  xla = cache_attention.reference(q, cache_k, cache_v, lengths, 0.25)
  np.testing.assert_allclose(np.asarray(xla), expected, atol=2e-5, rtol=2e-5)
  small_blocks = cache_attention.Launch(block_k=16, num_warps=2, num_stages=3)
  for splits, launch_as in ((None, None), (1, None), (2, None), (2, small_blocks)):
    out = cache_attention.split_k(q, cache_k, cache_v, lengths, 0.25, splits=splits,
                                  launch_as=launch_as, interpret=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5,
                               err_msg=f"splits={splits}, launch_as={launch_as}")


def test_many_splits_are_merged_in_slices_of_the_head_dimension():
  """Sixteen splits of eight steps of four heads at a head size of 128: too many
  partials for one merge program, so each merges a slice of the head dimension; the
  slices together give the reference's attention, steps ending in different splits."""
  steps, heads, head_dim, splits = 8, 4, 128, 16
  assert cache_attention._merge_slice(splits, steps * heads, head_dim) < head_dim
  width = cache_attention.padded_cache_len(300)
  keys = jax.random.split(jax.random.key(11), 3)
  q = jax.random.normal(keys[0], (1, steps, heads, head_dim), jnp.float32)
  cache_k = jax.random.normal(keys[1], (1, 1, width, head_dim), jnp.float32)
  cache_v = jax.random.normal(keys[2], (1, 1, width, head_dim), jnp.float32)
  lengths = jnp.array([[3, 31, 32, 33, 100, 255, 256, 300]], jnp.int32)
  out = cache_attention.split_k(q, cache_k, cache_v, lengths, 0.1, splits=splits,
                                interpret=True)
  expected = cache_attention.reference(q, cache_k, cache_v, lengths, 0.1)
  np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=2e-5, rtol=2e-5)


def test_without_a_cache_only_the_new_tokens_are_attended():
  q, new_k, new_v, _, _ = _inputs(0, 2, 6, 4, 2, 16, 16)
  out = attention.attend(q, new_k, new_v, causal=True)
  zeros = jnp.zeros((2, 2, 0, 16))
  expected = _reference(q, new_k, new_v, zeros, zeros, [0, 0], True)
  np.testing.assert_allclose(np.asarray(out), expected, atol=2e-5, rtol=2e-5)


def test_a_cache_the_kernel_cannot_split_is_refused_by_size():
  q, _, _, cache_k, cache_v = _inputs(0, 1, 1, 2, 2, 16, 100)
  with pytest.raises(ValueError, match="100 positions"):
    cache_attention.split_k(q, cache_k, cache_v, jnp.array([[5]]), 0.25, interpret=True)
  assert attention.padded_cache_len(100) == 256 and attention.padded_cache_len(256) == 256


def test_a_split_count_the_kernel_cannot_use_is_refused():
  q, _, _, cache_k, cache_v = _inputs(0, 1, 1, 2, 2, 16, 256)
  with pytest.raises(ValueError, match="splits=3 must be a power of two <= 16"):
    cache_attention.split_k(q, cache_k, cache_v, jnp.array([[5]]), 0.25, splits=3,
                            interpret=True)


def test_a_key_block_that_does_not_divide_a_split_is_refused():
  q, _, _, cache_k, cache_v = _inputs(0, 1, 1, 2, 2, 16, 256)
  with pytest.raises(ValueError, match=r"launch_as.block_k=64 .* dividing the split's 32 keys"):
    cache_attention.split_k(q, cache_k, cache_v, jnp.array([[5]]), 0.25, splits=8,
                            launch_as=cache_attention.Launch(64), interpret=True)


def test_lengths_of_the_wrong_shape_are_refused():
  q, _, _, cache_k, cache_v = _inputs(0, 1, 1, 2, 2, 16, 256)
  with pytest.raises(ValueError, match=r"lengths \(1, 3\) must be \[batch, steps\]"):
    cache_attention.split_k(q, cache_k, cache_v, jnp.array([[5, 5, 5]]), 0.25,
                            interpret=True)


def test_unknown_impl_is_named():
  with pytest.raises(ValueError, match="attention_impl='flash'"):
    attention.resolve("flash")


def test_a_batch_that_fills_the_gpu_unsplit_gives_the_same_attention():
  """From 128 (row, kv head) pairs the kernel does not split the keys (one program a
  pair) and writes the attention itself: no merge kernel; below, it splits them."""
  batch, kv_heads, steps, head_dim = 16, 8, 4, 16
  assert cache_attention.num_splits(batch, kv_heads) == 1
  assert [cache_attention.num_splits(b, kv_heads) for b in (1, 4, 8, 15)] == [8, 4, 2, 2]
  keys = jax.random.split(jax.random.key(3), 4)
  q = jax.random.normal(keys[0], (batch, steps, kv_heads, head_dim), jnp.float32)
  cache_k, cache_v = (jax.random.normal(k, (batch, kv_heads, 256, head_dim), jnp.float32)
                      for k in keys[1:3])
  cache_len = jax.random.randint(keys[3], (batch,), 0, 252)
  lengths = cache_attention.causal_lengths(cache_len, steps, causal=True)
  run = functools.partial(cache_attention.split_k, interpret=True)

  def kernels(**split):
    jaxpr = jax.make_jaxpr(functools.partial(run, scale=0.25, **split))(
        q, cache_k, cache_v, lengths)
    return [e.params["name"] for e in jaxpr.eqns if e.primitive.name == "pallas_call"]

  assert kernels() == [cache_attention.KERNEL_NAME]
  assert kernels(splits=2) == [cache_attention.KERNEL_NAME,
                               cache_attention.MERGE_KERNEL_NAME]
  out = run(q, cache_k, cache_v, lengths, 0.25)
  expected = cache_attention.reference(q, cache_k, cache_v, lengths, 0.25)
  np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=2e-5, rtol=2e-5)


def test_the_attention_benchmark_compares_variants_that_agree(tmp_path, capsys):
  """``tools/attention_bench.py`` in interpret mode at a tiny shape: the cache kernel, JAX's
  shipped kernel with the new tokens merged in, and XLA give one attention; the fused
  kernel gives its XLA reference's."""
  import json
  import sys
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import attention_bench
  out = tmp_path / "attention.json"
  assert attention_bench.main(["--batches", "2", "--steps", "1,4", "--context", "40",
                               "--shape", "4,2,16", "--calls", "1", "--splits", "1,4",
                               "--launches", "16x2x3,64x4x2",
                               "--interpret", "--out", str(out)]) == 0
  results = json.loads(out.read_text())["results"]
  assert {(r["variant"], r["new_tokens"]) for r in results} == {
      (f"{kernel}{how}", t)
      for kernel in ("cache_kernel", "fused_kernel")
      for how in ("", "_splits_1", "_splits_4", "_k16_w2_s3", "_k64_w4_s2")
      for t in (1, 4)} | {(v, t) for v in ("shipped_kernel", "xla", "fused_reference")
                         for t in (1, 4)}
  # 64-key blocks do not divide this cache's 32-key splits: skipped, named why.
  assert all("skipped" in r for r in results if r["variant"].endswith("_k64_w4_s2"))
  timed = [r for r in results if "skipped" not in r]
  assert len(timed) == 22 and max(r["max_abs_diff_vs_xla"] for r in timed) < 2e-2, results
  assert attention_bench.main(["--launches", "64x4", "--out", str(out)]) == 2
  assert "error: --launches '64x4'" in capsys.readouterr().err
  assert attention_bench.main(["--batches", "two", "--out", str(out)]) == 2
  assert "error: --batches 'two'" in capsys.readouterr().err
  assert attention_bench.main(["--splits", "3", "--out", str(out)]) == 2
  assert "error: --splits '3'" in capsys.readouterr().err
