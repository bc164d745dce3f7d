"""The kernels on the GPU (H200): run with ``WTS_GPU_TESTS=1 python -m pytest -m gpu``.

The shared walk suite against both oracles at small shapes, then the real Qwen3 DSpark
shapes against the XLA reference on the GPU, a stress run of 1000 fresh walks,
bit-identical repeats, the one-launch check on the compiled HLO, and the no-hang
guarantees (grid larger than the SMs refused; a starved barrier reports a timeout).
"""

from __future__ import annotations

import os
import re

import jax
import numpy as np
import pytest

import wts_jax
from walk_suite import WalkSuite
from wts_jax import validation
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.quantize import quantize_w2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("WTS_GPU_TESTS") or jax.default_backend() != "gpu",
                       reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1"),
]


class TestWalkPallasGpu(WalkSuite):
  IMPL = "pallas"
  RESIDENCY_SPLITS = ("none", 0.5, "full", 100)


def _real_case(head_type, batch, steps=7, seed=0, rank=256, confidence=True):
  config = HeadConfig.qwen3_4b(head_type, rank=rank, confidence=confidence)
  head = wts_jax.make_head(config, seed=seed)
  return head, random_inputs(config, batch, steps, jax.random.key(seed + 1))


def _assert_matches_reference(head, inputs, temperature=0.0, config=None):
  base, first, hidden = inputs
  key = jax.random.key(11) if temperature else None
  kwargs = dict(temperature=temperature, key=key, return_logits=True,
                return_logprobs=True)
  out = wts_jax.walk(head, base, first, hidden, impl="pallas", config=config, **kwargs)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref.logits), atol=1e-3,
                             rtol=0)
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=1e-3)
  if ref.confidence is not None:
    np.testing.assert_allclose(np.asarray(out.confidence), np.asarray(ref.confidence),
                               atol=1e-3)
  assert int(out.status) == 0


