"""The batched Mosaic kernel (``pallas/batched``: the batch on the WGMMA's M) on the
CPU: its plan, its CUDA lowering at the real shape (132 blocks, B up to 64 a launch and
two launches past it), and its walk in Mosaic GPU interpret mode against the XLA walk —
exact tokens greedy, the same tokens sampled with the same key.

Interpret mode runs one block owning every chunk (no semaphores); the GPU suite
(tests/test_batched_walk_gpu.py) covers the 132-block exchange. jax 0.10.2's Mosaic GPU
interpreter cannot run tiled shared-memory loads, so the interpret cases need jax >= 0.11.
"""

import dataclasses
import functools
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax import output, validation
from wts_jax.device import H200 as H200_FACTS
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.pallas import backend, mosaic_batched_backend, preference
from wts_jax.pallas.batched import auto as batched_auto
from wts_jax.pallas.batched import plan as batched_plan
from wts_jax.pallas.batched.auto import AUTO_WIDEN_IN_REGISTERS_MAX, auto_w2_widening
from wts_jax.quantize import quantize_w2
from wts_jax.walk_config import MosaicBatchedConfig, MosaicRowConfig

from mosaic_checks import assert_walk_matches, mosaic_and_xla_walks
from near_tie_inputs import tie_broken_by_lo

pytestmark = pytest.mark.mosaic

H200_SMEM = 227 * 1024
NEEDS_INTERPRETER = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11),
    reason="jax 0.10's Mosaic GPU interpreter cannot run tiled shared-memory loads")


def _head(vocab, rank, confidence=False):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type="vanilla",
                      confidence=confidence)
  return wts_jax.make_head(config, seed=vocab + rank)


# (V, r, B, K, residency, temperature): everything resident; all streamed with
# V % 64 = 8 (the clamped last chunk) and B not a multiple of 8; the most rows a launch;
# past 64 rows (two launches, the second padded), sampled; r = 256 with one resident
# chunk beside the ring.
WALK_CASES = [(520, 64, 5, 3, "auto", 0.0), (1000, 128, 16, 4, "none", 0.0),
              (1000, 128, 13, 4, "none", 0.7), (776, 64, 64, 3, "auto", 0.0),
              (776, 64, 70, 3, 64, 1.0), (456, 256, 8, 2, 64, 0.0)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature", WALK_CASES)
def test_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature):
  head = _head(vocab, rank, confidence=True)
  for seed in (1, 2):   # fresh inputs
    _assert_matches_xla(head, batch, steps, residency, temperature, seed)


def _assert_matches_xla(head, batch, steps, residency, temperature, seed, batch_axis="m",
                        warpgroups=None, producer=None, serial_update="auto",
                        merge_tiles=None, w2_widening="auto"):
  """The batched kernel (interpret mode) against the XLA walk on fresh inputs: exact
  tokens (greedy), the same tokens with the same key (sampled), confidence close."""
  base, first, hidden = random_inputs(head.config, batch, steps, jax.random.key(seed))
  key = jax.random.key(seed + 10) if temperature else None
  config = MosaicBatchedConfig(interpret=True, residency=residency, batch_axis=batch_axis,
                               warpgroups=warpgroups, producer=producer,
                               serial_update=serial_update, merge_tiles=merge_tiles,
                               w2_widening=w2_widening)
  assert_walk_matches(*mosaic_and_xla_walks(head, base, first, hidden, impl="mosaic",
                                            config=config, temperature=temperature,
                                            key=key))


# The batch on the WGMMA's N (bf16): B not a multiple of 8, sampled, 64 rows, 61 rows (a
# 64-row plan whose base copies bring 61), two launches, one resident chunk beside the
# ring at r = 256.
BATCH_ON_N_CASES = [(520, 64, 5, 3, "auto", 0.0), (1000, 128, 13, 4, "none", 0.7),
                    (776, 64, 64, 3, "auto", 0.0), (520, 64, 61, 2, "none", 0.7),
                    (776, 64, 70, 3, 64, 1.0), (456, 256, 8, 2, 64, 0.0)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature", BATCH_ON_N_CASES)
def test_batch_on_n_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature):
  head = _head(vocab, rank, confidence=True)
  for seed in (3, 4):
    _assert_matches_xla(head, batch, steps, residency, temperature, seed, batch_axis="n")


# Two warpgroups a block, each half of its chunks, on either axis: B not a multiple of 8
# with an odd chunk count (one chunk repeated), sampled, 64 rows on M, and one resident
# chunk a warpgroup beside a 2-slot ring its 3 streamed chunks wrap around.
WARPGROUP_CASES = [(520, 64, 5, 3, "auto", 0.0, "n"), (1000, 128, 13, 4, "none", 0.7, "n"),
                   (776, 64, 64, 3, 64, 0.0, "m"), (456, 128, 16, 2, 128, 1.0, "n")]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature,axis",
                         WARPGROUP_CASES)
def test_two_warpgroups_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature,
                                         axis):
  head = _head(vocab, rank, confidence=True)
  _assert_matches_xla(head, batch, steps, residency, temperature, seed=6, batch_axis=axis,
                      warpgroups=2)


@NEEDS_INTERPRETER
@pytest.mark.parametrize("axis", ["m", "n"])
def test_two_warpgroups_int8_planes_tokens_equal_xla(axis):
  head = quantize_w2(_head(1000, 128), "int8", state="planes")
  _assert_matches_xla(head, 16, 3, "none", 0.7, seed=7, batch_axis=axis, warpgroups=2)


def _mosaic_launches(text: str) -> int:
  """How many Mosaic GPU kernels a lowered walk launches (its custom calls; the name
  appears in other places of the text too)."""
  return len(re.findall(r"custom_call @mosaic_gpu\w*\(", text))


def _warp_gather_on(monkeypatch):
  """Every batched plan with the z rows gathered by four warps (the planner's choice for
  int8 planes on M only)."""
  planned = mosaic_batched_backend.plan_batched

  def with_options(**kwargs):
    return dataclasses.replace(planned(**kwargs), warp_gather=True)
  monkeypatch.setattr(mosaic_batched_backend, "plan_batched", with_options)


# Two computing warpgroups and a producer on N (int8 planes, B not a multiple of 8,
# sampled); one computing warpgroup and a producer on M; no producer, two launches.
WARP_COPY_CASES = [(1000, 128, 13, 3, "none", 0.7, "n", 2, True, True),
                   (776, 64, 64, 3, 64, 0.0, "m", 1, True, False),
                   (520, 64, 70, 2, "auto", 0.0, "m", 1, False, False)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature,axis,warpgroups,"
                         "producer,int8", WARP_COPY_CASES)
def test_warp_level_copies_tokens_equal_xla(monkeypatch, vocab, rank, batch, steps,
                                            residency, temperature, axis, warpgroups,
                                            producer, int8):
  _warp_gather_on(monkeypatch)
  head = _head(vocab, rank, confidence=not int8)
  if int8:
    head = quantize_w2(head, "int8", state="planes")
  _assert_matches_xla(head, batch, steps, residency, temperature, seed=23, batch_axis=axis,
                      warpgroups=warpgroups, producer=producer)


# int8 planes: on N with two warpgroups and a producer (sampled, B not a multiple of 8),
# on M with one (rows past the batch), past 64 rows.
SCALAR_SCALE_CASES = [(1000, 128, 13, 3, "none", 0.7, "n", 2, True),
                      (776, 64, 20, 3, 64, 0.0, "m", 1, False),
                      (520, 64, 70, 2, "auto", 0.0, "m", 1, False)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature,axis,warpgroups,"
                         "producer", SCALAR_SCALE_CASES)
def test_row_plane_scales_tokens_equal_xla(vocab, rank, batch, steps, residency,
                                           temperature, axis, warpgroups, producer):
  """Each row's s_lo by a thread a row (whose PTX interpret mode replaces with scalar
  loads): the reference's tokens."""
  head = quantize_w2(_head(vocab, rank), "int8", state="planes")
  _assert_matches_xla(head, batch, steps, residency, temperature, seed=29, batch_axis=axis,
                      warpgroups=warpgroups, producer=producer)


@NEEDS_INTERPRETER
@pytest.mark.parametrize("axis", ["m", "n"])
def test_vocabulary_tail_base_tile(axis):
  """V = 712: the base logits' last tile holds the rows [V - 64, V), and the clamped last
  chunk reads its base logits from there (``base_start``): a spike at each tail column
  wins (the GPU test runs the same on the tiled copies this guards)."""
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  head = wts_jax.make_head(HeadConfig(vocab_size=712, rank=64, hidden_size=64), seed=1)
  base, first, hidden = random_inputs(head.config, 9, 1, jax.random.key(2))
  config = MosaicBatchedConfig(interpret=True, residency="none", batch_axis=axis,
                               warpgroups=1)
  walk = jax.jit(lambda b: wts_jax.walk(head, b, first, hidden, impl="mosaic",
                                        config=config).tokens)
  for column in (650, 704, 711):
    spiked = jnp.zeros_like(base).at[:, 0, column].set(1000.0)
    assert set(np.asarray(walk(spiked))[:, 0].tolist()) == {column}, column


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_int8_planes_at_rank_64_lower_for_cuda(temperature):
  """The planner's plan for int8 planes at r = 64 and 8 rows (on M) lowers; on N it
  did not (no conflict-free copy for the z staging)."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  text = lower_walk("vanilla", 8, 4, quantize="int8p", rank=64, temperature=temperature)
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("batch,axis,quantize", [(16, "n", "int8p"), (64, "m", None)])
def test_warp_level_copies_lower_for_cuda_at_the_qwen3_shape(monkeypatch, batch, axis,
                                                             quantize):
  """The warp-level copies lower at the real shape (two computing warpgroups and a
  producer)."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  _warp_gather_on(monkeypatch)
  config = MosaicBatchedConfig(num_blocks=132, batch_axis=axis, warpgroups=2, producer=True)
  text = lower_walk("vanilla", batch, 7, quantize=quantize, config=config)
  assert "mosaic_gpu" in text


# A producer warpgroup issuing the refills: beside two computing warpgroups on N
# (sampled, B not a multiple of 8) and on M (a resident chunk each beside the ring); beside
# one on M past 64 rows (two launches); 64 rows on N; int8 planes on N.
PRODUCER_CASES = [(1000, 128, 13, 4, "none", 0.7, "n", 2, False),
                  (776, 64, 64, 3, 128, 0.0, "m", 2, False),
                  (776, 64, 70, 3, 64, 1.0, "m", 1, False),
                  (776, 64, 64, 3, "none", 0.0, "n", 2, False),
                  (1000, 128, 16, 3, "none", 0.0, "n", 2, True)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature,axis,warpgroups,"
                         "int8", PRODUCER_CASES)
