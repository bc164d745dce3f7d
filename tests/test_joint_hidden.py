"""The rnn head's contiguous J_h (``wts_jax.with_joint_hidden``): the same hoist bit for
bit without the weight's column slice, the same walks, and the bench's variant without it."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.walk_config import MosaicBatchedConfig

from mosaic_checks import assert_walk_matches, mosaic_and_xla_walks


def _rnn(vocab=300, rank=64, hidden=96, seed=0, dtype=jnp.bfloat16):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=hidden, head_type="rnn",
                      confidence=True)
  return wts_jax.make_head(config, seed=seed + vocab, param_dtype=dtype)


def _slices(fn, *args) -> int:
  """How many slice ops ``fn``'s jaxpr has (a column slice of a weight is one)."""
  return sum(eqn.primitive.name == "slice" for eqn in jax.make_jaxpr(fn)(*args).eqns)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_hoist_from_the_copy_equals_the_heads_without_a_slice(dtype):
  head = _rnn(dtype=dtype)
  copied = wts_jax.with_joint_hidden(head)
  hidden = jax.random.normal(jax.random.key(3), (5, 4, 96), dtype)
  np.testing.assert_array_equal(
      np.asarray(copied.markov_head.hoist(hidden)).view(np.uint32),
      np.asarray(head.markov_head.hoist(hidden)).view(np.uint32))
  assert _slices(head.markov_head.hoist, hidden) == 1
  assert _slices(copied.markov_head.hoist, hidden) == 0


def test_copy_is_the_rnn_heads_and_the_original_is_untouched():
  head = _rnn()
  copied = wts_jax.with_joint_hidden(head)
  assert getattr(head.markov_head, "joint_hidden", None) is None
  np.testing.assert_array_equal(
      np.asarray(copied.markov_head.joint_hidden.weight[...]),
      np.asarray(head.markov_head.joint_proj.weight[...][:, 128:]))
  gated = wts_jax.make_head(HeadConfig(vocab_size=300, rank=64, hidden_size=96,
                                       head_type="gated"), seed=1)
  with pytest.raises(ValueError, match="a contiguous J_h is the rnn head's"):
    wts_jax.with_joint_hidden(gated)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_walks_with_the_copy_equal_the_heads(temperature):
  """The XLA walk and the Triton kernel (interpret mode) of the head with the copy give
  the head's own tokens."""
  head = _rnn(vocab=520)
  copied = wts_jax.with_joint_hidden(head)
  base, first, hidden = random_inputs(head.config, 3, 4, jax.random.key(11))
  key = jax.random.key(12) if temperature else None
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  out = wts_jax.walk(copied, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  assert_walk_matches(out, ref)
  kernel = wts_jax.walk(copied, base, first, hidden, impl="triton",
                        config=wts_jax.TritonConfig(interpret=True, num_programs=2),
                        temperature=temperature, key=key)
  assert_walk_matches(kernel, ref)


@pytest.mark.mosaic
@pytest.mark.skipif(jax.__version_info__ < (0, 11),
                    reason="jax 0.10's Mosaic GPU interpreter cannot run the batched "
                           "kernel's tiled shared-memory loads")
def test_batched_mosaic_walk_with_the_copy_equals_xla():
  head = wts_jax.with_joint_hidden(_rnn(vocab=1000, hidden=64, seed=5))
  base, first, hidden = random_inputs(head.config, 13, 4, jax.random.key(14))
  config = MosaicBatchedConfig(interpret=True, residency="none", serial_update="split",
                               batch_axis="m", warpgroups=1)
  assert_walk_matches(*mosaic_and_xla_walks(head, base, first, hidden, impl="mosaic",
                                            config=config, temperature=0.7,
                                            key=jax.random.key(15)))


def test_bench_variant_walks_the_head_without_the_copy():
  """``tools/bench_variants.py``'s ``wts-rnn-sliced-j-h`` hands its walk a head without
  the copy, and leaves the bench's head as it was."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import bench_variants
  head = wts_jax.with_joint_hidden(_rnn())
  seen = []
  def prepare(given, *args, **kwargs):
    seen.append(getattr(given.markov_head, "joint_hidden", None))
    return given
  given = bench_variants._without_joint_hidden(prepare)(head, None)
  assert seen == [None] and given is not head
  assert head.markov_head.joint_hidden is not None
  assert _slices(given.markov_head.hoist, jnp.zeros((1, 2, 96), jnp.bfloat16)) == 1
