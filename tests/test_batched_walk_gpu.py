"""The batched Mosaic kernel on the GPU (H200): ``WTS_GPU_TESTS=1 python -m pytest -m gpu``.

The real Qwen3-4B DSpark shape (V = 151 936, r = 256, 132 blocks) against the XLA
reference on fresh random inputs: exact tokens greedy, the same tokens sampled with the
same key; bf16 and an int8 W2 with z as two int8 planes; B = 5 (padded to 8 rows), 16,
64 and 70 (two launches); every split from all streamed to the planner's; a NaN in the
base logits is reported; repeats are identical; 1000 fresh walks (B = 16: bf16 and int8
planes, with a producer, the gated head, the split gated and rnn heads; greedy, and
sampled for bf16, int8 planes and the split gate; the split rnn head sampled at B = 40,
on M with two warpgroups) all equal the reference (at most two
first differing at one of its fp32 near-ties); the batch on the WGMMA's N at B =
5/16/64/70 (bf16) and 5/16/64 (int8 planes); two warpgroups a block on either axis at B
= 5/16/64 (bf16 and int8 planes); a producer warpgroup beside one or two computing
warpgroups on either axis; the gated head (z as a hi + lo bf16 pair) on either axis, one
or two warpgroups, B = 5/16/64/70; the gated head's gate and the rnn head's update split
over the blocks, and ``impl="auto"`` choosing them; logits and log-probabilities from
every Mosaic kernel; the L2 hints (streamed chunks kept, base tiles prefetched ahead);
``impl="auto"`` on an r = 64 int8-planes head at B = 2-32; int8 planes' scales loaded by
a thread a row and copied in windows.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax.bench.gate import compare_tokens, reference_tokens_and_gaps
from wts_jax.bench.registry import BenchMode
from wts_jax.device import H200
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.output import STATUS_NAN_LOGITS
from wts_jax.pallas import backend, mosaic_batched_backend
from wts_jax.quantize import quantize_w2
from wts_jax.walk_config import MosaicBatchedConfig, MosaicRowConfig, MosaicStackedConfig


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("WTS_GPU_TESTS") or jax.default_backend() != "gpu",
                       reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1"),
]

BATCHED = MosaicBatchedConfig()


@pytest.fixture(scope="module")
def head():
  return wts_jax.make_head(HeadConfig.qwen3_4b("vanilla", confidence=True), seed=0)


def _check(head, batch, temperature, seed, config=BATCHED, steps=7):
  base, first, hidden = random_inputs(head.config, batch, steps, jax.random.key(seed))
  key = jax.random.key(seed + 100) if temperature else None
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic", config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.confidence), np.asarray(ref.confidence),
                             atol=1e-3)
  assert int(out.status) == 0


@pytest.mark.parametrize("batch", [5, 16, 64, 70])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_tokens_equal_reference(head, batch, temperature):
  for seed in (1, 2, 3):   # fresh inputs each time
    _check(head, batch, temperature, seed)


@pytest.mark.parametrize("residency", ["none", 64, "auto"])
def test_splits(head, residency):
  _check(head, 24, 0.0, 7, config=MosaicBatchedConfig(residency=residency))


@pytest.fixture(scope="module")
def planes_head(head):
  return quantize_w2(head, "int8", state="planes")


@pytest.mark.parametrize("batch", [5, 16, 64, 70])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_int8_planes_tokens_equal_reference(planes_head, batch, temperature):
  for seed in (1, 2):
    _check(planes_head, batch, temperature, seed)


@pytest.mark.parametrize("batch", [2, 5, 16, 32])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_auto_int8_planes_at_rank_64(batch, temperature):
  """An r = 64 int8-planes head under ``impl="auto"`` (its planes go on M below r = 128:
  on N their z staging does not lower) compiles and gives the reference's tokens."""
  config = dataclasses.replace(HeadConfig.qwen3_4b("vanilla"), rank=64)
  planes = quantize_w2(wts_jax.make_head(config, seed=3), "int8", state="planes")
  base, first, hidden = random_inputs(config, batch, 7, jax.random.key(batch))
  key = jax.random.key(batch + 100) if temperature else None
  shapes = backend.WalkShapes(batch=batch, steps=7, greedy=not temperature)
  assert backend.choose(planes, shapes).impl.startswith("mosaic_")
  out = wts_jax.walk(planes, base, first, hidden, temperature=temperature, key=key)
  ref = wts_jax.walk(planes, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.status) == 0


