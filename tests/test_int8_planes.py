"""The int8 × int8 contract (``wts_jax.int8_state``) and the Mosaic kernel's int8 WGMMA.

The contract: z as two int8 planes with a power-of-two scale, exact int32 products.
Checked here against float64 NumPy (the planes and the bias), the reference walk against
a NumPy replay of the contract, and the Mosaic kernel — CUDA lowering at the Qwen3 shape
on any JAX, its walk in Mosaic GPU interpret mode (jax >= 0.11) against the reference.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from mosaic_checks import assert_mosaic_matches_xla, planes_head
from wts_jax import int8_state
from wts_jax.device import H200
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.pallas import mosaic_plan
from wts_jax.pallas.row.launch import row_walk
from wts_jax.pallas.row.spec import RowSpec
from wts_jax.quantize import quantize_w2

pytestmark = pytest.mark.mosaic

H200_SMEM = 232448
NEEDS_INTERPRETER = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11),
    reason="jax 0.10's Mosaic GPU interpreter cannot run tiled shared-memory loads")


# --- the contract ---------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e-3, 0.3, 40.0])
def test_planes_reconstruct_z_to_fifteen_bits_with_a_power_of_two_scale(scale):
  z = np.array(jax.random.normal(jax.random.key(1), (5, 256)) * scale)
  z[2] = 0.0   # an all-zero vector gives zero planes
  q_hi, q_lo, s_lo = map(np.asarray, int8_state.state_planes(jnp.asarray(z)))
  assert q_hi.dtype == q_lo.dtype == np.int8
  assert np.abs(q_hi).max() <= 127 and -128 <= q_lo.min() and q_lo.max() <= 127
  mantissa, _ = np.frexp(s_lo)
  np.testing.assert_array_equal(mantissa, 0.5)       # s_lo is a power of two
  rebuilt = (q_hi.astype(np.float64) * 256 + q_lo) * s_lo[:, None].astype(np.float64)
  span = np.abs(z).max(axis=1, keepdims=True)
  # |z - rebuilt| <= s_lo / 2 (and s = 256 s_lo < 2 max|z| / 127: about 15 bits).
  assert np.all(np.abs(rebuilt - z) <= s_lo[:, None] / 2)
  assert np.all(q_hi[2] == 0) and np.all(q_lo[2] == 0)
  # The scale is the smallest power of two with 127 s >= max|z|.
  s = s_lo.astype(np.float64) * 256
  nonzero = span[:, 0] > 0
  assert np.all(127 * s[nonzero] >= span[nonzero, 0])
  assert np.all(127 * s[nonzero] / 2 < span[nonzero, 0])


def test_planes_bias_is_exact_integer_arithmetic():
  """f32(D) · s_lo · scale with D the exact integer dot, against float64 NumPy."""
  z = jax.random.normal(jax.random.key(2), (3, 128))
  w2 = jax.random.normal(jax.random.key(3), (300, 128)).astype(jnp.bfloat16)
  q2, scale2 = wts_jax.quantize.quantize_rows(w2, "int8")
  bias = np.asarray(int8_state.planes_vocab_bias(z, q2, scale2))
  q_hi, q_lo, s_lo = map(np.asarray, int8_state.state_planes(z))
  exact = (q_hi.astype(np.int64) @ np.asarray(q2, np.int64).T * 256
           + q_lo.astype(np.int64) @ np.asarray(q2, np.int64).T)
  assert np.abs(exact).max() < 2 ** 30
  expected = (exact.astype(np.float32) * s_lo[:, None]) * np.asarray(scale2)
  np.testing.assert_array_equal(bias, expected)
  # And it is W2 · z to the planes' and W2's precision.
  dense = np.asarray(z, np.float64) @ np.asarray(w2, np.float64).T
  assert np.abs(bias - dense).max() < 0.02 * np.abs(dense).max()


def test_stored_w1_planes_equal_the_planes_of_each_row():
  head, config = planes_head(300, 64)
  serial = head.markov_head
  planes = np.asarray(serial.markov_w1_planes.planes[...]).reshape(300, 2, 64)
  q_hi, q_lo, s_lo = int8_state.state_planes(serial.markov_w1.weight[...])
  np.testing.assert_array_equal(planes[:, 0], np.asarray(q_hi))
  np.testing.assert_array_equal(planes[:, 1], np.asarray(q_lo))
  np.testing.assert_array_equal(np.asarray(serial.markov_w1_planes.scale[...]),
                                np.asarray(s_lo))


def test_reference_walk_follows_the_planes_contract():
  """The XLA walk of a planes head, replayed in NumPy from the contract's formula."""
  head, config = planes_head(500, 64, seed=4)
  base, first, _ = random_inputs(config, 2, 5, jax.random.key(5))
  out = wts_jax.walk(head, base, first, impl="xla", return_logits=True)
  serial = head.markov_head
  w1 = np.asarray(serial.markov_w1.weight[...].astype(jnp.float32))
  q2 = np.asarray(serial.markov_w2.weight[...], np.int64)
  scale2 = np.asarray(serial.markov_w2.scale[...])
  token = np.asarray(first)
  for k in range(5):
    q_hi, q_lo, s_lo = map(np.asarray, int8_state.state_planes(jnp.asarray(w1[token])))
    d = q_hi.astype(np.int64) @ q2.T * 256 + q_lo.astype(np.int64) @ q2.T
    logits = (d.astype(np.float32) * s_lo[:, None]) * scale2 + np.asarray(
        base[:, k], np.float32)
    # XLA may fuse the last product and the base-logit add into one FMA: an ulp.
    np.testing.assert_allclose(np.asarray(out.logits[:, k]), logits, rtol=0, atol=1e-6)
    token = np.argmax(logits, axis=1)
    np.testing.assert_array_equal(np.asarray(out.tokens[:, k]), token)