def test_producer_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature, axis,
                                   warpgroups, int8):
  head = _head(vocab, rank, confidence=not int8)
  if int8:
    head = quantize_w2(head, "int8", state="planes")
  _assert_matches_xla(head, batch, steps, residency, temperature, seed=8, batch_axis=axis,
                      warpgroups=warpgroups, producer=True)


# int8 W2 with z as two int8 planes: all streamed and sampled; past 64 rows; r = 256
# beside the ring (V % 32 = 8: the last scale window is clamped).
PLANES_CASES = [(1000, 128, 16, 4, "none", 0.7), (776, 64, 70, 3, 64, 1.0),
                (456, 256, 8, 2, 64, 0.0)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature", PLANES_CASES)
@pytest.mark.parametrize("batch_axis", ["m", "n"])
def test_int8_planes_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature,
                                      batch_axis):
  head = quantize_w2(_head(vocab, rank), "int8", state="planes")
  if batch_axis == "n" and rank < batched_plan.PLANES_ON_N_MIN_RANK:
    with pytest.raises(ValueError, match=f"rank={rank}"):
      _assert_matches_xla(head, batch, steps, residency, temperature, seed=5,
                          batch_axis=batch_axis)
    return
  _assert_matches_xla(head, batch, steps, residency, temperature, seed=5,
                      batch_axis=batch_axis)


def _gated_head(vocab, rank, confidence=False):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type="gated",
                      confidence=confidence)
  return wts_jax.make_head(config, seed=vocab + rank + 1)


# The gated head (z = σ(G_h h + G_e e + b) ⊙ e in fp32, a hi + lo bf16 pair against W2;
# G_e streamed through the leader's ring): every chunk resident (the ring carries only
# G_e), all streamed and sampled with B not a multiple of 8, r = 256 (four G_e chunks)
# beside a resident chunk, 64 rows on N, past 64 rows (two launches), two warpgroups on
# either axis.
GATED_CASES = [(520, 64, 5, 3, "auto", 0.0, "m", 1), (1000, 128, 13, 4, "none", 0.7, "m", 1),
               (456, 256, 8, 3, 64, 0.0, "m", 1), (1000, 128, 64, 3, "none", 0.0, "n", 1),
               (776, 64, 70, 3, 64, 1.0, "m", 1), (1000, 128, 13, 4, "none", 0.7, "n", 2),
               (776, 64, 64, 3, 64, 0.0, "m", 2), (456, 256, 16, 2, 128, 1.0, "n", 2)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature,axis,warpgroups",
                         GATED_CASES)
def test_gated_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature, axis,
                                warpgroups):
  head = _gated_head(vocab, rank, confidence=True)
  _assert_matches_xla(head, batch, steps, residency, temperature, seed=12,
                      batch_axis=axis, warpgroups=warpgroups, serial_update="redundant")


# The gate split over the blocks (one block here owns every unit: its slice of z goes
# to global memory and back): every chunk resident, sampled and all streamed, 64 rows on
# N, past 64 rows with two warpgroups, two warpgroups on N.
SPLIT_GATE_CASES = [(520, 64, 5, 3, "auto", 0.0, "m", 1),
                    (1000, 128, 13, 4, "none", 0.7, "m", 1),
                    (1000, 128, 64, 3, "none", 0.0, "n", 1),
                    (776, 64, 70, 3, 64, 1.0, "m", 2),
                    (1000, 128, 13, 4, "none", 0.7, "n", 2)]


# The rnn head, its update split over the blocks (one block owns every unit here: its
# state and z go to global memory and back; r = 64, where J's rows fit one block).
RNN_CASES = [(520, 64, 5, 3, "none", 0.0, "m", 1), (1000, 64, 13, 4, "none", 0.7, "m", 1),
             (1000, 64, 64, 3, "none", 0.0, "n", 1), (776, 64, 70, 3, 64, 1.0, "m", 2),
             (1000, 64, 13, 4, "none", 0.7, "n", 2)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature,axis,warpgroups",
                         RNN_CASES)
def test_rnn_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature, axis,
                              warpgroups):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type="rnn",
                      confidence=True)
  head = wts_jax.make_head(config, seed=vocab + rank + 5)
  _assert_matches_xla(head, batch, steps, residency, temperature, seed=14,
                      batch_axis=axis, warpgroups=warpgroups, serial_update="split")


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature,axis,warpgroups",
                         SPLIT_GATE_CASES)
def test_split_gate_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature,
                                     axis, warpgroups):
  head = _gated_head(vocab, rank, confidence=True)
  _assert_matches_xla(head, batch, steps, residency, temperature, seed=13,
                      batch_axis=axis, warpgroups=warpgroups, serial_update="split")


# An int8 W2 that z meets as bf16 (vanilla) or as a hi + lo pair (gated, rnn): its values
# widened to bf16, its row scales in the epilogue. B not a multiple of 8, sampled, on
# either axis, two warpgroups, the gate redundant and split, every chunk resident.
WIDENED_CASES = [("vanilla", 520, 64, 5, 3, "none", 0.0, "m", 1, "auto"),
                 ("vanilla", 1000, 128, 13, 4, "auto", 0.7, "n", 2, "auto"),
                 ("gated", 1000, 128, 13, 4, "none", 0.7, "m", 1, "redundant"),
                 ("gated", 520, 64, 16, 3, "none", 0.0, "n", 1, "split"),
                 ("gated", 776, 64, 64, 3, 64, 1.0, "m", 2, "split"),
                 ("rnn", 1000, 64, 13, 4, "none", 0.7, "m", 1, "split"),
                 ("rnn", 776, 64, 40, 3, "none", 0.7, "m", 2, "split"),
                 ("rnn", 520, 64, 16, 3, "none", 0.0, "n", 1, "split")]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,vocab,rank,batch,steps,residency,temperature,axis,"
                         "warpgroups,update", WIDENED_CASES)
def test_int8_w2_widened_tokens_equal_xla(head_type, vocab, rank, batch, steps, residency,
                                          temperature, axis, warpgroups, update):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type=head_type,
                      confidence=True)
  head = quantize_w2(wts_jax.make_head(config, seed=vocab + rank + 7), "int8")
  choice = backend.choose(head, backend.WalkShapes.of(
      jnp.zeros((batch, steps, vocab), jnp.bfloat16), not temperature), "mosaic",
      MosaicBatchedConfig(interpret=True, batch_axis=axis), require_gpu=False)
  plan = choice.plan.plan
  assert plan.w2_row_scale and plan.w2_itemsize == 2
  assert "row scales in the epilogue" in plan.describe()
  for seed in (15, 16):
    _assert_matches_xla(head, batch, steps, residency, temperature, seed, batch_axis=axis,
                        warpgroups=warpgroups, serial_update=update)


def test_int8_w2_widened_is_what_auto_runs():
  """An int8 W2 of the gated and rnn heads (z not as planes) goes to the batched kernel
  widened to bf16 under impl="mosaic" too, and the backends' fallback preference takes
  it up to 64 rows, as the H200 table does at the Qwen3 shape (measured faster than the
  Triton kernel at every B; the table's own entries: test_walk_backends)."""
  for head_type in ("gated", "rnn"):
    config = HeadConfig(vocab_size=1000, rank=64, hidden_size=64, head_type=head_type)
    head = quantize_w2(wts_jax.make_head(config, seed=3), "int8")
    shapes = backend.WalkShapes.of(jnp.zeros((8, 3, 1000), jnp.bfloat16), True)
    spec = mosaic_batched_backend.plan(head, shapes,
                                       MosaicBatchedConfig(interpret=True, num_blocks=1),
                                       H200_FACTS)
    assert spec.plan.w2_row_scale and spec.plan.scaled
    assert spec.plan.w2_widening == "xla"   # (interpret mode: "registers" is the GPU's)
    one_row = backend.WalkShapes.of(jnp.zeros((1, 3, 1000), jnp.bfloat16), True)
    assert preference.mosaic_order(head, one_row)[0] == "mosaic_batched"
    for batch in (1, 4, 16, 64):   # (V = 1000: the planners' preference, as the table's)
      for greedy in (True, False):
        walk_shapes = backend.WalkShapes.of(jnp.zeros((batch, 3, 1000), jnp.bfloat16),
                                            greedy)
        assert preference.preference(head, walk_shapes, "NVIDIA H200")[0][0] == (
            "mosaic_batched")


# The int8 W2 streamed as int8 and widened in the kernel (through the warpgroup's bf16
# tile: what interpret mode runs), either axis: B not a multiple of 8, sampled, the gate
# and the rnn update split, chunks resident and streamed, two warpgroups, past 64 rows
# (two launches).
WIDENED_IN_KERNEL_CASES = [("vanilla", 520, 64, 13, 3, "none", 0.0, 1, "auto", "n"),
                           ("vanilla", 1000, 128, 16, 4, "auto", 1.0, 2, "auto", "n"),
                           ("vanilla", 776, 64, 64, 3, "none", 0.7, 2, "auto", "m"),
                           ("gated", 520, 64, 16, 3, "none", 0.7, 1, "split", "n"),
                           ("gated", 776, 128, 70, 2, 64, 0.0, 1, "split", "n"),
                           ("gated", 520, 64, 13, 3, "none", 0.0, 1, "split", "m"),
                           ("rnn", 520, 64, 5, 3, "auto", 0.0, 1, "split", "n"),
                           ("rnn", 1000, 64, 13, 4, "none", 0.7, 1, "split", "n"),
                           ("rnn", 776, 64, 64, 3, "none", 0.7, 2, "split", "m")]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,vocab,rank,batch,steps,residency,temperature,"
                         "warpgroups,update,axis", WIDENED_IN_KERNEL_CASES)