def _assert_tokens_match_reference(head, inputs, temperature, config):
  """Tokens (the Mosaic kernel returns no per-step logits) and confidence: greedy, or
  sampled with the same key as the reference."""
  base, first, hidden = inputs
  key = jax.random.key(11) if temperature else None
  out = wts_jax.walk(head, base, first, hidden, impl="pallas", config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  if ref.confidence is not None:
    np.testing.assert_allclose(np.asarray(out.confidence), np.asarray(ref.confidence),
                               atol=1e-3)
  assert int(out.status) == 0


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("batch", [1, 16, 64])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_real_shapes_match_reference(head_type, batch, temperature):
  head, inputs = _real_case(head_type, batch)
  _assert_matches_reference(head, inputs, temperature)


@pytest.mark.parametrize("residency", ["none", 0.25, "auto"])
@pytest.mark.parametrize("rank", [64, 128])
def test_other_ranks_and_residency(rank, residency):
  head, inputs = _real_case("vanilla", 4, rank=rank)
  _assert_matches_reference(head, inputs,
                            config=wts_jax.MosaicBatchedConfig(residency=residency))


@pytest.mark.parametrize("residency", ["auto", "none", 0.25, 2 * 64])
@pytest.mark.parametrize("batch", [1, 3, 4])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_mosaic_kernel_matches_reference(residency, batch, temperature):
  """The Mosaic kernels (132 blocks, shared-memory residency, TMA ring) at the real
  shape, the row kernel at one row and the batched one above: the reference's tokens,
  greedy and sampled with the same key."""
  head, inputs = _real_case("vanilla", batch)
  config = (wts_jax.MosaicRowConfig if batch == 1 else wts_jax.MosaicBatchedConfig)(
      residency=residency)
  _assert_tokens_match_reference(head, inputs, temperature, config)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_mosaic_wgmma_gemv_matches_reference(batch, temperature):
  """The tensor-core GEMV (WGMMA against W1 rows staged by TMA) at the real shape."""
  head, inputs = _real_case("vanilla", batch)
  config = wts_jax.MosaicRowConfig(gemv="wgmma")
  _assert_tokens_match_reference(head, inputs, temperature, config)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_mosaic_gated_head_matches_reference(batch, temperature):
  """The gated head on the batched Mosaic kernel (its gate split over the blocks) at the
  real shape, confidence included."""
  head, inputs = _real_case("gated", batch)
  config = wts_jax.MosaicBatchedConfig()
  _assert_tokens_match_reference(head, inputs, temperature, config)


@pytest.mark.parametrize("batch, temperature, residency, stages, group", [
    (2, 0.0, "none", 6, 3), (4, 0.7, 2 * 64, 2, 2), (1, 0.7, 0, 3, 3)])
def test_mosaic_wgmma_groups_match_reference(batch, temperature, residency, stages,
                                             group):
  """Several chunks' WGMMAs in flight before one wait, resident groups among the
  streamed ones, at the real shape."""
  head, inputs = _real_case("vanilla", batch)
  config = wts_jax.MosaicRowConfig(gemv="wgmma", residency=residency, ring_stages=stages,
                                   group=group)
  _assert_tokens_match_reference(head, inputs, temperature, config)


@pytest.mark.parametrize("batch, temperature, residency, stages, gemv, group", [
    (1, 0.0, "auto", None, "registers", 1), (4, 0.7, 9 * 64, 3, "registers", 1),
    (1, 0.0, "none", 3, "wgmma", 1), (3, 0.7, 6 * 64, 4, "wgmma", 2),
    (1, 0.0, 10 * 64, 2, "wgmma", 2)])
def test_mosaic_int8_w2_matches_its_reference(batch, temperature, residency, stages, gemv,
                                              group):
  """int8 W2 on the Mosaic kernel at the real shape: the quantized reference's tokens,
  with the register GEMV and with the WGMMA on the chunk upcast in registers (which the
  CPU interpreter cannot run: this is its only execution test)."""
  head, inputs = _real_case("vanilla", batch)
  config = wts_jax.MosaicRowConfig(residency=residency, ring_stages=stages, gemv=gemv,
                                   group=group)
  _assert_tokens_match_reference(quantize_w2(head, "int8"), inputs, temperature, config)


def test_mosaic_kernel_confidence_and_other_ranks():
  for rank in (64, 128):
    config = HeadConfig.qwen3_4b("vanilla", rank=rank, confidence=True)
    head = wts_jax.make_head(config, seed=4)
    base, first, hidden = random_inputs(config, 2, 7, jax.random.key(9))
    out = wts_jax.walk(head, base, first, hidden, impl="mosaic")
    ref = wts_jax.walk(head, base, first, hidden, impl="xla")
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_allclose(np.asarray(out.confidence), np.asarray(ref.confidence),
                               atol=1e-3)


def test_quantized_w2_matches_its_reference():
  head, inputs = _real_case("vanilla", 1)
  _assert_matches_reference(quantize_w2(head, "int8"), inputs)


def test_fp8_w2_is_refused_by_the_kernel_and_auto_falls_back():
  head, (base, first, _) = _real_case("vanilla", 1, confidence=False)
  head = quantize_w2(head, "fp8")
  with pytest.raises(ValueError, match="failed the kernel's GPU check"):
    wts_jax.walk(head, base, first, impl="pallas")
  assert wts_jax.chosen_implementation(head, base) == "xla"


def test_stepwise_kernel_matches_reference():
  from wts_jax.pallas.stepwise import stepwise_walk
  for head_type in ("vanilla", "gated", "rnn"):
    head, (base, first, hidden) = _real_case(head_type, 4)
    mode = validation.make_sampling(0.8, jax.random.key(2), 4)
    out = stepwise_walk(head, base, first, hidden, mode, return_logprobs=True)
    ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=0.8,
                       key=jax.random.key(2), return_logprobs=True)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs),
                               atol=1e-3)


@pytest.mark.parametrize("backend, batch, gemv, w2, temperature", [
    ("mosaic", 1, "registers", "bf16", 0.0), ("mosaic", 1, "wgmma", "bf16", 0.0),
    ("mosaic", 1, "wgmma", "int8", 0.0), ("triton", 2, "registers", "bf16", 0.0),
    ("mosaic", 1, "registers", "bf16", 0.8), ("mosaic", 1, "wgmma", "int8", 0.8),
    ("triton", 2, "registers", "bf16", 0.8)])
