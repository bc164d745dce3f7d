"""The rnn head's joint table (``wts_jax.with_joint_table``): its rows are J_e e of every
token as the reference contracts it, the batched Mosaic kernel's one-barrier update from
it walks the reference's tokens (interpret mode, jax >= 0.11: the batch on N), the
planner takes it where it runs and refuses it by name elsewhere, it lowers at the Qwen3
shape, and the other walks of a tabled head are unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax import gate_table, joint_table
from wts_jax.device import H200
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.pallas import backend, mosaic_batched_backend
from wts_jax.walk_config import MosaicBatchedConfig

from mosaic_checks import (assert_table_unread_elsewhere, assert_walk_matches,
                           lower_with_derived_copy, mosaic_and_xla_walks)

pytestmark = pytest.mark.mosaic

NEEDS_N = pytest.mark.skipif(
    jax.__version_info__ < (0, 11),
    reason="the joint table puts the batch on N, which jax 0.10's Mosaic GPU cannot lower "
           "or interpret")


def _rnn(vocab=1000, rank=64, seed=0, confidence=True):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type="rnn",
                      confidence=confidence)
  return wts_jax.make_head(config, seed=seed + vocab + rank)


def test_rows_hold_the_reference_joint_terms():
  """Each row: J_e e of its token as fp32 halves (upper halves of the three parts, then
  lower), as the reference's advance contracts it."""
  head = wts_jax.with_joint_table(_rnn(300, 64))
  serial = head.markov_head
  rows = joint_table.joint_table_of(serial)
  assert rows.shape == (300, 6 * 64) and rows.dtype == jnp.int16
  terms = gate_table.f32_from_halves(rows[:, :192], rows[:, 192:])
  _, joint_e, _, _ = serial.joint_weights()
  w1 = serial.markov_w1.weight[...]
  np.testing.assert_array_equal(
      np.asarray(terms).view(np.uint32),
      np.asarray(gate_table.token_terms(w1, joint_e)).view(np.uint32))
  per_step = jnp.einsum("br,jr->bj", w1[:7].astype(jnp.float32), joint_e,
                        precision=jax.lax.Precision.HIGHEST)
  # (Two XLA contractions of different shapes: the same products, summed in their own
  # orders.)
  np.testing.assert_allclose(np.asarray(terms[:7]), np.asarray(per_step), rtol=2e-5,
                             atol=1e-5)


def test_table_is_the_rnn_heads_and_the_original_is_untouched():
  head = _rnn(300, 64)
  tabled = wts_jax.with_joint_table(wts_jax.with_joint_hidden(head))
  assert joint_table.joint_table_of(head.markov_head) is None
  assert joint_table.joint_table_of(tabled.markov_head) is not None
  assert tabled.markov_head.joint_hidden is not None   # (the earlier copy kept)
  gated = wts_jax.make_head(HeadConfig(vocab_size=300, rank=64, hidden_size=64,
                                       head_type="gated"), seed=1)
  with pytest.raises(ValueError, match="a joint table is the rnn head's"):
    wts_jax.with_joint_table(gated)


def test_stale_table_is_named_and_rebuilt():
  head = wts_jax.with_joint_table(_rnn(300, 64))
  assert wts_jax.stale_copies(head) == []
  w1 = head.markov_head.markov_w1.weight
  w1[...] = w1[...].at[3].multiply(2)
  assert wts_jax.stale_copies(head) == ["markov_head.joint_table.rows"]
  assert wts_jax.stale_copies(wts_jax.with_fresh_copies(head)) == []


def _walks(head, batch, steps, temperature, seed, config):
  base, first, hidden = random_inputs(head.config, batch, steps, jax.random.key(seed))
  return mosaic_and_xla_walks(head, base, first, hidden, impl="mosaic", config=config,
                              temperature=temperature,
                              key=jax.random.key(seed + 10) if temperature else None)


# (V, r, B, K, residency, temperature): V % 64 = 40 and 8, every chunk resident or all
# streamed, greedy and sampled, one row to the table's 16. (Interpreted, one block owns
# every unit: r = 64 keeps its three parts within a WGMMA's N.)
JOINT_CASES = [(1000, 64, 5, 4, "auto", 0.0), (1000, 64, 16, 5, "none", 0.8),
               (520, 64, 1, 3, "none", 1.0), (776, 64, 13, 4, "auto", 0.0)]