def test_int8_w2_widened_in_the_kernel_tokens_equal_xla(head_type, vocab, rank, batch,
                                                        steps, residency, temperature,
                                                        warpgroups, update, axis):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type=head_type,
                      confidence=True)
  head = quantize_w2(wts_jax.make_head(config, seed=vocab + rank + 9), "int8")
  plan = backend.choose(head, backend.WalkShapes.of(
      jnp.zeros((batch, steps, vocab), jnp.bfloat16), not temperature), "mosaic",
      MosaicBatchedConfig(interpret=True, num_blocks=1, w2_widening="smem",
                          warpgroups=warpgroups, residency=residency, serial_update=update,
                          batch_axis=axis), require_gpu=False).plan.plan
  assert (plan.w2_widening, plan.w2_itemsize, plan.batch_axis) == ("smem", 1, axis)
  assert "widened in the kernel, through smem" in plan.describe()
  for seed in (17, 18):
    _assert_matches_xla(head, batch, steps, residency, temperature, seed, batch_axis=axis,
                        warpgroups=warpgroups, serial_update=update, w2_widening="smem")


@pytest.mark.parametrize("n_lowers", [True, False], ids=["jax-0.11", "jax-0.10"])
def test_int8_w2_widened_in_the_kernel_plans_and_refusals(n_lowers, monkeypatch):
  """Streamed as int8 a chunk is half the bytes (more of them stay resident); the smem
  way counts its bf16 tiles; the batch must be on N, the gated head's gate split, and the
  registers way runs on the GPU only. (Planning only: whether jax lowers the batch on N
  is set here, so both cases run on either jax.)"""
  monkeypatch.setattr(mosaic_batched_backend, "BATCH_ON_N_LOWERS", n_lowers)
  head = jax.eval_shape(lambda: quantize_w2(wts_jax.make_head(HeadConfig.qwen3_4b("gated")),
                                            "int8"))
  shapes = backend.WalkShapes(batch=16, steps=7)
  def plan(**options):
    return mosaic_batched_backend.plan(head, shapes, MosaicBatchedConfig(**options),
                                       H200_FACTS)
  if not n_lowers:
    assert "needs the batch on N, which needs jax >= 0.11" in (
        plan(w2_widening="registers").reason)
    return
  fp32_base = mosaic_batched_backend.plan(
      head, backend.WalkShapes(batch=16, steps=7, base_itemsize=4),
      MosaicBatchedConfig(w2_widening="registers"), H200_FACTS)
  assert "needs the batch on N, which needs bf16 base logits" in fp32_base.reason
  copied, in_registers, through_smem = (plan(w2_widening=w, warpgroups=1).plan
                                        for w in ("xla", "registers", "smem"))
  assert (copied.w2_itemsize, in_registers.w2_itemsize, through_smem.w2_itemsize) == (2, 1, 1)
  assert in_registers.resident_chunks > copied.resident_chunks
  assert through_smem.resident_chunks < in_registers.resident_chunks   # its 32 KB tile
  assert in_registers.batch_axis == "n"
  assert "needs the batch on N" in plan(w2_widening="registers", batch_axis="m").reason
  assert plan(w2_widening="smem", batch_axis="m").plan.batch_axis == "m"
  assert "gate split" in plan(w2_widening="smem", serial_update="redundant").reason
  interpreted = mosaic_batched_backend.plan(
      head, shapes, MosaicBatchedConfig(interpret=True, num_blocks=1,
                                        w2_widening="registers"), H200_FACTS)
  assert "runs on the GPU only" in interpreted.reason
  # A bf16 W2 has nothing to widen: the option does not change its plan.
  bf16 = jax.eval_shape(lambda: wts_jax.make_head(HeadConfig.qwen3_4b("gated")))
  assert (mosaic_batched_backend.plan(bf16, shapes,
                                     MosaicBatchedConfig(w2_widening="registers"),
                                     H200_FACTS).plan
          == mosaic_batched_backend.plan(bf16, shapes, MosaicBatchedConfig(),
                                         H200_FACTS).plan)
  with pytest.raises(ValueError, match="w2_widening='vram' must be one of"):
    MosaicBatchedConfig(w2_widening="vram")


@pytest.mark.parametrize("lowers", [True, False], ids=["jax-0.11", "jax-0.10"])
def test_int8_w2_auto_widening_follows_the_measurement(lowers, monkeypatch):
  """widening "auto" at the Qwen3 shape on the GPU: into registers up to 16 rows (the
  batch on N; two warpgroups but for the rnn head; the rnn head's sampled walk to 4
  rows), a bf16 copy past them, with the batch on M, with the gate computed by every
  block and on jax 0.10 (NOTES v21). Whether jax lowers the batch on N is set here."""
  monkeypatch.setattr(mosaic_batched_backend, "BATCH_ON_N_LOWERS", lowers)
  def plan(head_type, batch, greedy=True, **options):
    head = jax.eval_shape(lambda: quantize_w2(
        wts_jax.make_head(HeadConfig.qwen3_4b(head_type)), "int8"))
    return mosaic_batched_backend.plan(
        head, backend.WalkShapes(batch=batch, steps=7, greedy=greedy),
        MosaicBatchedConfig(**options), H200_FACTS)
  for head_type in ("vanilla", "gated", "rnn"):
    for batch in (1, 5, 16):
      chosen = plan(head_type, batch).plan
      assert (chosen.w2_widening, chosen.batch_axis) == (
          ("registers", "n") if lowers else ("xla", "m"))
      sampled = plan(head_type, batch, greedy=False).plan.w2_widening
      assert sampled == ("registers" if lowers and (head_type != "rnn" or batch <= 4)
                         else "xla")
    assert plan(head_type, 17).plan.w2_widening == "xla"
    assert plan(head_type, 64).plan.w2_widening == "xla"
    assert plan(head_type, 16, batch_axis="m").plan.w2_widening == "xla"
  assert plan("gated", 16, serial_update="redundant").plan.w2_widening == "xla"
  if lowers:   # two computing warpgroups for the vanilla and gated heads, the rnn one (N)
    for greedy in (True, False):
      assert plan("vanilla", 16, greedy=greedy).plan.warpgroups == 2
      assert plan("gated", 16, greedy=greedy).plan.warpgroups == 2
      assert plan("rnn", 16, greedy=greedy).plan.warpgroups == 1
    assert plan("gated", 16, greedy=False, w2_widening="xla").plan.warpgroups == 1
  # The rnn head's sampled walk on M: two warpgroups, a 1-slot base ring each (NOTES v23).
  sampled_on_m = plan("rnn", 64, greedy=False).plan
  assert (sampled_on_m.batch_axis, sampled_on_m.warpgroups, sampled_on_m.base_stages) == (
      "m", 2, 1)
  assert plan("rnn", 64).plan.warpgroups == 1
  # One row: a greedy walk on the batched kernel where it widens in registers, a sampled
  # one on the row kernel.
  vanilla = jax.eval_shape(lambda: quantize_w2(
      wts_jax.make_head(HeadConfig.qwen3_4b("vanilla")), "int8"))
  for greedy in (True, False):
    first = preference.mosaic_order(vanilla, backend.WalkShapes(batch=1, steps=7,
                                                                greedy=greedy))[0]
    assert (first == "mosaic_batched") == (lowers and greedy)
  for batch in (1, 16, 17, 64):
    expected = "registers" if batch <= AUTO_WIDEN_IN_REGISTERS_MAX else "xla"
    assert auto_w2_widening(batch, batch_axis=None, gate_split=True,
                            in_registers_lowers=True) == expected
  assert auto_w2_widening(1, batch_axis=None, gate_split=True,
                          in_registers_lowers=False) == "xla"
  assert auto_w2_widening(AUTO_WIDEN_IN_REGISTERS_MAX, batch_axis=None, gate_split=True,
                          in_registers_lowers=True, recurrent=True, greedy=False) == "xla"


@pytest.mark.parametrize("head_type,batch,temperature,widening", [
    ("gated", 64, 0.0, "registers"), ("rnn", 16, 1.0, "registers"),
    ("vanilla", 64, 0.0, "registers"), ("vanilla", 5, 1.0, "smem"),
    ("gated", 5, 0.0, "smem"), ("gated", 64, 0.0, "smem"), ("rnn", 64, 1.0, "smem")])
def test_int8_w2_widened_in_the_kernel_lowers_for_cuda_at_the_qwen3_shape(
    head_type, batch, temperature, widening):
  """Mosaic GPU's layout checks accept the int8 chunk's load in the upcast layout, its
  conversion and its relayout into the WGMMA's A operand (registers) or tile (smem)."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if jax.__version_info__ < (0, 11) and (widening == "registers" or batch <= 32):
    pytest.skip("the batch on N (registers, or the planner's axis to 32 rows) lowers on "
                "jax >= 0.11")
  config = MosaicBatchedConfig(num_blocks=132, w2_widening=widening)
  text = lower_walk(head_type, batch, 7, temperature=temperature, quantize="int8",
                    config=config)
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("head_type,batch,temperature,axis", [
    ("gated", 64, 0.0, "m"), ("gated", 16, 1.0, "n"), ("rnn", 64, 1.0, "m"),
    ("vanilla", 16, 0.0, "n")])
def test_int8_w2_widened_lowers_for_cuda_at_the_qwen3_shape(head_type, batch, temperature,
                                                            axis):
  """An int8 W2 widened to bf16 with its row scales lowers at the real shape."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  config = MosaicBatchedConfig(num_blocks=132, batch_axis=axis,
                               serial_update="auto" if head_type == "vanilla" else "split")
  text = lower_walk(head_type, batch, 7, temperature=temperature, quantize="int8",
                    config=config)
  assert "mosaic_gpu" in text


@NEEDS_INTERPRETER
@pytest.mark.parametrize("update", ["redundant", "split"])
@pytest.mark.parametrize("axis", ["m", "n"])
def test_gated_z_lo_half_decides_a_near_tie(axis, update):
  """The lo half of z is not lost: at step 0 each row's two candidates are ordered one
  way by the exact z and the other way by z rounded to bf16 (a kernel without the lo
  WGMMA picks the other token)."""
  head = _gated_head(1000, 128)
  base, first, hidden = random_inputs(head.config, 8, 2, jax.random.key(21))
  base, expected = tie_broken_by_lo(head, base, first, hidden)
  config = MosaicBatchedConfig(interpret=True, residency="none", batch_axis=axis,
                               serial_update=update)
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic", config=config)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla")
  np.testing.assert_array_equal(np.asarray(ref.tokens)[:, 0], expected)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


@NEEDS_INTERPRETER
def test_mixed_temperatures_per_row():
  """Greedy rows stay greedy beside sampled ones (per-row 1/T and noise switch)."""
  head = _head(520, 64)
  base, first, hidden = random_inputs(head.config, 12, 3, jax.random.key(4))
  temperature = np.where(np.arange(12) % 3 == 0, 0.0, 0.9).astype(np.float32)
  key = jax.random.key(8)
  config = MosaicBatchedConfig(interpret=True)
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic", config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


