"""The decode loop on the GPU: run with ``WTS_GPU_TESTS=1 python -m pytest -m gpu``.

The persistent walk kernel inside the jitted while_loop: greedy output equals the
target's greedy decoding with every walk, and one iteration at the Qwen3-4B shapes
runs with each walk (a smoke run of the benchmark's path).
"""

import os

import jax
import jax.numpy as jnp
import pytest

from wts_jax.spec.dspark import DSparkConfig, make_dspark
from wts_jax.spec.loop import generate
from wts_jax.spec.qwen3 import Qwen3Config, make_qwen3
from wts_jax.spec.timing import iteration_cost

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


@pytest.mark.parametrize("walk", ["pallas", "xla", "none"])
def test_one_iteration_at_the_qwen3_4b_shapes(walk):
  target = make_qwen3(Qwen3Config.qwen3_4b())
  drafter = make_dspark(DSparkConfig.qwen3_4b())
  cost = iteration_cost(target, drafter, batch=4, draft_len=7, prompt_len=128,
                        walk_impl=walk, repeats=2, chain=2)
  assert all(value > 0 for value in cost.values()), cost
