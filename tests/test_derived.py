"""A head's derived copies (``wts_jax.derived``): current when built, named when a weight
they come from changes in place, rebuilt by ``with_fresh_copies``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs


def _head(head_type, seed=0):
  config = HeadConfig(vocab_size=256, rank=64, hidden_size=48, head_type=head_type,
                      confidence=False)
  return wts_jax.make_head(config, seed=seed)


def _with_every_copy(head_type):
  """The head with every derived copy its type has."""
  head = _head(head_type)
  if head_type == "vanilla":
    return wts_jax.quantize_w2(head, "int8", state="planes")
  if head_type == "gated":
    return wts_jax.with_gate_table(head)
  return wts_jax.with_joint_hidden(head)


def _scaled(variable, factor):
  variable.value = (variable[...].astype(jnp.float32) * factor).astype(variable[...].dtype)


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_copies_are_current_when_built(head_type):
  assert wts_jax.stale_copies(_with_every_copy(head_type)) == []
  assert wts_jax.stale_copies(_head(head_type)) == []   # (no copies)


@pytest.mark.parametrize("head_type,source,stale", [
    ("vanilla", "markov_w1", ["markov_head.markov_w1_planes.planes",
                              "markov_head.markov_w1_planes.scale",
                              "markov_head.markov_w1_planes.fragments"]),
    ("vanilla", "markov_w2", ["markov_head.markov_w2.thread_rows"]),
    ("gated", "markov_w1", ["markov_head.gate_table.rows"]),
    ("gated", "gate_proj", ["markov_head.gate_table.rows",
                            "markov_head.gate_table.hidden_weight"]),
    ("rnn", "joint_proj", ["markov_head.joint_hidden.weight"])])
def test_a_weight_changed_in_place_names_its_copies_and_fresh_copies_mend_them(
    head_type, source, stale):
  head = _with_every_copy(head_type)
  weight = getattr(head.markov_head, source).weight
  if source == "markov_w2":   # int8 values: a row moved instead of a scale
    weight.value = jnp.roll(weight[...], 1, axis=0)
  else:
    _scaled(weight, 1.5)
  assert wts_jax.stale_copies(head) == stale
  fresh = wts_jax.with_fresh_copies(head)
  assert wts_jax.stale_copies(fresh) == []
  assert wts_jax.stale_copies(head) == stale   # (the input head left as it was)


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_fresh_copies_walk_as_the_changed_weights_do(head_type):
  """After an in-place change, the refreshed head's walk (which reads the copies) equals
  the walk of a head whose copies were built from the changed weights."""
  head = _with_every_copy(head_type)
  source = "gate_proj" if head_type == "gated" else "joint_proj"
  _scaled(getattr(head.markov_head, source).weight, -0.75)
  plain = _head(head_type)
  getattr(plain.markov_head, source).weight.value = getattr(head.markov_head,
                                                            source).weight[...]
  rebuilt = (wts_jax.with_gate_table(plain) if head_type == "gated"
             else wts_jax.with_joint_hidden(plain))
  base, first, hidden = random_inputs(head.config, 3, 4, jax.random.key(7))
  for temperature, key in ((0.0, None), (0.9, jax.random.key(8))):
    fresh = wts_jax.walk(wts_jax.with_fresh_copies(head), base, first, hidden, impl="xla",
                         temperature=temperature, key=key)
    want = wts_jax.walk(rebuilt, base, first, hidden, impl="xla", temperature=temperature,
                        key=key)
    np.testing.assert_array_equal(np.asarray(fresh.tokens), np.asarray(want.tokens))