def test_gated_plan_keeps_a_ring():
  """The gated head's G_e streams through the W2 ring: a ring even where every W2 chunk
  would fit, and 64 staged rows (its gate is a WGMMA with the batch on M) on either axis."""
  plan = batched_plan.plan_batched
  small = plan(vocab_size=4096, rank=64, batch=16, num_sms=132, smem_per_block=H200_SMEM,
               gated=True)
  assert small.ring_stages >= 1 and small.gate_chunks == 1
  qwen = plan(vocab_size=151936, rank=256, batch=16, num_sms=132, smem_per_block=H200_SMEM,
              batch_axis="n", gated=True)
  assert qwen.staged_rows == 64 and qwen.gate_chunks == 4
  # The ring first (3 slots measured faster than 1 resident + 2 ring slots).
  assert (qwen.resident_chunks, qwen.ring_stages) == (0, 3)
  assert qwen.smem_bytes <= H200_SMEM
  # Split over 132 blocks: 8 units a block (a WGMMA's smallest N), 32 blocks own them.
  split = plan(vocab_size=151936, rank=256, batch=64, num_sms=132, smem_per_block=H200_SMEM,
               gated=True, gate_split=True)
  assert (split.update_units, split.gate_chunks) == (8, 0) and split.smem_bytes <= H200_SMEM
  assert [batched_plan.split_update_units(rank, blocks) for rank, blocks in
          [(256, 132), (64, 4), (128, 1), (192, 5), (64, 132)]] == [8, 16, 128, 48, 8]
  with pytest.raises(ValueError, match="gate_split is the gated head's"):
    dataclasses.replace(split, gated=False)


def test_plan_at_the_qwen3_shape():
  plan = batched_plan.plan_batched(vocab_size=151936, rank=256, batch=64,
                                   num_sms=132, smem_per_block=H200_SMEM)
  assert (plan.chunks, plan.resident_chunks, plan.ring_stages, plan.base_stages) == (
      18, 2, 2, 3)
  assert plan.smem_bytes <= H200_SMEM and plan.batch_rows == 64
  assert batched_plan.plan_batched(
      vocab_size=151936, rank=256, batch=5, num_sms=132,
      smem_per_block=H200_SMEM).batch_rows == 8
  # All resident when it fits (a small vocabulary), whatever the ring default.
  small = batched_plan.plan_batched(vocab_size=4096, rank=64, batch=16, num_sms=132,
                                    smem_per_block=H200_SMEM)
  assert (small.resident_chunks, small.ring_stages) == (small.chunks, 0)


def test_planner_choices():
  """Staged rows of z on N (whole swizzle tiles a warp moves), the producer opt-in and
  exclusive of the deferred release, and a base ring of any size."""
  plan = batched_plan.plan_batched
  args = dict(vocab_size=151936, rank=256, num_sms=132, smem_per_block=H200_SMEM)
  assert [batched_plan.staged_rows_on_n(rows, rank, size) for rows, rank, size in
          [(8, 256, 2), (16, 256, 1), (8, 256, 1), (8, 64, 2), (40, 128, 2), (64, 64, 1)]
          ] == [8, 16, 16, 32, 48, 64]
  on_n = plan(batch=16, batch_axis="n", **args)
  assert on_n.staged_rows == 16 and not on_n.producer
  assert plan(batch=16, batch_axis="m", **args).staged_rows == 64
  # Staging 16 rows, not 64, leaves room for two more resident bf16 chunks.
  assert on_n.resident_chunks == plan(batch=16, batch_axis="m", **args).resident_chunks + 2
  with_producer = plan(batch=16, batch_axis="n", warpgroups=2, producer=True,
                       w2_itemsize=1, int8_state=True, **args)
  assert with_producer.producer
  assert plan(batch=16, base_stages=4, **args).base_stages == 4   # 4 does not divide 18


def test_ring_preference_and_stated_residency():
  """``ring_preference`` deepens the ring before any chunk stays resident (never past
  the W2 slots or the streamed chunks); stated resident chunks keep their slots and the
  ring takes what is left, one slot at least; a preference below one is refused."""
  plan = batched_plan.plan_batched
  args = dict(vocab_size=151936, rank=256, batch=64, num_sms=132, smem_per_block=H200_SMEM)
  default = plan(**args)
  deep = plan(**args, ring_preference=4)
  slots = default.resident_chunks + default.ring_stages
  assert (deep.ring_stages, deep.resident_chunks) == (min(4, slots), slots - min(4, slots))
  assert plan(**args, ring_preference=64).ring_stages == slots
  stated = plan(**args, ring_preference=4, resident_chunks=slots - 1)
  assert (stated.resident_chunks, stated.ring_stages) == (slots - 1, 1)
  with pytest.raises(ValueError, match="ring_preference=0 must be >= 1"):
    plan(**args, ring_preference=0)


def test_pair_on_n_where_both_halves_fit_one_tile():
  """z's two halves share one WGMMA with the batch on N: the int8 planes at any batch,
  a split update's hi + lo pair while both halves' rows fit 64; never on M."""
  plan = batched_plan.plan_batched
  args = dict(vocab_size=151936, rank=256, num_sms=132, smem_per_block=H200_SMEM)
  int8 = dict(w2_itemsize=1, int8_state=True)
  planes_b8 = plan(batch=8, batch_axis="n", **int8, **args)
  assert planes_b8.pair_on_n and (planes_b8.staged_rows, planes_b8.lo_offset) == (16, 16)
  assert plan(batch=64, batch_axis="n", **int8, **args).pair_on_n
  assert not plan(batch=16, batch_axis="m", **int8, **args).pair_on_n
  split_b32 = plan(batch=32, batch_axis="n", gated=True, gate_split=True, **args)
  assert split_b32.pair_on_n and split_b32.lo_offset == 32
  assert not plan(batch=40, batch_axis="n", recurrent=True, **args).pair_on_n
  assert not plan(batch=16, batch_axis="n", gated=True, **args).pair_on_n   # redundant gate
  assert not plan(batch=16, batch_axis="n", **args).pair_on_n   # a bf16 z: one half


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch=65), "batch=65 must be in"),
    (dict(rank=96), "rank=96 must be a multiple of 64"),
    (dict(base_stages=19), r"base_stages=19 must be in \[1, 18\]"),
    (dict(resident_chunks=3, ring_stages=0), "15 streamed chunks need a ring"),
    (dict(warpgroups=3), "warpgroups=3 must be 1 or 2"),
    (dict(resident_chunks=6, ring_stages=2), "exceed the 4 W2 chunks"),
    (dict(num_blocks=200), "num_blocks=200 exceeds the 132 SMs"),
    (dict(w2_itemsize=1), "only with z as two int8 planes"),
    (dict(int8_state=True), "int8 planes of z meet an int8 W2 only"),
    (dict(gated=True, w2_itemsize=1, int8_state=True), "gated head's batched walk needs a"),
    (dict(gated=True, ring_stages=0), "G_e through the W2 ring: ring_stages >= 1"),
])
def test_plan_refusals(kwargs, match):
  args = dict(vocab_size=151936, rank=256, batch=64, num_sms=132,
              smem_per_block=H200_SMEM)
  with pytest.raises(ValueError, match=match):
    batched_plan.plan_batched(**{**args, **kwargs})


def test_backend_routes_and_refuses():
  head = _head(1000, 64)
  base, first, hidden = random_inputs(head.config, 8, 3, jax.random.key(0))
  # Past 4 rows "auto" takes the batched kernel; "rows" refuses with the reason.
  with pytest.raises(ValueError, match="row kernel runs up to 4 rows"):
    wts_jax.walk(head, base, first, impl="mosaic",
                 config=MosaicRowConfig(interpret=True))
  rnn = wts_jax.make_head(HeadConfig(vocab_size=1000, rank=64, hidden_size=64,
                                     head_type="rnn"), seed=0)
  rbase, rfirst, rhidden = random_inputs(rnn.config, 8, 3, jax.random.key(0))
  # The rnn head: the batched kernel only ("auto" from one row), its update split.
  with pytest.raises(ValueError, match="row kernel runs the vanilla and gated heads"):
    wts_jax.walk(rnn, rbase[:1], rfirst[:1], rhidden[:1], impl="mosaic",
                 config=MosaicRowConfig(interpret=True))
  with pytest.raises(ValueError, match="rnn head with its update split over the blocks"):
    wts_jax.walk(rnn, rbase, rfirst, rhidden, impl="mosaic",
                 config=MosaicBatchedConfig(interpret=True, serial_update="redundant"))
  gated = _gated_head(1000, 64)
  with pytest.raises(ValueError, match="needs a bf16 or int8 W2"):
    wts_jax.walk(quantize_w2(gated, "fp8"), rbase, rfirst, rhidden, impl="mosaic",
                 config=MosaicBatchedConfig(interpret=True))
  with pytest.raises(ValueError, match="gated head runs without a producer"):
    wts_jax.walk(gated, rbase, rfirst, rhidden, impl="mosaic",
                 config=MosaicBatchedConfig(interpret=True, producer=True))
  with pytest.raises(ValueError, match="impl='mosaic_wide' must be one of"):
    wts_jax.walk(head, base, first, impl="mosaic_wide")


@pytest.mark.parametrize("batch,temperature,axis,warpgroups", [
    (64, 0.0, "m", 1), (64, 1.0, "m", 1), (5, 0.0, "m", 1), (96, 0.0, "m", 1),
    (16, 0.0, "n", 1), (64, 1.0, "n", 1), (64, 0.0, "m", 2), (16, 1.0, "n", 2)])
