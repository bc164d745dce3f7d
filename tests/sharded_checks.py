"""Helpers of the sharded-walk tests: meshes of host devices, and the checks that a
sharded walk is the one-device walk and moves nothing V-sized between devices."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax

# The conftest gives the CPU client 8 host devices (--xla_force_host_platform_device_count).
NEEDS_8_DEVICES = pytest.mark.skipif(
    jax.device_count() < 8,
    reason="needs 8 devices (the conftest sets --xla_force_host_platform_device_count=8)")

# name: (mesh shape, axis names, vocab axis, batch axis)
MESHES = {
    "tensor2": ((2,), ("tensor",), "tensor", None),
    "tensor4": ((4,), ("tensor",), "tensor", None),
    "data2_tensor4": ((2, 4), ("data", "tensor"), "tensor", "data"),
    "vocab_over_x2_y4": ((2, 4), ("x", "y"), ("x", "y"), None),
}


def make_mesh(name: str, explicit: bool = True):
  shape, names, _, _ = MESHES[name]
  kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
  return jax.make_mesh(shape, names, axis_types=(kind,) * len(names))


def temperatures(batch: int, sampled: bool):
  """0 (greedy), or a [B] temperature with greedy rows among sampled ones."""
  if not sampled:
    return 0.0
  return jnp.array([0.0, 0.7, 1.3, 0.9, 0.0, 2.0, 0.5, 1.0][:batch], jnp.float32)


def assert_same_walk(out, ref, *, logits_atol=1e-6, logprobs_atol=1e-5):
  """The sharded walk ``out`` against the one-device walk ``ref``: the same tokens (bit
  for bit), confidence, logits and log-probabilities (to the ulps of a reordered sum)."""
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.status) == int(ref.status)
  for name, atol in (("confidence", 1e-6), ("logits", logits_atol),
                     ("logprobs", logprobs_atol)):
    want = getattr(ref, name)
    got = getattr(out, name)
    assert (got is None) == (want is None), name
    if want is not None:
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=atol, rtol=0,
                                 err_msg=name)


_COLLECTIVE = re.compile(
    r"= (\(?[a-z0-9]+\[[^=]*?) (all-gather|all-reduce|all-to-all|collective-permute|"
    r"reduce-scatter|all-gather-start|all-reduce-start|collective-permute-start)\(")
_SHAPE = re.compile(r"[a-z0-9]+\[([\d,]*)\]")


def collectives(hlo_text: str) -> list[tuple[str, tuple[int, ...]]]:
  """(op, result dims) of every collective in compiled HLO text."""
  found = []
  for line in hlo_text.splitlines():
    match = _COLLECTIVE.search(line)
    if match:
      for dims in _SHAPE.findall(match.group(1)):
        found.append((match.group(2), tuple(int(d) for d in dims.split(",") if d)))
  return found


def assert_nothing_vocab_sized_moves(hlo_text: str, vocab: int, shards: int,
                                     message_elements: int):
  """No collective of the compiled walk carries a V-sized axis (V or V / shards), and
  none carries more than ``message_elements`` elements (a step's packed candidates)."""
  moved = collectives(hlo_text)
  assert moved, "expected the per-step exchange among the collectives"
  local = vocab // shards
  for op, dims in moved:
    assert vocab not in dims and local not in dims, (op, dims)
    assert int(np.prod(dims)) <= message_elements, (op, dims, message_elements)

