"""docs/sharded.md's example, run as written: an engine's step-wise Markov head (W1
whole, W2 a Linear kernel [r, V] split over "tensor") and the same block by
``wts_jax.walk`` on the engine's own arrays give the same tokens, on 2, 4 and 8 host
devices; sampled, the same key gives the same tokens on every mesh."""

import re
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from sharded_checks import NEEDS_8_DEVICES

pytestmark = NEEDS_8_DEVICES

DOC = Path(__file__).resolve().parents[1] / "docs" / "sharded.md"


def _example() -> dict:
  """The namespace of the doc's marked code block, executed."""
  text = DOC.read_text()
  match = re.search(r"<!-- example: engine-block-sampling -->\n```python\n(.*?)```", text,
                    re.S)
  assert match, "docs/sharded.md lost its engine-block-sampling example"
  namespace: dict = {}
  exec(compile(match.group(1), str(DOC), "exec"), namespace)  # noqa: S102 - our own doc
  return namespace


def test_the_walk_replaces_the_engines_step_wise_block_sampling():
  example = _example()
  vocab, rank, batch, steps = 4096, 64, 4, 7
  keys = jax.random.split(jax.random.key(3), 2)
  base_logits = jax.random.normal(keys[0], (batch, steps, vocab)) * 2.0
  first = jax.random.randint(keys[1], (batch,), 0, vocab)
  sampled = []
  for devices in (2, 4, 8):
    mesh = jax.make_mesh((devices,), ("tensor",), devices=jax.devices()[:devices])
    engine_head = example["EngineMarkovHead"](vocab_size=vocab, rank=rank, mesh=mesh,
                                              rngs=nnx.Rngs(0))
    base = jax.device_put(base_logits, NamedSharding(mesh, P(None, None, "tensor")))
    step_wise = engine_head.sample_block_tokens(base, first)
    walked = example["sample_block_tokens_with_walk"](engine_head, base, first,
                                                      hidden_size=32)
    np.testing.assert_array_equal(np.asarray(walked), np.asarray(step_wise))
    sampled.append(np.asarray(example["sample_block_tokens_with_walk"](
        engine_head, base, first, hidden_size=32, temperature=1.0,
        key=jax.random.key(5))))
  for other in sampled[1:]:
    np.testing.assert_array_equal(other, sampled[0])
