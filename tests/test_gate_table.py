"""The gated head's gate table (``wts_jax.gate_table``): its rows, and the batched Mosaic
kernel's table gate against the XLA walk in Pallas interpret mode (jax >= 0.11: the
batch on N)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax import gate_table
from wts_jax.device import H200 as H200_FACTS
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.pallas import backend, mosaic_batched_backend
from wts_jax.walk_config import MosaicBatchedConfig, TritonConfig

from mosaic_checks import (assert_table_unread_elsewhere, assert_walk_matches,
                           lower_with_derived_copy, mosaic_and_xla_walks)
from near_tie_inputs import tie_broken_by_lo

pytestmark = pytest.mark.mosaic

NEEDS_N = pytest.mark.skipif(
    jax.__version_info__ < (0, 11),
    reason="the table gate puts the batch on N, which jax 0.10's Mosaic GPU cannot lower "
           "or interpret")


def _gated(vocab=1000, rank=128, confidence=True, seed=0):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type="gated",
                      confidence=confidence)
  return wts_jax.make_head(config, seed=vocab + rank + seed)


def test_halves_rebuild_every_fp32_bit():
  values = jax.random.normal(jax.random.key(0), (4096,), jnp.float32) * 100.0
  values = values.at[:6].set(jnp.array([0.0, -0.0, jnp.inf, -jnp.inf, 1e-40, -3e-39]))
  upper, lower = gate_table.f32_halves(values)
  assert upper.dtype == lower.dtype == jnp.int16
  rebuilt = gate_table.f32_from_halves(upper, lower)
  np.testing.assert_array_equal(np.asarray(rebuilt).view(np.uint32),
                                np.asarray(values).view(np.uint32))


def test_gate_rows_hold_e_and_the_reference_gate_term():
  """Each row: the token's W1 row, then G_e e as the reference's advance contracts it."""
  head = _gated(300, 64)
  serial = wts_jax.with_gate_table(head).markov_head
  rows = gate_table.table_of(serial)
  assert rows.shape == (300, 3 * 64) and rows.dtype == jnp.int16
  w1 = serial.markov_w1.weight[...]
  np.testing.assert_array_equal(np.asarray(gate_table.bf16_from_bits(rows[:, :64])),
                                np.asarray(w1))
  _, gate_e, _ = serial.gate_weights()
  terms = gate_table.f32_from_halves(rows[:, 64:128], rows[:, 128:])
  per_step = jnp.einsum("br,sr->bs", w1[:7].astype(jnp.float32), gate_e,
                        precision=jax.lax.Precision.HIGHEST)
  # (Two XLA contractions of different shapes: the same products, summed in their own
  # orders.)
  np.testing.assert_allclose(np.asarray(terms[:7]), np.asarray(per_step), rtol=2e-5,
                             atol=1e-5)


def test_tables_hoist_equals_the_heads():
  """The hoist from the table's contiguous G_h is the head's own, bit for bit."""
  head = wts_jax.with_gate_table(_gated(300, 64))
  hidden = jax.random.normal(jax.random.key(5), (3, 4, 64), jnp.bfloat16)
  serial = head.markov_head
  np.testing.assert_array_equal(np.asarray(gate_table.hoisted_terms(serial, hidden)),
                                np.asarray(serial.hoist(hidden)))


def test_table_is_the_gated_heads_and_the_original_is_untouched():
  head = _gated(300, 64)
  tabled = wts_jax.with_gate_table(head)
  assert gate_table.table_of(head.markov_head) is None
  assert gate_table.table_of(tabled.markov_head) is not None
  vanilla = wts_jax.make_head(HeadConfig(vocab_size=300, rank=64, hidden_size=64,
                                         head_type="vanilla"), seed=1)
  with pytest.raises(ValueError, match="a gate table is the gated head's"):
    wts_jax.with_gate_table(vanilla)


def _walks(head, batch, steps, temperature, seed, config):
  base, first, hidden = random_inputs(head.config, batch, steps, jax.random.key(seed))
  return mosaic_and_xla_walks(head, base, first, hidden, impl="mosaic", config=config,
                              temperature=temperature,
                              key=jax.random.key(seed + 10) if temperature else None)


# (V, r, B, K, residency, temperature, warpgroups, producer): every chunk resident; all
# streamed and sampled; V % 64 = 8 with two warpgroups and a producer; 32 rows, sampled
# with two warpgroups; past 32 rows is refused (test below).
TABLE_CASES = [(520, 64, 5, 3, "auto", 0.0, None, None),
               (1000, 128, 13, 4, "none", 0.7, None, None),
               (776, 64, 16, 3, 64, 0.0, 2, True),
               (1000, 128, 32, 3, "none", 1.0, 2, None)]


@NEEDS_N
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature,warpgroups,producer",
                         TABLE_CASES)
def test_table_gate_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature,
                                     warpgroups, producer):
  head = wts_jax.with_gate_table(_gated(vocab, rank))
  config = MosaicBatchedConfig(interpret=True, residency=residency, warpgroups=warpgroups,
                               producer=producer, serial_update="table")
  shapes = backend.WalkShapes(batch=batch, steps=steps, greedy=not temperature)
  plan = mosaic_batched_backend.plan(head, shapes, config, H200_FACTS).plan
  assert plan.gate_table and plan.pair_on_n and plan.gate_chunks == 0
  assert_walk_matches(*_walks(head, batch, steps, temperature, 15, config))


@NEEDS_N
def test_table_gate_reads_the_table():
  """The kernel's gate is the table's: with every token's G_e e zeroed in the table (a
  gate of σ(hoisted) alone), its tokens leave the reference's."""
  head = wts_jax.with_gate_table(_gated(1000, 128))
  rows = head.markov_head.gate_table.rows
  rows[...] = rows[...].at[:, 128:].set(0)
  config = MosaicBatchedConfig(interpret=True, serial_update="table")
  out, ref = _walks(head, 13, 4, 0.0, 16, config)
  assert (np.asarray(out.tokens) != np.asarray(ref.tokens)).any()


