"""The shared walk suite on the kernels' own code in Pallas interpret mode (CPU).

Interpret mode runs grid programs one after another, so the persistent kernel runs
with one program owning every shard (its barrier has nothing to wait for); the
multi-program exchange is covered on the GPU (``test_walk_gpu.py``). The step-wise
kernel needs no barrier and runs here with several programs.
"""

import jax
import numpy as np
import pytest

import wts_jax
from walk_suite import WalkSuite
from wts_jax import validation
from wts_jax.pallas import stepwise
from wts_jax.pallas.plan import plan_walk
from wts_jax.quantize import quantize_w2


class TestWalkPallasInterpret(WalkSuite):
  IMPL = "pallas"
  BATCHES = (1, 3)
  STEPS = (1, 7)
  RESIDENCY_SPLITS = ("none", 0.5, "full")

  def config(self, residency="auto"):
    return wts_jax.WalkConfig(residency=residency, interpret=True)


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_quantized_w2_kernel_equals_quantized_reference(scheme):
  suite = TestWalkPallasInterpret()
  head, (base, first, hidden) = suite.make_case("small_v1000", "gated", 3, 7)
  head = quantize_w2(head, scheme)
  out = suite.run(head, base, first, hidden, return_logits=True)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", return_logits=True)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref.logits), atol=2e-4)


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("batch", [1, 3])
def test_stepwise_kernel_with_many_programs(head_type, batch):
  suite = TestWalkPallasInterpret()
  head, (base, first, hidden) = suite.make_case("small_v1000", head_type, batch, 7)
  key = jax.random.key(4)
  mode = validation.make_sampling(0.9, key, batch)
  out = stepwise.stepwise_walk(head, base, first, hidden, mode, return_logits=True,
                               return_logprobs=True, interpret=True, rows_per_program=128)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=0.9, key=key,
                     return_logits=True, return_logprobs=True)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref.logits), atol=2e-4)
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=2e-4)
  assert int(out.status) == 0


def test_plan_shards_cover_the_vocabulary_and_respect_the_budget():
  config = wts_jax.WalkConfig(num_programs=132)
  from wts_jax.pallas.plan import DeviceInfo
  device = DeviceInfo(kind="H200", num_sms=132, smem_per_block=227 * 1024,
                      l2_bytes=60 << 20)
  plan = plan_walk(vocab_size=151936, rank=256, batch=1, w2_itemsize=2, config=config,
                   device=device)
  assert plan.num_programs * plan.rows_per_program >= 151936
  assert plan.rows_per_program % plan.tile_rows == 0
  assert plan.resident_bytes_per_program <= plan.resident_budget_bytes
  assert 0 < plan.resident_fraction < 1
  assert "resident" in plan.describe()
  with pytest.raises(ValueError, match="exceeds the 132 SMs"):
    plan_walk(vocab_size=151936, rank=256, batch=1, w2_itemsize=2, device=device,
              config=wts_jax.WalkConfig(num_programs=133))
  with pytest.raises(ValueError, match="residency='full' needs"):
    plan_walk(vocab_size=151936, rank=256, batch=1, w2_itemsize=2, device=device,
              config=wts_jax.WalkConfig(num_programs=132, residency="full"))
  full = plan_walk(vocab_size=151936, rank=64, batch=1, w2_itemsize=1, device=device,
                   config=wts_jax.WalkConfig(num_programs=132, residency="full"),
                   register_budget_bytes=96 * 1024)
  assert full.streamed_tiles == 0 and full.resident_fraction == 1.0