def test_quantize_refuses_planes_for_fp8_and_unknown_states():
  head, _ = planes_head(300, 64)
  with pytest.raises(ValueError, match="state='planes' needs scheme='int8'"):
    quantize_w2(head, "fp8", state="planes")
  with pytest.raises(ValueError, match="state='bf16' must be one of"):
    quantize_w2(head, "int8", state="bf16")


# --- the Mosaic kernel ----------------------------------------------------------------
def test_plan_of_a_planes_walk():
  plan = mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                                 smem_per_block=H200_SMEM, batch=1, w2_itemsize=1,
                                 int8_state=True)
  assert plan.gemv == "wgmma" and plan.int8_state
  # The most resident chunks that leave a 2-slot ring whole rounds: 10 + 2 of 13 slots.
  assert (plan.resident_chunks, plan.ring_stages) == (10, 2)
  held = mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                                 smem_per_block=H200_SMEM, batch=1, w2_itemsize=1,
                                 int8_state=True, register_chunks=6)
  # 6 chunks in registers leave 12, which all fit the 13 slots: the whole W2 on chip.
  assert (held.resident_chunks, held.ring_stages, held.streamed_chunks) == (12, 0, 0)
  assert "6 in registers" in held.describe() and "(100% of W2)" in held.describe()
  with pytest.raises(ValueError, match="only as int8 WGMMA operands"):
    mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                            smem_per_block=H200_SMEM, register_chunks=2)
  assert "two int8 planes" in plan.describe()
  with pytest.raises(ValueError, match="int8 planes of z run on the WGMMA"):
    mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                            smem_per_block=H200_SMEM, w2_itemsize=1, int8_state=True,
                            gemv="registers")


def test_only_the_mosaic_kernel_runs_aplanes_head():
  head, config = planes_head(1000, 64)
  base = jnp.zeros((1, 3, 1000), jnp.bfloat16)
  from wts_jax.pallas import backend
  triton = wts_jax.TritonConfig(interpret=True)
  assert "two int8 planes" in backend.refusal_reason("triton", head, 1, triton)
  registers = wts_jax.MosaicRowConfig(gemv="registers")
  assert "runs on the WGMMA GEMV" in backend.refusal_reason("mosaic_row", head, 1,
                                                           registers)
  # "auto" takes a Mosaic kernel: the one kernel family that runs it.
  shapes = backend.WalkShapes.of(base, greedy=True)
  assert backend.choose(head, shapes, "auto", None, require_gpu=False,
                        device=H200).impl.startswith("mosaic_")


@pytest.mark.parametrize("batch, greedy, resident, registers", [
    (1, True, None, 0), (4, False, 9, 0), (1, True, 12, 0), (1, True, 8, 6),
    (2, False, 10, 4)])
