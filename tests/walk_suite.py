"""One walk test suite, run against every implementation (tokamax's test_base pattern).

A subclass sets ``IMPL`` / ``config()`` and the case lists; ``test_walk_xla.py`` runs it
on the reference, ``test_walk_pallas_interpret.py`` on the kernel's own code in Pallas
interpret mode, ``test_walk_gpu.py`` on the H200.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import numpy_oracle
import wts_jax
from wts_jax import sampling
from wts_jax.inputs import random_inputs
from wts_jax.output import STATUS_NO_FINITE_LOGIT
from wts_jax.peers import deepspec_torch
from wts_jax.shapes import SHAPES


class WalkSuite:
  IMPL = "xla"
  HEAD_TYPES = ("vanilla", "gated", "rnn")
  BATCHES = (1, 3, 8)
  STEPS = (1, 2, 7)
  SHAPE_NAMES = ("small_v1000",)
  RESIDENCIES = ("auto",)
  RESIDENCY_SPLITS = ()    # extra residency settings, checked on one case each
  LOGIT_ATOL = 2e-4        # fp32 accumulation order differs between implementations
  SEED = 0

  def config(self, residency="auto"):
    """The config ``run`` walks with: None (the implementation's own choice) but for a
    residency setting (the Triton kernel's)."""
    if self.IMPL == "xla" or residency == "auto":
      return None
    return wts_jax.TritonConfig(residency=residency)

  def run(self, head, *args, residency="auto", **kwargs):
    return wts_jax.walk(head, *args, impl=self.IMPL, config=self.config(residency),
                        **kwargs)

  def make_case(self, shape_name, head_type, batch, steps, seed=None):
    seed = self.SEED if seed is None else seed
    config = SHAPES[shape_name].head_config(head_type)
    head = wts_jax.make_head(config, seed=seed)
    inputs = random_inputs(config, batch, steps, jax.random.key(seed + 1))
    return head, inputs

  # --- greedy against both oracles -------------------------------------------------
  def test_greedy_matches_oracles(self, shape_name, head_type, batch, steps, residency):
    head, (base, first, hidden) = self.make_case(shape_name, head_type, batch, steps)
    out = self.run(head, base, first, hidden, residency=residency, return_logits=True,
                   return_logprobs=True)
    assert out.tokens.shape == (batch, steps) and out.tokens.dtype == jnp.int32

    tokens64, conf64, logits64 = numpy_oracle.walk(head, base, first, hidden,
                                                   return_all=True)
    np.testing.assert_array_equal(np.asarray(out.tokens), tokens64)
    np.testing.assert_allclose(np.asarray(out.logits), logits64, atol=self.LOGIT_ATOL,
                               rtol=0)
    np.testing.assert_allclose(np.asarray(out.confidence), conf64, atol=1e-4, rtol=1e-4)
    expected_logprobs = np.take_along_axis(
        logits64 - _logsumexp(logits64)[..., None], tokens64[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs), expected_logprobs, atol=1e-4)

    torch_head = deepspec_torch.from_wts_head(head)
    t_tokens, t_conf, _ = deepspec_torch.sample_block_tokens(
        torch_head, _torch(base), torch.from_numpy(np.array(first)),
        None if hidden is None else _torch(hidden))
    np.testing.assert_array_equal(np.asarray(out.tokens), t_tokens.numpy())
    np.testing.assert_allclose(np.asarray(out.confidence), t_conf.numpy(), atol=1e-4)

  def test_residency_splits(self, head_type):
    """Each residency split gives the reference's tokens and logits."""
    if not self.RESIDENCY_SPLITS:
      pytest.skip(f"{self.IMPL} has no residency settings")
    head, (base, first, hidden) = self.make_case("small_v517", head_type, 3, 7)
    ref = wts_jax.walk(head, base, first, hidden, impl="xla", return_logits=True)
    for residency in self.RESIDENCY_SPLITS:
      out = self.run(head, base, first, hidden, residency=residency, return_logits=True)
      np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens),
                                    err_msg=f"residency={residency!r}")
      np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref.logits),
                                 atol=self.LOGIT_ATOL, err_msg=f"residency={residency!r}")

  # --- sampling ---------------------------------------------------------------------
  def test_sampled_matches_oracles(self, head_type, residency):
    batch, steps, temperature = 3, 7, 0.8
    head, (base, first, hidden) = self.make_case("small_v1000", head_type, batch, steps)
    key = jax.random.key(42)
    out = self.run(head, base, first, hidden, residency=residency,
                   temperature=temperature, key=key, return_logprobs=True)
    vocab = head.config.vocab_size
    noise = deepspec_torch.gumbel_noise_torch(sampling.seed_words(key), batch, steps, vocab)
    tokens64 = numpy_oracle.walk(head, base, first, hidden, temperature=temperature,
                                 gumbel=noise.numpy().astype(np.float64))
    np.testing.assert_array_equal(np.asarray(out.tokens), tokens64)
    torch_head = deepspec_torch.from_wts_head(head)
    t_tokens, _, t_logits = deepspec_torch.sample_block_tokens(
        torch_head, _torch(base), torch.from_numpy(np.array(first)),
        None if hidden is None else _torch(hidden), temperature=temperature,
        gumbel=noise)
    np.testing.assert_array_equal(np.asarray(out.tokens), t_tokens.numpy())
    scaled = t_logits.numpy().astype(np.float64) / np.float32(temperature)
    expected = np.take_along_axis(scaled - _logsumexp(scaled)[..., None],
                                  t_tokens.numpy()[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(out.logprobs), expected, atol=2e-4)

  def test_same_key_same_tokens_other_key_differs(self, head_type):
    head, (base, first, hidden) = self.make_case("small_v1000", head_type, 4, 7)
    run = lambda key: np.asarray(self.run(head, base, first, hidden, temperature=1.5,
                                          key=key).tokens)
    first_run = run(jax.random.key(7))
    np.testing.assert_array_equal(first_run, run(jax.random.key(7)))
    assert (first_run != run(jax.random.key(8))).mean() > 0.5

  def test_per_row_temperature_zero_rows_are_greedy(self):
    head, (base, first, hidden) = self.make_case("small_v1000", "vanilla", 4, 7)
    temps = jnp.array([0.0, 1.0, 0.0, 2.0], jnp.float32)
    sampled = np.asarray(self.run(head, base, first, hidden, temperature=temps,
                                  key=jax.random.key(3)).tokens)
    greedy = np.asarray(self.run(head, base, first, hidden).tokens)
    np.testing.assert_array_equal(sampled[[0, 2]], greedy[[0, 2]])
    assert (sampled[[1, 3]] != greedy[[1, 3]]).any()

  # --- selection edge cases ---------------------------------------------------------
  def test_ties_go_to_lowest_index(self, head_type):
    head, (base, first, hidden) = self.make_case("small_v1000", head_type, 2, 3)
    w2 = head.markov_head.markov_w2.weight
    vocab = head.config.vocab_size
    # Rows 900 and vocab-1 copy row 11's weights, and all three share one large base
    # logit: an exact three-way tie at every step, which index 11 must win.
    tied = jnp.array([11, 900, vocab - 1])
    w2[...] = w2[...].at[tied[1:]].set(w2[...][11])
    base = base.at[:, :, tied].set(jnp.asarray(60.0, base.dtype))
    out = self.run(head, base, first, hidden)
    np.testing.assert_array_equal(np.asarray(out.tokens), 11)

  def test_padding_never_selected(self):
    head, (base, first, hidden) = self.make_case("small_v517", "vanilla", 2, 3)
    # Every real logit is -inf: the first index must win, never a padding slot; the walk
    # reports that no token could be chosen (jitted, it returns what it chose).
    out = jax.jit(lambda b: self.run(head, b, first, hidden))(jnp.full_like(base, -jnp.inf))
    np.testing.assert_array_equal(np.asarray(out.tokens), 0)
    assert int(out.status) == STATUS_NO_FINITE_LOGIT
    # The maximum sits on the last real index.
    vocab = head.config.vocab_size
    out = self.run(head, base.at[:, :, vocab - 1].set(1e4), first, hidden)
    np.testing.assert_array_equal(np.asarray(out.tokens), vocab - 1)


def _torch(array):
  return deepspec_torch._to_torch(array)


def _logsumexp(x):
  top = x.max(-1, keepdims=True)
  return (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))[..., 0]