def test_lowers_for_cuda_at_the_qwen3_shape(batch, temperature, axis, warpgroups):
  """The whole 132-block kernel lowers through Mosaic GPU's layout checks on the CPU
  (B = 96: two launches), with the batch on the WGMMA's M or N, one or two warpgroups."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  config = MosaicBatchedConfig(num_blocks=132, batch_axis=axis, warpgroups=warpgroups)
  if axis == "n" and jax.__version_info__ < (0, 11):
    with pytest.raises(ValueError, match="batch_axis='n' needs jax >= 0.11"):
      lower_walk("vanilla", batch, 7, temperature=temperature, config=config)
    return
  text = lower_walk("vanilla", batch, 7, temperature=temperature, config=config)
  assert _mosaic_launches(text) == -(-batch // 64)


@pytest.mark.parametrize("batch,temperature,axis,warpgroups", [
    (64, 0.0, "m", 1), (16, 1.0, "m", 1), (16, 0.0, "n", 1), (64, 1.0, "n", 1),
    (16, 0.0, "n", 2), (64, 1.0, "m", 2)])
def test_int8_planes_lowers_for_cuda_at_the_qwen3_shape(batch, temperature, axis,
                                                        warpgroups):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  config = MosaicBatchedConfig(num_blocks=132, batch_axis=axis, warpgroups=warpgroups)
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11 (refused on 0.10: tested above)")
  text = lower_walk("vanilla", batch, 7, temperature=temperature, quantize="int8p",
                    config=config)
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("quantize", [None, "int8p"])
def test_base_logits_not_padded_on_n(quantize):
  """B not a multiple of 8 with the batch on N: the base logits go in as given (each copy
  brings the batch's rows, the slots' other rows are zeroed in the kernel), so the
  lowered walk pads nothing of the [B, K, V] logits; on M they are padded to 8 rows."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")

  def base_pads(axis):
    config = MosaicBatchedConfig(num_blocks=132, batch_axis=axis)
    text = lower_walk("vanilla", 5, 7, quantize=quantize, config=config)
    assert "mosaic_gpu" in text
    return [line for line in text.splitlines()
            if "stablehlo.pad" in line and "5x7x151936" in line]
  assert base_pads("n") == []
  assert base_pads("m")


@pytest.mark.parametrize("batch,temperature,axis,warpgroups,update", [
    (64, 0.0, "m", 1, "redundant"), (16, 1.0, "m", 2, "redundant"),
    (96, 0.0, "m", 1, "redundant"), (16, 0.0, "n", 1, "redundant"),
    (64, 1.0, "n", 2, "redundant"), (64, 0.0, "m", 1, "auto"),
    (16, 1.0, "n", 2, "split"), (64, 1.0, "m", None, "rnn"), (16, 0.0, "n", None, "rnn")])
def test_gated_lowers_for_cuda_at_the_qwen3_shape(batch, temperature, axis, warpgroups,
                                                   update):
  """The gated head on the batched kernel (G_e streamed, the gate's WGMMA, hi + lo; or the
  gate split over the blocks) and the rnn head (split) lower at the real shape (B = 96:
  two launches)."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  config = MosaicBatchedConfig(num_blocks=132, batch_axis=axis, warpgroups=warpgroups,
                               serial_update="split" if update == "rnn" else update)
  text = lower_walk("rnn" if update == "rnn" else "gated", batch, 7,
                    temperature=temperature, config=config)
  assert _mosaic_launches(text) == -(-batch // 64)


@pytest.mark.parametrize("head_type,rank,batch,temperature", [
    ("rnn", 64, 4, 0.0), ("rnn", 128, 64, 0.8), ("gated", 64, 64, 0.8),
    ("gated", 128, 16, 0.0)])
def test_split_update_lowers_at_the_smaller_ranks(head_type, rank, batch, temperature):
  """The tuned table sends gated and rnn walks of 2–64 rows to the batched kernel at
  every rank (measured at r = 256): at r = 64 and 128 the planner's split (fewer blocks
  own units) lowers too, on the planner's axis."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  config = MosaicBatchedConfig(num_blocks=132,
                               batch_axis=None if jax.__version_info__ >= (0, 11) else "m")
  text = lower_walk(head_type, batch, 7, temperature=temperature, config=config, rank=rank)
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("batch,temperature,axis,quantize", [
    (16, 0.0, "n", None), (64, 1.0, "m", None), (32, 0.0, "n", "int8p")])
def test_producer_lowers_for_cuda_at_the_qwen3_shape(batch, temperature, axis, quantize):
  """A producer warpgroup beside two computing warpgroups (three warpgroups, registers
  handed from the producer to the consumers) lowers at the real shape."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  config = MosaicBatchedConfig(num_blocks=132, batch_axis=axis, warpgroups=2, producer=True)
  text = lower_walk("vanilla", batch, 7, temperature=temperature, quantize=quantize,
                    config=config)
  assert "mosaic_gpu" in text
  if jax.__version_info__ >= (0, 11):   # (jax 0.10 serializes the kernel's module)
    assert "setmaxnreg" in text


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_lowers_for_cuda_with_a_vocab_not_a_multiple_of_64(temperature):
  """V = 712 (the sanitizer case: 4 blocks, the last chunk clamped): the base logits are
  padded to whole 64-column TMA tiles, so the kernel lowers; the exchange is the atomic
  one (4 blocks)."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import cuda_target
  config = HeadConfig(vocab_size=712, rank=64, hidden_size=64, head_type="vanilla")
  head = jax.eval_shape(lambda: wts_jax.make_head(config, seed=1))
  base = jax.ShapeDtypeStruct((5, 4, 712), jnp.bfloat16)
  first = jax.ShapeDtypeStruct((5,), jnp.int32)
  spec = mosaic_batched_backend.plan(
      head, backend.WalkShapes(batch=5, steps=4, greedy=temperature == 0.0),
      MosaicBatchedConfig(num_blocks=4, residency=64, ring_stages=2),
      H200_FACTS)
  mode = validation.make_sampling(temperature, jax.random.key(0) if temperature else None, 5)
  with cuda_target():
    text = jax.jit(lambda h, b, f: mosaic_batched_backend.launch(
        spec, backend.WalkOperands(h, b, f, None, mode))).trace(head, base, first).lower(
            lowering_platforms=("cuda",)).as_text()
  assert "red.relaxed.gpu.global.max.u64" in text


def _head_of_type(head_type, vocab, rank):
  """A head by name: vanilla (with a confidence head), int8p (an int8 W2 that z meets as
  two int8 planes), gated or rnn (with a confidence head)."""
  if head_type in ("gated", "rnn"):
    config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type=head_type,
                        confidence=True)
    return wts_jax.make_head(config, seed=vocab + rank + 7)
  head = _head(vocab, rank, confidence=head_type == "vanilla")
  return quantize_w2(head, "int8", state="planes") if head_type == "int8p" else head


def _overlap_options_on(monkeypatch, group=3):
  """Plans with WGMMAs overlapping epilogues in groups of ``group`` chunks."""
  planned = mosaic_batched_backend.plan_batched

  def with_option(**kwargs):
    return dataclasses.replace(planned(**kwargs), overlap_chunks=group)
  monkeypatch.setattr(mosaic_batched_backend, "plan_batched", with_option)


# Each chunk's WGMMA issued before the previous chunk's epilogue, in groups (a
# measurement option, off in the planner's plans), for each form of a chunk's WGMMAs:
# bf16 on N (13 chunks: groups of 3 and a tail of 1) and on M (two warpgroups of 8:
# groups of 3 and a tail of 2); int8 planes in one WGMMA on N (two computing warpgroups
# and a producer, sampled) and in two on M (groups of 2); the gated head's pair in two
# WGMMAs into one accumulator (M) and the split rnn's in one (N), past 64 rows.
OVERLAP_CASES = [("vanilla", 776, 64, 13, 3, "none", 0.0, "n", 1, None, 3),
                 ("vanilla", 1000, 128, 64, 3, 64, 0.7, "m", 2, None, 3),
                 ("int8p", 1000, 128, 13, 3, "none", 0.7, "n", 2, True, 3),
                 ("int8p", 520, 64, 20, 3, "none", 0.0, "m", 1, None, 2),
                 ("gated", 1000, 128, 13, 3, "none", 0.7, "m", 1, None, 4),
                 ("rnn", 1000, 64, 70, 3, "none", 0.0, "n", 1, None, 3)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,vocab,rank,batch,steps,residency,temperature,axis,"
                         "warpgroups,producer,group", OVERLAP_CASES)
def test_overlap_chunks_tokens_equal_xla(monkeypatch, head_type, vocab, rank, batch, steps,
                                         residency, temperature, axis, warpgroups,
                                         producer, group):
  _overlap_options_on(monkeypatch, group)
  _assert_matches_xla(_head_of_type(head_type, vocab, rank), batch, steps, residency, temperature, seed=31, batch_axis=axis,
                      warpgroups=warpgroups, producer=producer,
                      serial_update="split" if head_type == "rnn" else "auto")


@pytest.mark.parametrize("batch,axis,quantize,warpgroups", [(16, "n", "int8p", 2),
                                                            (64, "m", None, 1)])
def test_overlap_chunks_lower_for_cuda_at_the_qwen3_shape(monkeypatch, batch, axis, quantize,
                                                        warpgroups):
  """Overlapping chunks (one chunk's WGMMA left running while the previous chunk's
  accumulators are read) lower at the real shape, with wait_group 1 where it reads."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  _overlap_options_on(monkeypatch)
  config = MosaicBatchedConfig(num_blocks=132, batch_axis=axis, warpgroups=warpgroups)
  text = lower_walk("vanilla", batch, 7, quantize=quantize, config=config)
  assert "mosaic_gpu" in text
  if jax.__version_info__ >= (0, 11):   # (jax 0.10 serializes the kernel's module)
    assert "wgmma.wait_group.sync.aligned 1" in text


@NEEDS_INTERPRETER
@pytest.mark.parametrize("axis,batch", [("n", 13), ("m", 64)])
def test_out_of_range_first_tokens_reported_by_the_kernel(axis, batch):
  """Without a confidence head the batched kernel takes the first tokens as given: it
  clamps them and sets STATUS_TOKEN_OUT_OF_RANGE itself (no op before the launch),
  walking the reference's tokens from the clamped ids."""
  head = _head(776, 64)
  base, first, _ = random_inputs(head.config, batch, 3, jax.random.key(41))
  first = first.at[2].set(-3).at[batch - 1].set(776 + 5)
  config = MosaicBatchedConfig(interpret=True, residency="none", batch_axis=axis)
  # (Under jit: concrete out-of-range ids are refused eagerly, traced ones flagged.)
  out = jax.jit(lambda f: wts_jax.walk(head, base, f, impl="mosaic", config=config))(first)
  ref = jax.jit(lambda f: wts_jax.walk(head, base, f, impl="xla"))(first)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.status) == output.STATUS_TOKEN_OUT_OF_RANGE == int(ref.status)