def test_stress_1000_fresh_walks_equal_reference(backend, batch, gemv, w2, temperature):
  """Exact tokens, greedy and sampled with the same key (the sampled noise is drawn in
  the kernel: every walk's 7 winning Gumbel values are its precision's test)."""
  config = HeadConfig.qwen3_4b("vanilla", confidence=False)
  head = wts_jax.make_head(config, seed=3)
  if w2 == "int8":   # against the quantized reference
    head = quantize_w2(head, "int8")
  walk_config = (wts_jax.MosaicRowConfig(gemv=gemv) if backend == "mosaic"
                 else wts_jax.TritonConfig())
  kernel = jax.jit(lambda h, b, f, key: wts_jax.walk(
      h, b, f, impl="pallas", config=walk_config, temperature=temperature, key=key).tokens)
  reference = jax.jit(lambda h, b, f, key: wts_jax.walk(
      h, b, f, impl="xla", temperature=temperature, key=key).tokens)
  mismatches = []
  for i in range(1000):
    base, first, _ = random_inputs(config, batch, 7, jax.random.key(1000 + i))
    key = jax.random.key(7000 + i) if temperature else None
    got, want = kernel(head, base, first, key), reference(head, base, first, key)
    if not np.array_equal(np.asarray(got), np.asarray(want)):
      mismatches.append(i)
  assert not mismatches, f"walks {mismatches[:10]} differ from the reference"


def test_repeated_runs_are_bit_identical():
  head, (base, first, hidden) = _real_case("gated", 16)
  runs = [wts_jax.walk(head, base, first, hidden, impl="pallas", temperature=1.0,
                       key=jax.random.key(5), return_logits=True) for _ in range(10)]
  for run in runs[1:]:
    np.testing.assert_array_equal(np.asarray(run.tokens), np.asarray(runs[0].tokens))
    np.testing.assert_array_equal(np.asarray(run.logits), np.asarray(runs[0].logits))


def _kernel_config(backend, blocks=None, **options):
  """The row kernel's config ("mosaic") or the Triton kernel's, ``blocks`` its grid."""
  if backend == "mosaic":
    return wts_jax.MosaicRowConfig(num_blocks=blocks, **options)
  return wts_jax.TritonConfig(num_programs=blocks, **options)


@pytest.mark.parametrize("backend", ["mosaic", "triton"])
def test_one_kernel_launch_in_compiled_hlo(backend):
  """The compiled walk is one kernel: a single custom call, and any fusion around it is
  scalar glue (zero fills of the barrier counters, the status word, the clamp of the
  first tokens) — nothing of vocabulary or weight size."""
  head, (base, first, _) = _real_case("vanilla", 1, confidence=False)
  config = _kernel_config(backend)
  compiled = jax.jit(lambda h, b, f: wts_jax.walk(h, b, f, impl="pallas",
                                                  config=config)).lower(
      head, base, first).compile()
  text = compiled.as_text()
  assert len(re.findall(r"custom_call_target=", text)) == 1, text
  for line in text.splitlines():
    if re.search(r"= \S+ fusion\(", line):
      shape = re.search(r"= \w+\[([\d,]*)\]", line)
      elements = int(np.prod([int(d) for d in shape.group(1).split(",") if d])) if shape else 0
      assert elements <= 4096, line


@pytest.mark.parametrize("backend", ["mosaic", "triton"])
def test_grid_larger_than_the_device_is_refused(backend):
  head, (base, first, _) = _real_case("vanilla", 1, confidence=False)
  sms = jax.devices()[0].core_count
  with pytest.raises(ValueError, match=f"exceeds the {sms} SMs"):
    wts_jax.walk(head, base, first, impl="pallas",
                 config=_kernel_config(backend, blocks=sms + 1))


@pytest.mark.parametrize("backend", ["mosaic", "triton"])
def test_starved_barrier_reports_timeout_instead_of_hanging(backend):
  head, (base, first, _) = _real_case("vanilla", 1, confidence=False)
  config = _kernel_config(backend, sync_spin_limit=1)
  statuses = []
  for _ in range(20):
    out = jax.jit(lambda h, b, f: wts_jax.walk(h, b, f, impl="pallas", config=config))(
        head, base, first)
    statuses.append(int(out.status))
  assert any(status & wts_jax.output.STATUS_SYNC_TIMEOUT for status in statuses), statuses
  with pytest.raises(wts_jax.WalkError, match="timed out"):
    for _ in range(20):
      wts_jax.walk(head, base, first, impl="pallas", config=config)
