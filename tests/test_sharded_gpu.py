"""The sharded walk on several GPUs of one host: ``WTS_GPU_TESTS=1 python -m pytest -m gpu
tests/test_sharded_gpu.py`` on a machine with 2 or more GPUs (skipped otherwise).

At the Qwen3 DSpark shape, W2 split along V over every GPU: the XLA and step-kernel
sharded walks give the one-GPU XLA walk's tokens (greedy; sampled with the same key);
the in-kernel exchange probe (``device_exchange_mgpu``) gives ``probe_reference``'s
tokens and never times out, over many runs (a lost update would show as a timeout).
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.sharded.placement import place_head

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("WTS_GPU_TESTS") or jax.default_backend() != "gpu"
                       or jax.local_device_count() < 2,
                       reason="needs 2 or more NVIDIA GPUs on one host and WTS_GPU_TESTS=1"),
]


def _mesh():
  return jax.make_mesh((jax.local_device_count(),), ("tensor",))


@pytest.mark.parametrize("impl", ["xla", "pallas"])
@pytest.mark.parametrize("head_type,batch", [("vanilla", 1), ("vanilla", 64), ("gated", 16),
                                             ("rnn", 16)])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_sharded_walk_is_the_one_gpu_walk(impl, head_type, batch, temperature):
  config = HeadConfig.qwen3_4b(head_type)
  head = wts_jax.make_head(config, seed=batch)
  base, first, hidden = random_inputs(config, batch, 7, jax.random.key(batch + 1))
  key = jax.random.key(4)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  mesh = _mesh()
  placed = place_head(head, mesh, "tensor", split_w1=head_type == "gated")
  sharded_base = jax.device_put(base, NamedSharding(mesh, P(None, None, "tensor")))
  out = wts_jax.walk(placed, sharded_base, first, hidden, temperature=temperature, key=key,
                     impl=impl)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.status) == 0


def test_device_exchange_probe_on_every_gpu():
  from wts_jax.sharded.device_exchange_mgpu import ROWS, exchange_probe, probe_reference
  mesh = _mesh()
  devices, steps, blocks = mesh.shape["tensor"], 16, jax.devices()[0].core_count
  probe = jax.jit(jax.shard_map(functools.partial(exchange_probe, axis_name="tensor"),
                                mesh=mesh, in_specs=(P("tensor"), P("tensor"), P()),
                                out_specs=(P(), P("tensor")), check_vma=False))
  for trial in range(50):
    keys = jax.random.split(jax.random.key(trial), 3)
    # Integer-valued scores: many exact ties across blocks and devices.
    scores = jnp.round(jax.random.normal(keys[0], (devices, steps, blocks, ROWS)) * 3)
    indices = jax.random.randint(keys[1], (devices, steps, blocks, ROWS), 0, 151_936)
    first = jax.random.randint(keys[2], (ROWS,), 0, 151_936)
    tokens, timeouts = probe(jax.device_put(scores.reshape(-1, blocks, ROWS),
                                            NamedSharding(mesh, P("tensor"))),
                             jax.device_put(indices.reshape(-1, blocks, ROWS),
                                            NamedSharding(mesh, P("tensor"))), first)
    assert int(jnp.max(timeouts)) == 0, trial
    np.testing.assert_array_equal(np.asarray(tokens),
                                  np.asarray(probe_reference(scores, indices, first)))