# Warpgroup 1's per-element bests merged unreduced (``merge_tiles``, stated here for
# every head): int8 planes beside a producer (sampled, B not a multiple of 8), bf16
# greedy with V % 64 = 8, the split gate sampled.
MERGE_TILES_CASES = [("int8p", 1000, 128, 13, 3, 0.7, True),
                     ("vanilla", 776, 64, 5, 3, 0.0, None),
                     ("gated", 1000, 128, 13, 3, 0.7, None)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,vocab,rank,batch,steps,temperature,producer",
                         MERGE_TILES_CASES)
def test_merge_tiles_tokens_equal_xla(head_type, vocab, rank, batch, steps, temperature,
                                      producer):
  _assert_matches_xla(_head_of_type(head_type, vocab, rank), batch, steps, "none",
                      temperature, seed=43, batch_axis="n", warpgroups=2, producer=producer,
                      serial_update="split" if head_type == "gated" else "auto",
                      merge_tiles=True)


@NEEDS_INTERPRETER
def test_merge_tiles_report_warpgroup_ones_nan():
  """A NaN logit in either warpgroup's chunks still sets the status when warpgroup 1
  hands its bests over unreduced (its NaN tile joins the leader's reduction)."""
  head = _head(776, 64)
  base, first, _ = random_inputs(head.config, 8, 2, jax.random.key(47))
  config = MosaicBatchedConfig(interpret=True, residency="none", batch_axis="n",
                               warpgroups=2, merge_tiles=True)
  spec = mosaic_batched_backend.plan(head, backend.WalkShapes.of(base, True), config, H200_FACTS)
  assert spec.plan.merge_tiles
  walk = jax.jit(lambda b: wts_jax.walk(head, b, first, impl="mosaic", config=config))
  for column in (5, 770):   # a chunk of each warpgroup (chunks split into halves or turns)
    out = walk(base.at[3, 1, column].set(jnp.nan))
    assert int(out.status) & output.STATUS_NAN_LOGITS, column


@NEEDS_INTERPRETER
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_nan_on_m_reported(temperature):
  """With the batch on M, greedy and sampled: a NaN logit in a real row sets the status
  (in the first chunk and in the last, past the vocabulary's last whole tile); rows past
  the batch (their scale 0, their base padded) never do."""
  head = _head(776, 64)
  base, first, _ = random_inputs(head.config, 5, 2, jax.random.key(53))
  config = MosaicBatchedConfig(interpret=True, residency="none", batch_axis="m")
  key = jax.random.key(54) if temperature else None
  walk = jax.jit(lambda b: wts_jax.walk(head, b, first, impl="mosaic", config=config,
                                        temperature=temperature, key=key))
  assert int(walk(base).status) == 0
  for row, step, column in ((0, 0, 3), (4, 1, 775)):
    out = walk(base.at[row, step, column].set(jnp.nan))
    assert int(out.status) & output.STATUS_NAN_LOGITS, (row, step, column)


def test_merge_tiles_plan_counts_its_tiles():
  """The three [64, rows] tiles come out of the W2 slots' shared memory; the option
  needs two computing warpgroups with the batch on N."""
  plan = batched_plan.plan_batched
  args = dict(vocab_size=151936, rank=256, batch=32, num_sms=132, smem_per_block=H200_SMEM,
              batch_axis="n", w2_itemsize=1, int8_state=True, warpgroups=2)
  without, with_tiles = plan(**args), plan(**args, merge_tiles=True)
  assert with_tiles.merge_tiles and not without.merge_tiles
  fixed = functools.partial(batched_plan.fixed_bytes, chunks=18, rank=256,
                            base_stages=3, base_itemsize=2, scaled=True, int8_state=True,
                            batch_axis="n", base_rows=32, warpgroups=2, staged_rows=32)
  assert fixed(merge_tile_rows=32) - fixed() == 3 * 64 * 32 * 4
  # 24 KB more of fixed shared memory: at the H200's budget it fits beside the same slots;
  # where it does not, one 16 KB W2 slot fewer a warpgroup.
  tiles = 3 * 64 * 32 * 4
  assert (with_tiles.resident_chunks, with_tiles.ring_stages) == (
      without.resident_chunks, without.ring_stages)
  assert with_tiles.smem_bytes == without.smem_bytes + tiles <= H200_SMEM
  tight = {**args, "smem_per_block": without.smem_bytes + tiles - 1}
  without, with_tiles = plan(**tight), plan(**tight, merge_tiles=True)
  assert (with_tiles.resident_chunks, without.resident_chunks) == (
      without.resident_chunks - 1, without.resident_chunks)
  assert with_tiles.smem_bytes <= tight["smem_per_block"]
  with pytest.raises(ValueError, match="merge_tiles needs two computing warpgroups"):
    plan(**{**args, "warpgroups": 1}, merge_tiles=True)


@pytest.mark.parametrize("batch,quantize", [(16, "int8p"), (32, None)])
def test_merge_tiles_lower_for_cuda_at_the_qwen3_shape(batch, quantize):
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  config = MosaicBatchedConfig(num_blocks=132, batch_axis="n", warpgroups=2,
                               producer=quantize == "int8p", merge_tiles=True)
  assert "mosaic_gpu" in lower_walk("vanilla", batch, 7, quantize=quantize, config=config)


def test_profile_tool_reserves_what_the_compiled_kernel_exceeds(monkeypatch):
  """tools/profile_batched.py: a profile build the compiled kernel finds too large for
  shared memory is planned again with the excess reserved too; another error, or the
  last try's, is raised."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import profile_batched
  reserves = []
  def build(variant, heads, *, smem_reserve, profile_dir):
    reserves.append(smem_reserve)
    if len(reserves) == 1:
      raise ValueError("Mosaic GPU kernel exceeds available shared memory: "
                       "smem_bytes=260536 > max_smem_bytes=232448")
    return "built"
  monkeypatch.setattr(profile_batched, "build", build)
  variant = profile_batched.parse_variant("rnn:64:sample:a+x+E+i600")
  assert variant.profile_space == 600 and variant.ring_refill == "before_epilogue"
  assert profile_batched.parse_variant("rnn:64:sample:a+x+e").ring_refill == "after_epilogue"
  assert profile_batched.parse_variant("rnn:64:sample:a+x").ring_refill is None
  assert profile_batched.build_with_profile_space(variant, None, "dir") == "built"
  assert reserves[0] == 600 * 2 * 4 * 3 + 1024
  assert reserves[1] - reserves[0] == 260536 - 232448 + 1024
  def refused(variant, heads, **kwargs):
    raise ValueError("no W2 chunk fits")
  monkeypatch.setattr(profile_batched, "build", refused)
  with pytest.raises(ValueError, match="no W2 chunk fits"):
    profile_batched.build_with_profile_space(variant, None, "dir")


def test_profile_tool_isolates_each_profile_in_a_process(monkeypatch, tmp_path):
  """tools/profile_batched.py ``--isolate on``: each profile variant runs in a process of
  its own; its entry is merged, and a crash becomes that variant's ``profile_error``
  (exit status and the failed check above the native stack), the next variant still
  running."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import profile_batched
  commands = []
  def child(command, log_path):
    commands.append(command)
    text = command[command.index("--profile") + 1]
    out = command[command.index("--out") + 1]
    assert command[command.index("--isolate") + 1] == "off"
    if text.startswith("rnn"):
      Path(log_path).write_text("WARNING: a warning\nF1204 12:00 gpu_executable.cc:1] "
                                "Check failed: launch ok\n    @     0x7f  xla::Execute()\n")
      return -6
    Path(out).mkdir(parents=True)
    (Path(out) / "results.json").write_text(json.dumps(
        {"variants": {text: {"profile": {"blocks": 132}}}}))
    return 0
  monkeypatch.setattr(profile_batched, "run_child", child)
  monkeypatch.setattr(profile_batched, "Heads", lambda: None)
  assert profile_batched.main(["--out", str(tmp_path), "--variants", "",
                               "--profile", "rnn:64:sample:a+x,gated:64:sample:a+x"]) == 0
  results = json.loads((tmp_path / "results.json").read_text())["variants"]
  error = results["rnn:64:sample:a+x"]["profile_error"]
  assert "status -6" in error and "Check failed: launch ok" in error
  assert "@" not in error and "WARNING" not in error
  assert results["gated:64:sample:a+x"] == {"profile": {"blocks": 132}}
  assert len(commands) == 2