@NEEDS_N
def test_table_gate_keeps_z_lo_half_at_a_near_tie():
  """z's lo half reaches W2 on the table path too: at step 0 each row's two candidates
  are ordered one way by the exact z and the other way by z rounded to bf16."""
  head = wts_jax.with_gate_table(_gated(1000, 128, confidence=False))
  base, first, hidden = random_inputs(head.config, 8, 2, jax.random.key(21))
  base, expected = tie_broken_by_lo(head, base, first, hidden)
  config = MosaicBatchedConfig(interpret=True, residency="none", serial_update="table")
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic", config=config)
  np.testing.assert_array_equal(np.asarray(out.tokens)[:, 0], expected)


def test_auto_takes_the_table_where_the_batch_goes_on_n():
  head = wts_jax.with_gate_table(_gated(1000, 128))
  config = MosaicBatchedConfig()
  def tabled(batch):
    return mosaic_batched_backend.gate_table_walk(head, backend.WalkShapes(batch=batch, steps=4,
                                                                   greedy=True), config)
  on_n = mosaic_batched_backend.BATCH_ON_N_LOWERS
  assert tabled(1) == on_n and tabled(32) == on_n and not tabled(33) and not tabled(64)
  assert not mosaic_batched_backend.gate_table_walk(_gated(1000, 128),
                                            backend.WalkShapes(batch=4, steps=4,
                                                               greedy=True), config)


@pytest.mark.parametrize("what,config,match", [
    ("vanilla", MosaicBatchedConfig(serial_update="table"),
     "needs a gated head with its gate table"),
    ("untabled", MosaicBatchedConfig(serial_update="table"),
     "needs a gated head with its gate table"),
    ("tabled", MosaicBatchedConfig(serial_update="table", batch_axis="m"),
     "needs the batch on N"),
    ("tabled-33", MosaicBatchedConfig(serial_update="table"),
     "runs up to 32 rows" if mosaic_batched_backend.BATCH_ON_N_LOWERS else "needs the batch on N"),
])
def test_table_refusals_name_the_reason(what, config, match):
  vanilla = wts_jax.make_head(HeadConfig(vocab_size=1000, rank=128, hidden_size=64,
                                         head_type="vanilla"), seed=2)
  head = {"vanilla": vanilla, "untabled": _gated(),
          "tabled": wts_jax.with_gate_table(_gated()),
          "tabled-33": wts_jax.with_gate_table(_gated())}[what]
  shapes = backend.WalkShapes(batch=33 if what == "tabled-33" else 4, steps=4, greedy=True)
  config = dataclasses.replace(config, interpret=True, num_blocks=1)
  spec = mosaic_batched_backend.plan(head, shapes, config, H200_FACTS)
  assert isinstance(spec, backend.Refusal) and match in spec.reason


def test_the_table_is_the_batched_kernels_option():
  """Only the batched kernel takes ``serial_update="table"``: the Triton kernel's config
  names it a bad value."""
  with pytest.raises(ValueError, match="serial_update='table' must be one of"):
    TritonConfig(serial_update="table")


@NEEDS_N
@pytest.mark.parametrize("batch,temperature", [(1, 0.0), (16, 0.8)])
def test_table_gate_lowers_for_cuda_at_the_qwen3_shape(monkeypatch, batch, temperature):
  text = lower_with_derived_copy(monkeypatch, wts_jax.with_gate_table, "gated", batch,
                                 temperature, MosaicBatchedConfig())
  assert "mosaic_gpu" in text


def test_other_walks_of_a_tabled_head_compute_the_gate():
  """The table rides along where it is not read: the XLA walk and the Triton kernel
  (interpret mode) of a tabled head give the untabled head's tokens."""
  head = _gated(1000, 64)
  assert_table_unread_elsewhere(head, wts_jax.with_gate_table(head))