@NEEDS_N
@pytest.mark.parametrize("vocab,rank,batch,steps,residency,temperature", JOINT_CASES)
def test_joint_table_tokens_equal_xla(vocab, rank, batch, steps, residency, temperature):
  head = wts_jax.with_joint_table(_rnn(vocab, rank))
  config = MosaicBatchedConfig(interpret=True, residency=residency, serial_update="table")
  shapes = backend.WalkShapes(batch=batch, steps=steps, greedy=not temperature)
  plan = mosaic_batched_backend.plan(head, shapes, config, H200).plan
  assert plan.joint_table and not plan.split and plan.pair_on_n
  assert_walk_matches(*_walks(head, batch, steps, temperature, 31, config))


@NEEDS_N
def test_kernel_reads_the_table():
  """The kernel's J_e e is the table's: with the upper halves of every token's terms
  zeroed in the table (terms of ±2^-126 at most), its tokens leave the reference's.
  (The lower halves carry the 16 low mantissa bits, < 2^-7 of each term: zeroing them
  need not move a token.)"""
  head = wts_jax.with_joint_table(_rnn(1000, 64))
  rows = head.markov_head.joint_table.rows
  rows[...] = rows[...].at[:, :192].set(0)
  config = MosaicBatchedConfig(interpret=True, serial_update="table")
  out, ref = _walks(head, 13, 4, 0.0, 16, config)
  assert (np.asarray(out.tokens) != np.asarray(ref.tokens)).any()


def _choice(head, batch, config=MosaicBatchedConfig(), greedy=True):
  return mosaic_batched_backend.plan(
      head, backend.WalkShapes(batch=batch, steps=4, greedy=greedy), config, H200)


@NEEDS_N
def test_auto_takes_the_table_up_to_its_rows():
  """"auto" up to 4 rows (where it measured faster), "table" up to 16."""
  head = wts_jax.with_joint_table(_rnn(1000, 64))
  for batch in (1, 4):
    plan = _choice(head, batch).plan
    assert plan.joint_table and plan.batch_axis == "n" and plan.warpgroups == 1, batch
  for batch in (5, 16):
    assert not _choice(head, batch).plan.joint_table, batch
    assert _choice(head, batch, MosaicBatchedConfig(serial_update="table")).plan.joint_table
  past = _choice(head, 17).plan
  assert past.recurrent and past.split and not past.joint_table
  assert not _choice(_rnn(1000, 64), 5).plan.joint_table   # (no table: the split update)
  assert not _choice(head, 5, MosaicBatchedConfig(serial_update="split")).plan.joint_table


@pytest.mark.parametrize("config,batch,reason", [
    (MosaicBatchedConfig(serial_update="table"), 17, "up to 16 rows"),
    (MosaicBatchedConfig(serial_update="table", warpgroups=2), 8, "one warpgroup"),
    (MosaicBatchedConfig(serial_update="table", batch_axis="m"), 8, "batch on N")])
def test_table_refused_by_name(config, batch, reason):
  head = wts_jax.with_joint_table(_rnn(1000, 64))
  spec = _choice(head, batch, config)
  assert isinstance(spec, backend.Refusal) and reason in spec.reason


def test_table_asked_of_a_head_without_one_is_refused():
  spec = _choice(_rnn(1000, 64), 5, MosaicBatchedConfig(serial_update="table"))
  assert isinstance(spec, backend.Refusal)
  assert "wts_jax.with_joint_table(head)" in spec.reason


def test_other_walks_of_a_tabled_head_are_unchanged():
  """The table rides along where it is not read: the XLA walk and the Triton kernel
  (interpret mode) of a tabled head give the untabled head's tokens."""
  head = _rnn(1000, 64)
  assert_table_unread_elsewhere(head, wts_jax.with_joint_table(head))


@NEEDS_N
@pytest.mark.parametrize("batch,temperature", [(1, 0.0), (4, 0.8), (16, 0.8)])
def test_joint_table_lowers_for_cuda_at_the_qwen3_shape(monkeypatch, batch, temperature):
  text = lower_with_derived_copy(monkeypatch, wts_jax.with_joint_table, "rnn", batch,
                                 temperature, MosaicBatchedConfig(serial_update="table"))
  assert "mosaic_gpu" in text


def test_bench_path_without_the_table_drops_it():
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import bench_variants
  seen = []
  prepared = bench_variants._without_joint_table(lambda head: seen.append(head))
  head = wts_jax.with_joint_table(_rnn(300, 64))
  prepared(head)
  assert joint_table.joint_table_of(seen[0].markov_head) is None
  assert joint_table.joint_table_of(head.markov_head) is not None