def test_profile_tool_child_is_killed_with_its_parent(tmp_path):
  """``run_child``: the child's exit status and output; interrupted, the child is killed
  before the interruption goes on (no process left running)."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import profile_batched
  log = tmp_path / "child.log"
  assert profile_batched.run_child([sys.executable, "-c", "print('hi'); raise SystemExit(3)"],
                                   str(log)) == 3
  assert log.read_text().strip() == "hi"
  pid_file = tmp_path / "pid"
  script = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
            "time.sleep(60)")
  def interrupt():   # (a real SIGINT: it ends the parent's wait for the child)
    while not pid_file.exists() or not pid_file.read_text():
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)
  threading.Thread(target=interrupt, daemon=True).start()
  with pytest.raises(KeyboardInterrupt):
    profile_batched.run_child([sys.executable, "-c", script], str(log))
  pid = int(pid_file.read_text())
  with pytest.raises(ProcessLookupError):
    os.kill(pid, 0)


def test_profile_tool_variants_name_what_they_set():
  """tools/profile_batched.py: a variant's options set only what they name (the rest is
  the planner's, the batch axis M unless ``n`` or ``a``); ``auto:`` and ``sweep:``
  expand; a bad option is refused."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import profile_batched
  variant = profile_batched.parse_variant("int8p:16:greedy:n+w2+P+M+r0+s4+b1")
  assert (variant.batch_axis, variant.warpgroups, variant.producer, variant.merge_tiles,
          variant.resident, variant.stages, variant.base_stages) == ("n", 2, True, True,
                                                                     0, 4, 1)
  plain = profile_batched.parse_variant("bf16:64:sample")
  assert (plain.batch_axis, plain.warpgroups, plain.producer, plain.merge_tiles,
          plain.stages, plain.base_stages, plain.greedy) == ("m", None, None, None, None,
                                                             None, False)
  assert profile_batched.parse_variant("bf16:5:greedy:a").batch_axis is None
  assert profile_batched.parse_variant("bf16:5:greedy:a+F").first_op
  autos = profile_batched.expand_variants("auto:int8p,bf16:4:greedy:N")
  assert len(autos) == 2 * len(profile_batched.AUTO_BATCHES) + 1
  assert all(profile_batched.parse_variant(v).batch_axis is None for v in autos[:-1])
  assert profile_batched.parse_variant(autos[-1]).merge_tiles is False
  assert "gated:64:sample:x+w2" in profile_batched.expand_variants("sweep:gated")
  with pytest.raises(SystemExit, match="bad option 'z'"):
    profile_batched.parse_variant("bf16:4:greedy:z")
  assert profile_batched.parse_variant("gated8:16:greedy:a+A").host_ahead
  assert profile_batched.DTYPES["rnn8"] == ("rnn", "int8")
  assert profile_batched.parse_variant("int8p:64:greedy:a+T").fixed_tokens


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_profile_tool_fixed_tokens_hold_each_rows_token(temperature):
  """tools/profile_batched.py ``T``: with each row's base logits spiked at a column of its
  own, the reference walk picks that token at every step (greedy and sampled), a
  different one each row."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import profile_batched
  head = _head(1000, 64)
  base, first, hidden = random_inputs(head.config, 6, 4, jax.random.key(3))
  key = jax.random.key(4) if temperature else None
  tokens = np.asarray(wts_jax.walk(head, profile_batched.with_fixed_tokens(base), first,
                                   hidden, impl="xla", temperature=temperature,
                                   key=key).tokens)
  assert (tokens == tokens[:, :1]).all()
  assert len(set(tokens[:, 0].tolist())) == 6


def test_profile_tool_splits_regions_by_warpgroup(tmp_path):
  """tools/profile_batched.py: a profile's regions are summarised over every trace and per
  warpgroup (a block's traces are its warpgroups, tids 1 + warpgroup + traces · block),
  so one warpgroup's lag behind the other shows."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import profile_batched
  events = []
  for block in range(2):
    for warpgroup, length in enumerate((100, 300, 50)):   # cycles in "mma" a warpgroup
      tid = 1 + warpgroup + 3 * block
      events += [{"pid": 1 + block, "tid": tid, "ph": "B", "name": "mma", "ts": 0.0},
                 {"pid": 1 + block, "tid": tid, "ph": "E", "name": "mma",
                  "ts": length / 1e3}]
  (tmp_path / "walk-trace.json").write_text(json.dumps({"traceEvents": events}))
  summary = profile_batched.summarise_profile(str(tmp_path), clock_ghz=1.0)
  assert summary["blocks"] == 6
  assert summary["regions"]["mma"]["median_us"] == 0.1
  by_warpgroup = summary["regions_by_warpgroup"]
  assert [by_warpgroup[w]["mma"] for w in ("0", "1", "2")] == [0.1, 0.3, 0.05]
  assert by_warpgroup["1"]["span_median_us"] == 0.3


# --- the status reduced in the kernel (``BatchedSpec.status="kernel"``) -----------------
@NEEDS_INTERPRETER
@pytest.mark.parametrize("warpgroups,axis,temperature", [(1, "m", 0.0), (2, "m", 0.7),
                                                         (2, "n", 0.0)])
def test_status_in_the_kernel_keeps_tokens_and_reports(warpgroups, axis, temperature):
  """One status word out of the kernel: the tokens as with the flags, a NaN in the
  second warpgroup's chunks and a first token out of range reported."""
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  head = _head(520, 64)
  base, first, _ = random_inputs(head.config, 5, 3, jax.random.key(12))
  key = jax.random.key(13) if temperature else None

  def walk(base, first, status):
    config = MosaicBatchedConfig(interpret=True, residency="none", batch_axis=axis,
                                 warpgroups=warpgroups, status=status)
    return wts_jax.walk(head, base, first, None, impl="mosaic", config=config,
                        temperature=temperature, key=key)
  flags, kernel = walk(base, first, "flags"), walk(base, first, "kernel")
  np.testing.assert_array_equal(np.asarray(kernel.tokens), np.asarray(flags.tokens))
  assert int(kernel.status) == int(flags.status) == 0
  # (traced first tokens: the API refuses concrete ones out of range up front)
  bad = jax.jit(lambda b, f: walk(b, f, "kernel"))(base.at[3, 1, 519].set(jnp.nan),
                                                    first.at[2].set(-1))
  assert int(bad.status) & output.STATUS_NAN_LOGITS
  assert int(bad.status) & output.STATUS_TOKEN_OUT_OF_RANGE


@pytest.mark.parametrize("head_type,batch,temperature,axis,warpgroups", [
    ("vanilla", 16, 0.0, "n", 2), ("vanilla", 64, 1.0, "m", 2), ("vanilla", 5, 0.0, "m", 1),
    ("gated", 64, 0.0, "m", 1), ("rnn", 16, 1.0, "m", 1)])
def test_status_in_the_kernel_lowers_for_cuda(head_type, batch, temperature, axis,
                                              warpgroups):
  """The 132-block kernel with its status reduced in the kernel lowers for CUDA (the
  split update's time-out counted too: gated B 64, rnn), and no reduce follows it."""
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  texts = {status: lower_walk(head_type, batch, 7, temperature=temperature,
                              config=MosaicBatchedConfig(num_blocks=132, batch_axis=axis,
                                                         warpgroups=warpgroups,
                                                         status=status))
           for status in ("flags", "kernel")}
  assert _mosaic_launches(texts["kernel"]) == 1
  after = {status: text.split("mosaic_gpu")[-1].count("stablehlo.reduce")
           for status, text in texts.items()}
  assert after["kernel"] == after["flags"] - 1, after   # (the status's reduce gone)


def test_status_forms_named():
  with pytest.raises(TypeError, match="status"):
    MosaicRowConfig(interpret=True, status="kernel")   # (the row kernel reduces after)
  with pytest.raises(ValueError, match="status='bad'"):
    MosaicBatchedConfig(status="bad")


@pytest.mark.parametrize("w2,status", [("bf16", "kernel"), ("int8", "kernel"),
                                       ("planes", "flags")])
def test_planners_status_where_each_measured_faster(w2, status):
  """The batched kernel's status by default: in the kernel for bf16 and int8 W2, after
  the launch for int8 planes (slower in the kernel at 16 sampled rows, NOTES v36); asked
  for, either form."""
  head = _head(1024, 64)
  if w2 != "bf16":
    head = quantize_w2(head, "int8", **({"state": "planes"} if w2 == "planes" else {}))
  shapes = backend.WalkShapes(batch=16, steps=7, greedy=False)
  for config, want in ((MosaicBatchedConfig(), status),
                       (MosaicBatchedConfig(status="flags"), "flags"),
                       (MosaicBatchedConfig(status="kernel"), "kernel")):
    spec = mosaic_batched_backend.plan(head, shapes, config, H200_FACTS)
    assert spec.plan.int8_state == (w2 == "planes") and spec.status == want


def test_planners_ring_before_residency_for_the_gated_head_not_the_rnn_head():
  """``auto_ring_preference``: the vanilla head, the gated head's table or split gate and
  the rnn head's joint table take ring slots before resident chunks (the split gate at 64
  rows with one warpgroup, Qwen3-4B: 3 slots, none resident), the rnn head's split update
  and a redundant gate the default two (NOTES v36, v40)."""
  assert (batched_auto.auto_ring_preference()
          == batched_auto.auto_ring_preference(recurrent=True, joint_table=True)
          == batched_auto.AUTO_RING_PREFERENCE > batched_plan.DEFAULT_RING_STAGES
          == batched_auto.auto_ring_preference(recurrent=True)
          == batched_auto.auto_ring_preference(redundant_gate=True))
  head = wts_jax.with_gate_table(wts_jax.make_head(HeadConfig.qwen3_4b("gated")))
  plan = mosaic_batched_backend.plan(head, backend.WalkShapes(batch=64, steps=7),
                             MosaicBatchedConfig(warpgroups=1), H200_FACTS).plan
  assert plan.gated and (plan.resident_chunks, plan.ring_stages) == (0, 3)


# A split update's hoisted terms read as the hoist gives them, [rows, K, n]: the rnn head
# and the split gate, M and N, greedy and sampled, 64 rows (no pad) and fewer.
HOISTED_ROWS_CASES = [("rnn", 1000, 64, 13, 4, 0.7, "m"), ("rnn", 776, 64, 64, 3, 0.0, "m"),
                      ("gated", 1000, 128, 64, 3, 0.0, "m"), ("gated", 520, 64, 13, 4, 0.7, "n")]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,vocab,rank,batch,steps,temperature,axis",
                         HOISTED_ROWS_CASES)
def test_hoisted_layouts_tokens_equal_xla(head_type, vocab, rank, batch, steps,
                                          temperature, axis):
  """A split update's hoisted terms as [rows, K, n]: the reference's tokens."""
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  if head_type == "gated":
    head = _gated_head(vocab, rank, confidence=True)
  else:
    head = wts_jax.make_head(HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64,
                                        head_type="rnn", confidence=True),
                             seed=vocab + rank + 5)
  _assert_matches_xla(head, batch, steps, "none", temperature, seed=16, batch_axis=axis,
                      warpgroups=1, serial_update="split")