def test_planes_walk_lowers_for_cuda_at_the_qwen3_shape(batch, greedy, resident,
                                                        registers):
  """Shared-memory residency and the ring; chunks held in registers as the WGMMA's A
  operand (the interpreter's WGMMA takes shared-memory operands only: these run on the
  GPU)."""
  plan = mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                                 smem_per_block=H200_SMEM, batch=batch, w2_itemsize=1,
                                 int8_state=True, resident_chunks=resident,
                                 register_chunks=registers)
  assert plan.streamed_chunks == plan.chunks - plan.resident_chunks - registers
  spec = RowSpec(plan=plan, batch=batch, steps=7, greedy=greedy,
                 spin_limit=1 << 22, interpret=False)
  shape = jax.ShapeDtypeStruct
  sampled = {} if greedy else dict(seed=shape((2,), jnp.uint32),
                                   score_scale=shape((batch,), jnp.float32),
                                   noise_on=shape((batch,), jnp.int32))

  def launch(w2, base, w1, first, w2_scale, w1_scale, **kwargs):
    return row_walk(spec, w2, base, w1, first, w2_scale=w2_scale,
                    w1_scale=w1_scale, **kwargs)
  lowered = jax.jit(launch).trace(
      shape((151936, 256), jnp.int8), shape((batch, 7, 151936), jnp.bfloat16),
      shape((2 * 151936, 256), jnp.int8), shape((batch,), jnp.int32),
      shape((151936,), jnp.float32), shape((151936,), jnp.float32), **sampled
  ).lower(lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()


# Everything resident (r = 64: 64-byte rows and swizzle); V % 64 = 8 with the clamped
# last chunk, all streamed, B = 3; sampled with one resident chunk + the ring; a token
# near the end of V (the planes tile clamps to V - 4).
PLANES_CASES = [(1000, 64, 1, 4, "auto", 0.0), (520, 128, 3, 3, "none", 0.0),
                (1000, 64, 2, 3, 64, 0.8), (264, 256, 4, 2, 128, 0.0)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab, rank, batch, steps, residency, temperature",
                         PLANES_CASES)
def test_mosaic_planes_walk_matches_the_reference(vocab, rank, batch, steps, residency,
                                                  temperature):
  """Exact tokens (greedy) and bit-identical sampled tokens against the XLA walk of the
  same planes head; confidence from the drafted tokens."""
  head, config = planes_head(vocab, rank, seed=11, confidence=True)
  base, first, hidden = random_inputs(config, batch, steps, jax.random.key(12))
  first = first.at[0].set(vocab - 1)   # the last token: its planes tile is clamped
  assert_mosaic_matches_xla(head, base, first, hidden, residency, temperature)


# --- on the GPU (WTS_GPU_TESTS=1 python -m pytest -m gpu tests/test_int8_planes.py) ---
@pytest.mark.gpu
@pytest.mark.skipif(not os.environ.get("WTS_GPU_TESTS") or jax.default_backend() != "gpu",
                    reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1")
@pytest.mark.parametrize("batch, temperature, residency, num_stages, registers", [
    (1, 0.0, "auto", None, 0), (1, 0.0, "auto", None, 6), (2, 0.0, 11 * 64, 1, 0),
    (4, 0.7, 9 * 64, 3, 0), (4, 0.7, "auto", None, 4), (1, 0.9, 0, 2, 0)])
def test_gpu_planes_walk_at_the_qwen3_shape(batch, temperature, residency, num_stages,
                                            registers):
  """132 blocks, the real exchange: tokens equal the XLA walk of the same planes head
  on fresh inputs, every split; the agreement with the bf16 walk is reported."""
  config = HeadConfig.qwen3_4b("vanilla", confidence=False)
  bf16 = wts_jax.make_head(config, seed=batch)
  head = quantize_w2(bf16, "int8", state="planes")
  for seed in range(3):
    base, first, _ = random_inputs(config, batch, 7, jax.random.key(100 + seed))
    key = jax.random.key(seed) if temperature else None
    walk_config = wts_jax.MosaicRowConfig(residency=residency, ring_stages=num_stages,
                                          register_chunks=registers)
    out = wts_jax.walk(head, base, first, impl="pallas", config=walk_config,
                       temperature=temperature, key=key)
    ref = wts_jax.walk(head, base, first, impl="xla", temperature=temperature, key=key)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert int(out.status) == 0
    plain = wts_jax.walk(bf16, base, first, impl="xla", temperature=temperature, key=key)
    print(f"agreement with the bf16 walk: "
          f"{float(np.mean(np.asarray(out.tokens) == np.asarray(plain.tokens))):.3f}")
