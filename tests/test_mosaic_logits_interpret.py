"""Logits and log-probabilities from the Mosaic kernels, which select without writing
them: ``reference.logits_of_tokens`` replays the head over the drafted tokens.

The replay against the XLA walk's own logits (pure XLA: every jax version), then each
Mosaic kernel (row, batched, a launch a step) asked for both in Mosaic GPU interpret
mode (jax >= 0.11): exact tokens, the reference's logits and log-probabilities.
"""

import jax
import numpy as np
import pytest

import wts_jax
from wts_jax import validation
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.reference import logits_of_tokens
from wts_jax.walk_config import MosaicBatchedConfig, MosaicRowConfig

pytestmark = pytest.mark.mosaic

NEEDS_INTERPRETER = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11),
    reason="jax 0.10's Mosaic GPU interpreter cannot run tiled shared-memory loads")


def _head(head_type, vocab=1000, rank=64):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type=head_type)
  return wts_jax.make_head(config, seed=vocab + rank + 3)


def _reference(head, batch, steps, temperature, seed):
  base, first, hidden = random_inputs(head.config, batch, steps, jax.random.key(seed))
  key = jax.random.key(seed + 10) if temperature else None
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key, return_logits=True, return_logprobs=True)
  return (base, first, hidden, key), ref


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_replay_matches_the_reference_walk(head_type, temperature):
  head = _head(head_type)
  (base, first, hidden, key), ref = _reference(head, 5, 4, temperature, 1)
  mode = validation.make_sampling(temperature, key, 5)
  logits, logprobs = logits_of_tokens(
      head, base, first, ref.tokens, hidden if head.config.needs_hidden else None,
      mode.score_scale, return_logits=True, return_logprobs=True)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref.logits), rtol=1e-6,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(logprobs), np.asarray(ref.logprobs), atol=1e-4)
  only_logprobs = logits_of_tokens(head, base, first, ref.tokens,
                                   hidden if head.config.needs_hidden else None,
                                   mode.score_scale, return_logits=False,
                                   return_logprobs=True)
  assert only_logprobs[0] is None


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,batch,kernel", [
    ("vanilla", 1, "rows"), ("gated", 2, "rows"), ("vanilla", 13, "batched"),
    ("gated", 8, "batched"), ("rnn", 5, "batched")])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_mosaic_kernels_return_logits_and_logprobs(head_type, batch, kernel, temperature):
  head = _head(head_type)
  (base, first, hidden, key), ref = _reference(head, batch, 3, temperature, 2)
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic", temperature=temperature,
                     key=key, return_logits=True, return_logprobs=True,
                     config={"rows": MosaicRowConfig,
                             "batched": MosaicBatchedConfig}[kernel](interpret=True))
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref.logits), rtol=1e-6,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs),
                             atol=1e-4)
  assert int(out.status) == 0