@pytest.mark.parametrize("head_type", ["rnn", "gated"])
def test_hoisted_rows_lower_for_cuda_without_a_transpose(head_type):
  """At 64 rows (Qwen3-4B shape, the split update on M) the API's walk passes the hoisted
  terms to the kernel as the hoist gives them: no transpose between the hoist and the
  launch."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  config = MosaicBatchedConfig(num_blocks=132, batch_axis="m", warpgroups=1,
                               serial_update="split")
  text = lower_walk(head_type, 64, 7, config=config)
  assert _mosaic_launches(text) == 1
  assert "stablehlo.transpose" not in text.split("mosaic_gpu")[0]


# (head, V, r, B, K, temperature, batch axis, warpgroups, producer, ring slots): the
# plans whose W2 ring refills change with ``ring_refill``: a producer's releases, a
# 1-slot ring on N, the split gate and the rnn update with two warpgroups on M.
RING_REFILL_CASES = [("vanilla", 1000, 64, 13, 4, 0.0, "m", 2, True, None),
                     ("vanilla", 520, 64, 5, 3, 0.7, "n", 1, False, 1),
                     ("gated", 1000, 64, 13, 3, 0.7, "m", 2, False, 1),
                     ("rnn", 776, 64, 13, 3, 0.7, "m", 2, False, 1)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,vocab,rank,batch,steps,temperature,axis,warpgroups,"
                         "producer,ring_stages", RING_REFILL_CASES)
def test_ring_refill_before_epilogue_tokens_equal_xla(head_type, vocab, rank, batch, steps,
                                                      temperature, axis, warpgroups,
                                                      producer, ring_stages):
  """Each streamed chunk's ring slot refilled (or released to the producer) as soon as
  its accumulator is read (``MosaicBatchedConfig(ring_refill="before_epilogue")``): the same
  tokens as the XLA walk, fresh inputs."""
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  if head_type == "gated":
    head = _gated_head(vocab, rank, confidence=True)
  else:
    head = wts_jax.make_head(HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64,
                                        head_type=head_type, confidence=True),
                             seed=vocab + rank + 7)
  config = MosaicBatchedConfig(interpret=True, residency="none", batch_axis=axis,
                               warpgroups=warpgroups, producer=producer,
                               ring_stages=ring_stages,
                               serial_update="auto" if head_type == "vanilla" else "split",
                               ring_refill="before_epilogue")
  for seed in (31, 32):
    base, first, hidden = random_inputs(head.config, batch, steps, jax.random.key(seed))
    key = jax.random.key(seed + 10) if temperature else None
    spec = mosaic_batched_backend.plan(head, backend.WalkShapes(batch=batch, steps=steps,
                                                        greedy=not temperature),
                               config, H200_FACTS)
    assert spec.ring_refill == "before_epilogue" and spec.plan.ring_stages >= 1
    assert_walk_matches(*mosaic_and_xla_walks(head, base, first, hidden, impl="mosaic",
                                              config=config, temperature=temperature,
                                              key=key))


def test_ring_refill_refused_where_threads_read_the_slots():
  from wts_jax.pallas.batched.spec import BatchedSpec
  head, shapes = quantize_w2(_head(1024, 64), "int8"), backend.WalkShapes(batch=16, steps=3)
  smem = MosaicBatchedConfig(batch_axis="m", w2_widening="smem")
  spec = mosaic_batched_backend.plan(head, shapes, smem, H200_FACTS)
  assert spec.plan.widened_in_kernel and spec.ring_refill == "after_epilogue"
  refusal = mosaic_batched_backend.plan(head, shapes,
                                dataclasses.replace(smem, ring_refill="before_epilogue"),
                                H200_FACTS)
  assert isinstance(refusal, backend.Refusal)
  assert "w2_widening='smem'" in refusal.reason
  with pytest.raises(ValueError, match="ring_refill='before_epilogue' needs W2 slots"):
    dataclasses.replace(spec, ring_refill="before_epilogue")
  with pytest.raises(ValueError, match="ring_refill='early' must be one of"):
    BatchedSpec(plan=spec.plan, batch=16, steps=3, greedy=True, spin_limit=0,
                interpret=False, ring_refill="early")
  with pytest.raises(ValueError, match="ring_refill='early' must be one of"):
    MosaicBatchedConfig(ring_refill="early")


@pytest.mark.parametrize("head_type,batch,temperature", [
    ("gated", 64, 0.8), ("rnn", 64, 0.8), ("vanilla", 64, 0.0), ("vanilla", 16, 0.8)])
def test_ring_refill_before_epilogue_lowers_for_cuda(head_type, batch, temperature):
  """The API's plans at the Qwen3-4B shape (a producer's releases at B 64 greedy, 1-slot
  rings for the gated and rnn heads' sampled B 64) lower with the early refill: one
  launch."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  text = lower_walk(head_type, batch, 7, temperature=temperature,
                    config=MosaicBatchedConfig(num_blocks=132,
                                               ring_refill="before_epilogue"))
  assert _mosaic_launches(text) == 1


@pytest.mark.parametrize("ring_stages,widening,expected",
                         [(1, None, "before_epilogue"), (2, None, "after_epilogue"),
                          (4, None, "after_epilogue"), (1, "smem", "after_epilogue")])
def test_planner_refills_early_only_a_one_slot_ring(ring_stages, widening, expected):
  """The planner's ``ring_refill`` (``auto_ring_refill``): before the epilogue where a
  warpgroup's ring has one slot, after it with more slots or where the kernel widens an
  int8 W2 (its threads read the slots); an explicit "before_epilogue" there is refused."""
  head = _head(1024, 64)
  config = MosaicBatchedConfig(ring_stages=ring_stages, residency="none")
  if widening:
    head = quantize_w2(head, "int8")
    config = dataclasses.replace(config, batch_axis="m", w2_widening=widening)
  spec = mosaic_batched_backend.plan(head, backend.WalkShapes(batch=16, steps=3), config,
                             H200_FACTS)
  assert spec.plan.ring_stages == ring_stages
  assert spec.ring_refill == expected


def test_planner_refills_after_the_epilogue_without_a_ring():
  """A W2 all resident (no ring slot) keeps the planner's "after_epilogue"."""
  spec = mosaic_batched_backend.plan(_head(1024, 64), backend.WalkShapes(batch=16, steps=3),
                             MosaicBatchedConfig(), H200_FACTS)
  assert spec.plan.ring_stages == 0 and spec.ring_refill == "after_epilogue"


def test_sanitizer_case_refill_early_sets_the_batched_plans_refill():
  """``tools/sanitizer_case.py``'s ``-refill-early`` cases: the batched plan refills its W2
  ring slots before each epilogue, except where the kernel widens an int8 W2."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import sanitizer_case
  shapes = backend.WalkShapes(batch=16, steps=3)
  head = _head(1024, 64)
  config = sanitizer_case.early_refill_config(MosaicBatchedConfig(), None)
  assert mosaic_batched_backend.plan(head, shapes, config,
                                     H200_FACTS).ring_refill == "before_epilogue"
  smem = MosaicBatchedConfig(batch_axis="m", w2_widening="smem")
  assert sanitizer_case.early_refill_config(smem, "smem") == smem
  assert mosaic_batched_backend.plan(quantize_w2(head, "int8"), shapes, smem,
                                     H200_FACTS).ring_refill == "after_epilogue"


@pytest.mark.parametrize("head_type,dtype,expected", [("vanilla", "bf16", 1), ("rnn", "int8", 1),
                                                      ("gated", "bf16", 1),
                                                      ("gated", "int8", 3)])
def test_planner_base_ring_on_m_with_two_warpgroups(head_type, dtype, expected):
  """The planner's base ring on M with two computing warpgroups (``auto_base_stages``):
  one slot, but three for the gated head whose int8 W2 is widened before the launch (its
  row scales applied in the epilogue), where one slot measured slower."""
  # (the Qwen3 vocabulary and rank: W2 streamed, so the base ring's slots are the
  # planner's choice, not what is left beside a resident W2)
  head = wts_jax.make_head(HeadConfig(vocab_size=151936, rank=256, hidden_size=64,
                                      head_type=head_type), seed=3)
  if dtype == "int8":
    head = quantize_w2(head, "int8")
  config = MosaicBatchedConfig(batch_axis="m", warpgroups=2,
                               serial_update="auto" if head_type == "vanilla" else "split",
                               w2_widening="xla" if dtype == "int8" else "auto")
  spec = mosaic_batched_backend.plan(head, backend.WalkShapes(batch=64, steps=3, greedy=False),
                             config, H200_FACTS)
  assert spec.plan.warpgroups == 2 and spec.plan.batch_axis == "m"
  assert spec.plan.base_stages == expected


@pytest.mark.parametrize("head_type,dtype,greedy,expected",
                         [("gated", "bf16", True, 2), ("rnn", "bf16", True, 2),
                          ("gated", "int8", True, 1), ("rnn", "int8", True, 1),
                          ("gated", "int8", False, 2), ("rnn", "int8", False, 2)])
def test_planner_warpgroups_of_the_gated_and_rnn_heads_on_m(head_type, dtype, greedy,
                                                             expected):
  """The planner's computing warpgroups for the gated and rnn heads at 64 rows (on M):
  two, but one for a greedy walk whose int8 W2 is widened before the launch."""
  head = wts_jax.make_head(HeadConfig(vocab_size=151936, rank=256, hidden_size=64,
                                      head_type=head_type), seed=4)
  if dtype == "int8":
    head = quantize_w2(head, "int8")
  spec = mosaic_batched_backend.plan(head, backend.WalkShapes(batch=64, steps=3, greedy=greedy),
                             MosaicBatchedConfig(serial_update="split"),
                             H200_FACTS)
  assert spec.plan.batch_axis == "m"
  assert spec.plan.warpgroups == expected


# (head, W2, B, axis, serial update): padded launches on either axis; on M a 64-row plan
# of 61 rows (its staging zeroed by the prologue only because of the option); int8 planes
# with their scale windows; the gated head's gate table and split gate.
GATHER_BATCH_CASES = [("vanilla", "bf16", 5, "n", "auto"), ("vanilla", "bf16", 61, "m", "auto"),
                      ("vanilla", "int8p", 5, "m", "auto"),
                      ("gated", "bf16", 5, "n", "table"), ("gated", "bf16", 13, "m", "split")]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,w2,batch,axis,update", GATHER_BATCH_CASES)
def test_gather_of_the_batch_rows_only_keeps_the_tokens(monkeypatch, head_type, w2, batch,
                                                        axis, update):
  """Each step copies the batch's rows only, the padded rows keep the prologue's zeros:
  the reference's tokens, greedy and sampled."""
  head = wts_jax.make_head(HeadConfig(vocab_size=520, rank=64, hidden_size=64,
                                      head_type=head_type, confidence=True), seed=batch)
  if w2 == "int8p":
    head = quantize_w2(head, "int8", state="planes")
  if update == "table":
    head = wts_jax.with_gate_table(head)
  from wts_jax.pallas.batched import context
  seen = []
  gathered = context.gathered_z_rows
  monkeypatch.setattr(context, "gathered_z_rows",
                      lambda spec: seen.append(gathered(spec)) or seen[-1])
  for temperature in (0.0, 0.8):
    _assert_matches_xla(head, batch, 3, "auto", temperature, seed=40 + batch,
                        batch_axis=axis, serial_update=update)
  assert seen and set(seen) == {batch}


def test_lab_options_are_a_frozen_value():
  """The tools set the batched launch's lab options by keyword (``profile_batched``); the
  spec is a static argument of the launch, so the options compare and hash by value."""
  from wts_jax.pallas.batched.spec import BatchedLab
  lab = BatchedLab(profile_dir="/tmp/profile", profile_space=4096, probe_skew=True)
  assert lab == BatchedLab(profile_dir="/tmp/profile", profile_space=4096, probe_skew=True)
  assert hash(lab) == hash(BatchedLab(profile_dir="/tmp/profile", profile_space=4096,
                                      probe_skew=True))
  with pytest.raises(dataclasses.FrozenInstanceError):
    lab.probe_skew = False