def test_auto_takes_batched_kernel(head):
  """On this GPU ``impl="auto"`` runs a 16-row vanilla walk on the batched Mosaic
  kernel (the tuned table), and the walk it runs gives the reference's tokens."""
  choice = backend.choose(head, backend.WalkShapes(batch=16, steps=7, greedy=True))
  assert choice.impl == "mosaic_batched" and hasattr(choice.plan.plan, "batch_axis")
  base, first, hidden = random_inputs(head.config, 16, 7, jax.random.key(0))
  out = wts_jax.walk(head, base, first, hidden)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla")
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


def test_nan_base_logits_reported(head):
  base, first, hidden = random_inputs(head.config, 16, 7, jax.random.key(5))
  base = base.at[3, 2, 1000].set(jnp.nan)
  out = jax.jit(lambda b: wts_jax.walk(head, b, first, hidden, impl="mosaic",
                                       config=BATCHED))(base)
  assert int(out.status) & STATUS_NAN_LOGITS


@pytest.mark.parametrize("head_fixture", ["head", "planes_head"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_on_m_reported_at_64_rows(request, head_fixture, temperature):
  """On M a greedy chunk's NaN check is read from its rows' maxima (Mosaic's max
  propagates NaN; interpret mode keeps the reduction): a NaN in the first chunk, the
  last, or a middle one sets the status; none does not."""
  head = request.getfixturevalue(head_fixture)
  base, first, hidden = random_inputs(head.config, 64, 7, jax.random.key(6))
  config = MosaicBatchedConfig(batch_axis="m")
  key = jax.random.key(7) if temperature else None
  walk = jax.jit(lambda b: wts_jax.walk(head, b, first, hidden, impl="mosaic", config=config,
                                        temperature=temperature, key=key))
  assert int(walk(base).status) == 0
  vocab = head.config.vocab_size
  for row, step, column in ((0, 0, 3), (63, 6, vocab - 1), (17, 3, vocab // 2)):
    out = walk(base.at[row, step, column].set(jnp.nan))
    assert int(out.status) & STATUS_NAN_LOGITS, (row, step, column)


@pytest.mark.parametrize("axis,planes", [("m", False), ("n", False), ("m", True)],
                         ids=["bf16-m", "bf16-n", "int8p-m"])
@pytest.mark.parametrize("num_blocks", [None, 4])
def test_vocabulary_tail_rows_on_either_axis(axis, planes, num_blocks):
  """V not a multiple of 64 (712): the last chunk's start is clamped to V - 64, and its
  base tile must still hold the rows [V - 64, V) — on M a copy into the tiled base slot
  moves whole tiles (a tail row's base logit was lost there before the fix). A spike in
  the base logits at each tail column wins; fresh random walks equal the reference."""
  # (int8 planes on N at r = 64: Mosaic finds no bank-conflict-free staging copy.)
  config = HeadConfig(vocab_size=712, rank=64, hidden_size=64)
  head = wts_jax.make_head(config, seed=1)
  if planes:
    head = quantize_w2(head, "int8", state="planes")
  mosaic = MosaicBatchedConfig(batch_axis=axis, num_blocks=num_blocks)
  base, first, hidden = random_inputs(config, 40, 1, jax.random.key(2))
  walk = jax.jit(lambda b: wts_jax.walk(head, b, first, hidden, impl="mosaic",
                                        config=mosaic).tokens)
  for column in (3, 647, 650, 703, 704, 705, 711):
    spiked = jnp.zeros_like(base).at[:, 0, column].set(1000.0)
    assert set(np.asarray(walk(spiked))[:, 0].tolist()) == {column}, column
  for seed, temperature in ((40, 0.0), (41, 0.0), (42, 0.8)):
    base, first, hidden = random_inputs(config, 40, 4, jax.random.key(seed))
    key = jax.random.key(seed + 100) if temperature else None
    out = wts_jax.walk(head, base, first, hidden, impl="mosaic", config=mosaic,
                       temperature=temperature, key=key)
    ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                       key=key)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert int(out.status) == 0


def test_repeats_identical(head):
  base, first, hidden = random_inputs(head.config, 64, 7, jax.random.key(9))
  key = jax.random.key(4)
  outs = [np.asarray(wts_jax.walk(head, base, first, hidden, impl="mosaic",
                                  config=BATCHED, temperature=1.0, key=key).tokens)
          for _ in range(3)]
  assert all((o == outs[0]).all() for o in outs)


@pytest.mark.parametrize("batch", [5, 16, 64, 70])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batch_on_n_tokens_equal_reference(head, batch, temperature):
  config = MosaicBatchedConfig(batch_axis="n")
  for seed in (31, 32):
    _check(head, batch, temperature, seed, config=config)


@pytest.mark.parametrize("batch", [5, 16, 64])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batch_on_n_int8_planes_tokens_equal_reference(planes_head, batch, temperature):
  _check(planes_head, batch, temperature, 33,
         config=MosaicBatchedConfig(batch_axis="n"))


@pytest.mark.parametrize("axis", ["m", "n"])
@pytest.mark.parametrize("batch", [5, 16, 64])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_two_warpgroups_tokens_equal_reference(head, planes_head, axis, batch, temperature):
  config = MosaicBatchedConfig(batch_axis=axis, warpgroups=2)
  _check(head, batch, temperature, 41, config=config)
  _check(planes_head, batch, temperature, 42, config=config)


@pytest.mark.parametrize("axis,warpgroups", [("n", 1), ("n", 2), ("m", 1), ("m", 2)])
@pytest.mark.parametrize("batch", [5, 16, 32, 64])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_producer_tokens_equal_reference(head, planes_head, axis, warpgroups, batch,
                                         temperature):
  """A producer warpgroup issuing every refill, beside one or two computing warpgroups,
  and the same split with the computing warpgroups refilling."""
  config = MosaicBatchedConfig(batch_axis=axis, warpgroups=warpgroups, producer=True)
  _check(head, batch, temperature, 51, config=config)
  _check(planes_head, batch, temperature, 52, config=config)
  if warpgroups == 2:
    _check(planes_head, batch, temperature, 53,
           config=dataclasses.replace(config, producer=False))


@pytest.mark.parametrize("axis,warpgroups,producer,batch", [("n", 2, True, 5),
                                                             ("n", 2, True, 16),
                                                             ("m", 2, True, 64),
                                                             ("m", 1, False, 70)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_plane_scales_tokens_equal_reference(planes_head, axis, warpgroups, producer, batch,
                                             temperature):
  """int8 planes' s_lo loaded by a thread a row (inline PTX; interpret mode runs scalar
  loads instead, so only checked here): the reference's tokens."""
  config = MosaicBatchedConfig(batch_axis=axis, warpgroups=warpgroups, producer=producer)
  _check(planes_head, batch, temperature, 63, config=config)


@pytest.fixture(scope="module")
def gated_head():
  return wts_jax.make_head(HeadConfig.qwen3_4b("gated", confidence=True), seed=4)


@pytest.mark.parametrize("axis,warpgroups,batch", [
    ("m", 1, 5), ("m", 1, 16), ("m", 1, 64), ("m", 1, 70), ("n", 1, 16), ("n", 1, 64),
    ("m", 2, 16), ("m", 2, 64), ("n", 2, 16)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_gated_tokens_equal_reference(gated_head, axis, warpgroups, batch, temperature):
  """The gated head on the batched kernel, its gate redundant: G_e streamed by the leader,
  the gate's WGMMA, z as a hi + lo bf16 pair."""
  config = MosaicBatchedConfig(batch_axis=axis, warpgroups=warpgroups,
                               serial_update="redundant")
  _check(gated_head, batch, temperature, 61, config=config)


@pytest.fixture(scope="module")
def rnn_head():
  return wts_jax.make_head(HeadConfig.qwen3_4b("rnn", confidence=True), seed=5)


SPLIT_GATE = MosaicBatchedConfig(serial_update="split")
REDUNDANT_GATE = MosaicBatchedConfig(serial_update="redundant")


@pytest.mark.parametrize("axis,warpgroups,batch", [
    ("m", 1, 5), ("m", 1, 64), ("m", 1, 70), ("n", 1, 16), ("m", 2, 64), ("n", 2, 16)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_split_gate_tokens_equal_reference(gated_head, axis, warpgroups, batch,
                                           temperature):
  """The gated head's gate split over the 132 blocks (8 units each in 32 of them, z
  through global memory and a second grid barrier a step)."""
  config = MosaicBatchedConfig(batch_axis=axis, warpgroups=warpgroups,
                               serial_update="split")
  _check(gated_head, batch, temperature, 74, config=config)


@pytest.fixture(scope="module")
def tabled_head(gated_head):
  return wts_jax.with_gate_table(gated_head)


@pytest.mark.parametrize("batch,warpgroups,producer", [
    (1, None, None), (5, None, None), (16, None, None), (16, 2, True), (32, None, None),
    (40, None, None)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_gate_table_tokens_equal_reference(tabled_head, batch, warpgroups, producer,
                                           temperature):
  """The gated head's gate from its table (one gathered row a token, z formed
  elementwise by the leader): the planner's plan, two warpgroups with a producer; past
  32 rows (the batch on M) "auto" splits the gate instead."""
  config = MosaicBatchedConfig(warpgroups=warpgroups, producer=producer,
                               serial_update="auto")
  shapes = backend.WalkShapes(batch=batch, steps=7, greedy=not temperature)
  assert mosaic_batched_backend.gate_table_walk(tabled_head, shapes, config) == (batch <= 32)
  _check(tabled_head, batch, temperature, 81, config=config)


@pytest.mark.parametrize("warpgroups", [None, 1])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_gate_table_asked_for_at_32_rows(tabled_head, warpgroups, temperature):
  """``serial_update="table"`` past the planner's range: 32 rows on N (with two
  warpgroups its staging leaves one ring slot a warpgroup), fresh inputs."""
  config = MosaicBatchedConfig(warpgroups=warpgroups, serial_update="table")
  for seed in (83, 84, 32):
    _check(tabled_head, 32, temperature, seed, config=config)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_gate_table_int8_w2_tokens_equal_reference(tabled_head, temperature):
  """The table gate beside an int8 W2 widened in registers (the planner's, at 16 rows)."""
  quantized = quantize_w2(tabled_head, "int8")   # (the table kept: W1 and G_e are)
  _check(quantized, 16, temperature, 82, config=MosaicBatchedConfig())


@pytest.mark.parametrize("axis,batch", [("m", 5), ("m", 16), ("m", 64), ("m", 70),
                                        ("n", 16)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_split_rnn_tokens_equal_reference(rnn_head, axis, batch, temperature):
  """The rnn head on the persistent batched kernel, its update split over the blocks (8
  units each in 32 of them; state and z through global memory, a second barrier)."""
  config = MosaicBatchedConfig(batch_axis=axis, serial_update="split")
  _check(rnn_head, batch, temperature, 75, config=config)


@pytest.mark.parametrize("batch", [1, 16, 64])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rnn_with_its_contiguous_j_h_equals_reference(rnn_head, batch, temperature):
  """The API's rnn walk (``auto``) of the head with J_h beside ``joint_proj``
  (``wts_jax.with_joint_hidden``, as wts-bench walks it), int8 W2 at B 16."""
  head = quantize_w2(rnn_head, "int8") if batch == 16 else rnn_head
  _check(wts_jax.with_joint_hidden(head), batch, temperature, 76, config=None)


JOINT_TABLE = MosaicBatchedConfig(serial_update="table")


@pytest.fixture(scope="module")
def joint_rnn_head(rnn_head):
  return wts_jax.with_joint_table(rnn_head)


@pytest.mark.parametrize("batch", [1, 5, 16])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("w2", ["bf16", "int8"])
def test_rnn_joint_table_tokens_equal_reference(joint_rnn_head, batch, temperature, w2):
  """The rnn head with its joint table (``serial_update="table"``; "auto" takes it up to
  4 rows), the batch on N: J_e e gathered, J_s s published a step ahead, no second
  barrier — the reference's tokens (bf16, and an int8 W2 widened for the WGMMA)."""
  head = quantize_w2(joint_rnn_head, "int8") if w2 == "int8" else joint_rnn_head
  shapes = backend.WalkShapes(batch=batch, steps=7, greedy=temperature == 0.0)
  spec = mosaic_batched_backend.plan(head, shapes, JOINT_TABLE, H200)
  assert spec.plan.joint_table and not spec.plan.split
  _check(head, batch, temperature, 120 + batch, config=JOINT_TABLE)


@pytest.mark.parametrize("head_type,axis,batch", [
    ("gated", "m", 5), ("gated", "n", 16), ("gated", "m", 64), ("rnn", "m", 16),
    ("rnn", "m", 64), ("vanilla", "n", 13), ("vanilla", "m", 64)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_int8_w2_widened_tokens_equal_reference(head, gated_head, rnn_head, head_type, axis,
                                                batch, temperature):
  """An int8 W2 (quantized without planes) widened to bf16 on the batched kernel, its
  row scales in the epilogue (kernel="batched"; the planner's other choices)."""
  base_head = {"vanilla": head, "gated": gated_head, "rnn": rnn_head}[head_type]
  config = MosaicBatchedConfig(batch_axis=axis)
  _check(quantize_w2(base_head, "int8"), batch, temperature, 80 + batch, config=config)


@pytest.mark.parametrize("head_type,batch,warpgroups", [
    ("gated", 5, None), ("gated", 16, 2), ("gated", 64, 1), ("rnn", 16, None), ("rnn", 64, None),
    ("vanilla", 13, None), ("vanilla", 64, 2), ("vanilla", 70, None)])
@pytest.mark.parametrize("widening", ["registers", "smem"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_int8_w2_widened_in_the_kernel_tokens_equal_reference(
    head, gated_head, rnn_head, head_type, batch, warpgroups, widening, temperature):
  """An int8 W2 streamed as int8 and widened in the kernel (into the WGMMA's A operand,
  or through a bf16 tile in shared memory), the batch on N, at the real shape."""
  base_head = {"vanilla": head, "gated": gated_head, "rnn": rnn_head}[head_type]
  config = MosaicBatchedConfig(w2_widening=widening, warpgroups=warpgroups)
  _check(quantize_w2(base_head, "int8"), batch, temperature, 90 + batch, config=config)


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("batch", [4, 16])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_int8_w2_auto_widens_in_registers(head, gated_head, rnn_head, head_type, batch,
                                          temperature):
  """The Mosaic walk's own choices for an int8 W2 (no planes) up to 16 rows: the chunk
  widened in registers, the batch on N (the rnn head's sampled walk to 4 rows, NOTES
  v21); tokens equal the reference's."""
  quantized = quantize_w2({"vanilla": head, "gated": gated_head, "rnn": rnn_head}[head_type],
                          "int8")
  shapes = backend.WalkShapes(batch=batch, steps=7, greedy=not temperature)
  spec = backend.choose(quantized, shapes, "mosaic").plan
  in_registers = head_type != "rnn" or not temperature or batch <= 4
  assert spec.plan.w2_widening == ("registers" if in_registers else "xla")
  _check(quantized, batch, temperature, 110 + batch, config=None)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_auto_runs_gated_and_rnn_on_the_split_kernel(gated_head, rnn_head, temperature):
  """impl="auto" (the tuned table, the planner's axis and split update) at B = 1, 4 and
  64."""
  for head, batch, seed in ((gated_head, 1, 74), (gated_head, 4, 76), (gated_head, 64, 77),
                            (rnn_head, 1, 75), (rnn_head, 4, 78), (rnn_head, 64, 79)):
    base, first, hidden = random_inputs(head.config, batch, 7, jax.random.key(seed))
    assert (wts_jax.chosen_implementation(head, base, temperature=temperature)
            == "mosaic_batched")
    key = jax.random.key(seed + 100) if temperature else None
    out = wts_jax.walk(head, base, first, hidden, temperature=temperature, key=key)
    ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                       key=key)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


@pytest.mark.parametrize("head_name,w2,batch,temperature", [
    ("vanilla", "bf16", 16, 0.8), ("vanilla", "bf16", 64, 0.0), ("vanilla", "bf16", 64, 0.8),
    ("vanilla", "int8p", 16, 0.8), ("vanilla", "int8", 64, 0.0), ("tabled", "bf16", 16, 0.0),
    ("tabled", "bf16", 64, 0.8), ("tabled", "int8", 64, 0.8), ("rnn", "bf16", 5, 0.0),
    ("rnn", "bf16", 64, 0.0), ("rnn", "bf16", 64, 0.8), ("rnn", "int8", 16, 0.8)])
def test_ring_refill_before_epilogue_equals_reference(head, tabled_head, rnn_head, head_name,
                                                      w2, batch, temperature):
  """The API's walks with each streamed chunk's ring slot refilled (or released to the
  producer) as soon as its accumulator is read, at the plans it changes: 1-slot rings
  (the gated and rnn heads' sampled walks at 64 rows), a producer (vanilla greedy),
  int8 planes on N, an int8 W2 copied to bf16; fresh inputs."""
  model = {"vanilla": head, "tabled": tabled_head, "rnn": rnn_head}[head_name]
  if w2 != "bf16":
    model = quantize_w2(model, "int8", state="planes" if w2 == "int8p" else "float")
  for seed in (71, 72):
    _check(model, batch, temperature, seed + batch, config=RING_REFILL_EARLY)


@pytest.mark.parametrize("head_name,w2,batch", [
    ("tabled", "bf16", 64), ("rnn", "int8", 1), ("rnn", "int8", 4), ("rnn", "int8", 16)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_gated_and_rnn_with_the_vanilla_heads_deeper_ring(
    monkeypatch, tabled_head, rnn_head, head_name, w2, batch, temperature):
  """The API's gated and rnn walks with the vanilla head's ring preference (ring slots
  before resident chunks) where it changes their plans at the Qwen3-4B shape: the gated
  head's default since v36 at 64 rows, bench_variants' wts-ring-deep for the rnn head;
  fresh inputs at each point."""
  from wts_jax.pallas.batched.auto import AUTO_RING_PREFERENCE
  monkeypatch.setattr(mosaic_batched_backend, "auto_ring_preference",
                      lambda **_: AUTO_RING_PREFERENCE)
  head = {"tabled": tabled_head, "rnn": rnn_head}[head_name]
  if w2 == "int8":
    head = quantize_w2(head, "int8")
  for seed in (91, 92):
    _check(head, batch, temperature, seed + batch, config=None)


@pytest.mark.parametrize("kernel,batch", [("rows", 1), ("batched", 16), ("batched", 64)])
def test_logits_and_logprobs_from_the_tokens(head, kernel, batch):
  """Asked for logits and log-probabilities, a Mosaic kernel's walk returns the
  reference's (computed after it from the drafted tokens)."""
  base, first, hidden = random_inputs(head.config, batch, 7, jax.random.key(81))
  kwargs = dict(temperature=0.8, key=jax.random.key(82), return_logits=True,
                return_logprobs=True)
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic",
                     config={"rows": MosaicRowConfig, "batched": MosaicBatchedConfig}[kernel](),
                     **kwargs)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", **kwargs)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.logits), np.asarray(ref.logits), rtol=1e-5,
                             atol=1e-4)
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs),
                             atol=1e-3)


# A top-2 gap at fp32 rounding of logits of a few units (an ulp at 4 is 4.8e-7); the
# gated head's z as hi + lo bf16 is exact to 2^-17 of each element.
FP32_TIE_MARGIN = 1e-5
PRODUCER_N2 = MosaicBatchedConfig(batch_axis="n", warpgroups=2, producer=True)
PRODUCER_M2 = MosaicBatchedConfig(batch_axis="m", warpgroups=2, producer=True)
AUTO = None   # (the Mosaic kernels' own choice)
TABLE_GATE = MosaicBatchedConfig(serial_update="table")
STACKED = MosaicStackedConfig()
RING_REFILL_EARLY = MosaicBatchedConfig(ring_refill="before_epilogue")


@pytest.mark.parametrize("w2,kernel_config,head_type,temperature,batch", [
    ("bf16", BATCHED, "vanilla", 0.0, 16), ("int8p", BATCHED, "vanilla", 0.0, 16),
    ("int8p", PRODUCER_N2, "vanilla", 0.0, 16), ("bf16", PRODUCER_M2, "vanilla", 0.0, 16),
    ("bf16", REDUNDANT_GATE, "gated", 0.0, 16), ("bf16", SPLIT_GATE, "gated", 0.0, 16),
    ("bf16", SPLIT_GATE, "rnn", 0.0, 16),
    ("bf16", BATCHED, "vanilla", 0.8, 16), ("int8p", BATCHED, "vanilla", 0.8, 16),
    ("bf16", SPLIT_GATE, "gated", 0.8, 16),
    # auto's choices for an int8 W2 (no planes) at 16 rows: widened in registers, two
    # warpgroups (vanilla, gated; the rnn head one, its sampled walk the bf16 copy)
    ("int8", AUTO, "vanilla", 0.0, 16), ("int8", AUTO, "gated", 0.0, 16),
    ("int8", AUTO, "rnn", 0.0, 16), ("int8", AUTO, "gated", 0.8, 16),
    ("int8", AUTO, "rnn", 0.8, 16),
    # past 32 rows the planner puts the batch on M; the rnn head's sampled walk there
    # takes two warpgroups with 1-slot rings
    ("bf16", SPLIT_GATE, "rnn", 0.8, 40),
    # int8 planes at 64 rows on M: the planner's z rows gathered by the leader's four warps
    # (greedy, "auto" takes the stacked kernel: the batched one by name)
    ("int8p", BATCHED, "vanilla", 0.0, 64), ("int8p", AUTO, "vanilla", 0.8, 64),
    # the gated head with its gate table ("auto"; at 32 rows asked for by name)
    ("table", AUTO, "gated", 0.0, 16), ("table", AUTO, "gated", 0.8, 16),
    ("table", TABLE_GATE, "gated", 0.0, 32),
    # the stacked int8-planes kernel: four phases, and two with shared rings; "auto"'s
    # at one row; its sampled walk by name
    ("int8p", STACKED, "vanilla", 0.0, 16), ("int8p", STACKED, "vanilla", 0.0, 64),
    ("int8p", AUTO, "vanilla", 0.0, 1), ("int8p", STACKED, "vanilla", 0.8, 40),
    # each streamed chunk's ring slot refilled before its epilogue: the producer's
    # releases (vanilla greedy, 64 rows) and the split gate's 1-slot rings (sampled)
    ("bf16", RING_REFILL_EARLY, "vanilla", 0.0, 64),
    ("bf16", RING_REFILL_EARLY, "gated", 0.8, 64),
    # the planner's greedy walks of the gated and rnn heads past 32 rows: two warpgroups
    # on M, 1-slot rings refilled early
    ("bf16", AUTO, "gated", 0.0, 64), ("bf16", AUTO, "rnn", 0.0, 64),
    # the rnn head with its joint table: no second barrier ("auto"'s up to 4 rows)
    ("joint", TABLE_GATE, "rnn", 0.0, 16), ("joint", AUTO, "rnn", 0.8, 4)],
    ids=["bf16", "int8p", "int8p-producer-n2", "bf16-producer-m2", "gated-bf16",
         "gated-split", "rnn-split", "bf16-sample", "int8p-sample",
         "gated-split-sample", "int8-auto", "gated-int8-auto", "rnn-int8-auto",
         "gated-int8-auto-sample", "rnn-int8-auto-sample", "rnn-split-sample-m2", "int8p-m64",
         "int8p-auto-sample-m64", "gated-table-auto", "gated-table-auto-sample",
         "gated-table-32", "int8p-stacked-16", "int8p-stacked-64", "int8p-auto-stacked-1",
         "int8p-stacked-sample-40", "bf16-ring-refill-early-64",
         "gated-ring-refill-early-sample-64", "gated-auto-greedy-64", "rnn-auto-greedy-64",
         "rnn-joint-table-16", "rnn-joint-table-auto-sample-4"])
def test_stress_1000_fresh_walks_equal_reference(w2, kernel_config, head_type, temperature,
                                                 batch):
  config = HeadConfig.qwen3_4b(head_type, confidence=False)
  head = wts_jax.make_head(config, seed=3)
  if w2 == "int8p":
    head = quantize_w2(head, "int8", state="planes")
  elif w2 == "int8":
    head = quantize_w2(head, "int8")
  elif w2 == "table":
    head = wts_jax.with_gate_table(head)
  elif w2 == "joint":
    head = wts_jax.with_joint_table(head)
  kernel = jax.jit(lambda h, b, f, x, key: wts_jax.walk(
      h, b, f, x, impl="mosaic", config=kernel_config, temperature=temperature,
      key=key).tokens)
  reference = jax.jit(lambda h, b, f, x, key: wts_jax.walk(
      h, b, f, x, impl="xla", temperature=temperature, key=key).tokens)
  mismatches, near_ties = [], []
  for i in range(1000):
    base, first, hidden = random_inputs(config, batch, 7, jax.random.key(2000 + i))
    key = jax.random.key(9000 + i) if temperature else None
    tokens = np.asarray(kernel(head, base, first, hidden, key))
    if np.array_equal(tokens, np.asarray(reference(head, base, first, hidden, key))):
      continue
    # A walk may first differ only where the reference's own top-2 gap is at fp32
    # rounding (two fp32 sums in different orders may order such a pair either way).
    mode = BenchMode("sample", temperature, key) if temperature else BenchMode("greedy")
    ref_tokens, gaps = reference_tokens_and_gaps(head, base, first, hidden, mode)
    passed, text, _ = compare_tokens(ref_tokens, tokens, gaps, margin=FP32_TIE_MARGIN)
    (near_ties if passed else mismatches).append(f"walk {i}: {text}")
  assert not mismatches, f"walks differ from the reference: {mismatches[:5]}"
  assert len(near_ties) <= 2, f"too many near-tie divergences: {near_ties}"


@pytest.mark.parametrize("head_fixture,axis,warpgroups,batch,temperature", [
    ("head", "n", 2, 16, 0.0), ("head", "m", 2, 64, 0.8), ("head", "m", 1, 5, 0.0),
    ("gated_head", "m", 1, 64, 0.0), ("rnn_head", "m", 1, 16, 0.8)])
def test_status_in_the_kernel_keeps_tokens_and_reports(request, head_fixture, axis,
                                                       warpgroups, batch, temperature):
  """``MosaicBatchedConfig(status="kernel")``: the 132 blocks' status bits counted before the
  last step's signal, block 0's word out of the kernel — the reference's tokens, a clean
  status; a NaN in the second warpgroup's chunks or a first token out of range reported
  (the gated head's and the rnn head's updates split over the blocks)."""
  head = request.getfixturevalue(head_fixture)
  config = MosaicBatchedConfig(batch_axis=axis, warpgroups=warpgroups, status="kernel")
  _check(head, batch, temperature, 83, config=config)
  base, first, hidden = random_inputs(head.config, batch, 7, jax.random.key(84))
  key = jax.random.key(85) if temperature else None
  walk = jax.jit(lambda b, f: wts_jax.walk(head, b, f, hidden, impl="mosaic", config=config,
                                           temperature=temperature, key=key))
  vocab = head.config.vocab_size
  for row, step, column in ((batch - 1, 6, vocab - 1), (0, 2, vocab // 2 + 5)):
    assert int(walk(base.at[row, step, column].set(jnp.nan), first).status) \
        & STATUS_NAN_LOGITS, (row, step, column)
  from wts_jax.output import STATUS_TOKEN_OUT_OF_RANGE
  assert int(walk(base, first.at[batch - 1].set(vocab)).status) & STATUS_TOKEN_OUT_OF_RANGE
