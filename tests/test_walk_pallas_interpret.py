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
    return wts_jax.TritonConfig(residency=residency, interpret=True)


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
def test_stepwise_kernel_with_many_programs(head_type, batch=3):
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
  config = wts_jax.TritonConfig(num_programs=132)
  from wts_jax.device import DeviceFacts
  device = DeviceFacts(kind="H200", num_sms=132, smem_per_block=227 * 1024)
  plan = plan_walk(vocab_size=151936, rank=256, batch=1, w2_itemsize=2, config=config,
                   device=device)
  assert plan.num_programs * plan.rows_per_program >= 151936
  assert plan.rows_per_program % plan.tile_rows == 0
  assert plan.resident_bytes_per_program <= plan.resident_budget_bytes
  assert 0 < plan.resident_fraction < 1
  assert "resident" in plan.describe()
  with pytest.raises(ValueError, match="exceeds the 132 SMs"):
    plan_walk(vocab_size=151936, rank=256, batch=1, w2_itemsize=2, device=device,
              config=wts_jax.TritonConfig(num_programs=133))
  with pytest.raises(ValueError, match="residency='full' needs"):
    plan_walk(vocab_size=151936, rank=256, batch=1, w2_itemsize=2, device=device,
              config=wts_jax.TritonConfig(num_programs=132, residency="full"))
  full = plan_walk(vocab_size=151936, rank=64, batch=1, w2_itemsize=1, device=device,
                   config=wts_jax.TritonConfig(num_programs=132, residency="full"),
                   register_budget_bytes=96 * 1024)
  assert full.streamed_tiles == 0 and full.resident_fraction == 1.0


def _assert_kernel_equals_reference(head, base, first, hidden, config, temperature, key):
  kwargs = dict(temperature=temperature, key=key, return_logits=True, return_logprobs=True)
  out = wts_jax.walk(head, base, first, hidden, impl="pallas", config=config, **kwargs)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref.logits), atol=2e-4)
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=2e-4)
  np.testing.assert_allclose(np.asarray(out.confidence), np.asarray(ref.confidence),
                             atol=1e-4)
  assert int(out.status) == 0


def _split_plan(head, batch, config):
  from wts_jax.pallas import triton_backend
  return triton_backend.make_plan(head, batch, config)


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_split_serial_update_equals_reference(head_type, temperature, batch=3, steps=7):
  """The split serial update (one program computing every slice, in several rounds:
  rank 32 in slices of 16) gives the reference's tokens, logits and log-probabilities,
  greedy and sampled with the same key. (It is also the default, so the shared walk
  suite above runs it over B in {1, 3} x K in {1, 7} against both oracles.)"""
  suite = TestWalkPallasInterpret()
  head, (base, first, hidden) = suite.make_case("small_v1000", head_type, batch, steps)
  config = wts_jax.TritonConfig(interpret=True, serial_update="split")
  plan = _split_plan(head, batch, config)
  assert plan.serial_update == "split" and plan.serial_slice_rounds == 2
  key = jax.random.key(5) if temperature else None
  _assert_kernel_equals_reference(head, base, first, hidden, config, temperature, key)


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_redundant_serial_update_equals_reference(head_type, batch=3):
  """The redundant update (every program computes all of z) stays selectable and exact."""
  suite = TestWalkPallasInterpret()
  head, (base, first, hidden) = suite.make_case("small_v517", head_type, batch, 7)
  config = wts_jax.TritonConfig(interpret=True, serial_update="redundant")
  assert _split_plan(head, batch, config).serial_update == "redundant"
  for temperature, key in ((0.0, None), (0.8, jax.random.key(6))):
    _assert_kernel_equals_reference(head, base, first, hidden, config, temperature, key)


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_split_serial_update_with_streamed_weight_slices(head_type, monkeypatch):
  """Weight slices over the on-chip budget are re-read every step: same results."""
  from wts_jax.pallas import plan as plan_module
  monkeypatch.setattr(plan_module, "SERIAL_RESIDENT_BYTES", 0)
  suite = TestWalkPallasInterpret()
  head, (base, first, hidden) = suite.make_case("small_v1000", head_type, 3, 7)
  config = wts_jax.TritonConfig(interpret=True, serial_update="split")
  assert not _split_plan(head, 3, config).serial_weights_resident
  _assert_kernel_equals_reference(head, base, first, hidden, config, 0.8,
                                  jax.random.key(8))


def test_plan_serial_update_slices():
  from wts_jax.device import DeviceFacts
  device = DeviceFacts(kind="H200", num_sms=132, smem_per_block=227 * 1024)

  def plan(rank, **config):
    return plan_walk(vocab_size=151936, rank=rank, batch=1, w2_itemsize=2, device=device,
                     config=wts_jax.TritonConfig(**config))

  auto = plan(256, num_programs=132)  # one 2-column slice per program, 4 idle
  assert (auto.serial_update, auto.serial_slice_cols, auto.serial_slices,
          auto.serial_slice_rounds, auto.serial_weights_resident) == ("split", 2, 128, 1,
                                                                      True)
  assert "128 slices of 2 columns" in auto.describe()
  assert plan(64, num_programs=132).serial_slices == 64
  few = plan(256, num_programs=8)     # 16 slices of 16 columns, two per program
  assert (few.serial_slice_cols, few.serial_slice_rounds) == (16, 2)
  assert not few.serial_weights_resident  # 96 KiB of J per program: re-read per step
  redundant = plan(256, num_programs=132, serial_update="redundant")
  assert redundant.serial_update == "redundant" and redundant.serial_slices == 0
  assert "redundant" in redundant.describe()
  with pytest.raises(ValueError, match="serial_update"):
    wts_jax.TritonConfig(serial_update="both")


def test_reduced_index_outside_the_vocabulary_becomes_token_zero():
  """After a barrier timeout a peer's slot may hold uninitialised memory: any index
  outside [0, V) — negative included — must not become a W1 row (it was an illegal
  address on the H200)."""
  from wts_jax.pallas import tile_math
  index = jax.numpy.array([-7, 0, 99, 100, 1 << 30, -(1 << 31)], jax.numpy.int32)
  zeros = jax.numpy.zeros(index.shape, jax.numpy.float32)
  reduced = tile_math.Candidates(best_score=zeros, best_index=index, chosen_scaled=zeros,
                                 lse_max=zeros, lse_sum=zeros + 1,
                                 nan_seen=index * 0)
  token, _, _ = tile_math.chosen_token(reduced, vocab_size=100)
  np.testing.assert_array_equal(np.asarray(token), [0, 0, 99, 0, 0, 0])
