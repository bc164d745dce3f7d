"""Checks and helpers shared by the Mosaic kernel's interpret-mode and GPU suites."""

import jax
import numpy as np

import wts_jax


def planes_head(vocab, rank=256, seed=0, confidence=False):
  """(a random head of ``vocab`` × ``rank`` with its int8 W2 met by z as two int8
  planes, its config)."""
  from wts_jax.heads import HeadConfig
  from wts_jax.quantize import quantize_w2
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=48, confidence=confidence)
  head = wts_jax.make_head(config, seed=seed)
  return quantize_w2(head, "int8", state="planes"), config


def lower_with_derived_copy(monkeypatch, derive, head_type, batch, temperature, config):
  """``tools/lower_for_gpu``'s CUDA lowering (text) of a ``head_type`` walk at the
  Qwen3-4B shape, its head made with ``derive`` applied (``wts_jax.with_gate_table``,
  ``with_joint_table``)."""
  import sys
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import lower_for_gpu
  make_head = wts_jax.make_head
  monkeypatch.setattr(wts_jax, "make_head",
                      lambda head_config, **kw: derive(make_head(head_config, **kw)))
  return lower_for_gpu.lower_walk(head_type, batch, 7, temperature=temperature,
                                  config=config)


def mosaic_and_xla_walks(head, base, first, hidden, *, impl, config, temperature, key):
  """(the kernel's walk under ``impl`` and ``config``, the XLA walk) of the same head,
  inputs and key."""
  out = wts_jax.walk(head, base, first, hidden, impl=impl, config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  return out, ref


def assert_walk_matches(out, ref):
  """Exact tokens (greedy; bit-identical with the same key, sampled), confidence close,
  a clean status."""
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  if ref.confidence is not None:
    np.testing.assert_allclose(np.asarray(out.confidence), np.asarray(ref.confidence),
                               atol=1e-4)
  assert int(out.status) == 0


def assert_table_unread_elsewhere(head, tabled):
  """A head's derived table rides along where it is not read: the XLA walk and the
  Triton kernel (interpret mode) of ``tabled`` give ``head``'s tokens."""
  from wts_jax.inputs import random_inputs
  from wts_jax.walk_config import TritonConfig
  base, first, hidden = random_inputs(head.config, 3, 3, jax.random.key(17))
  want = np.asarray(wts_jax.walk(head, base, first, hidden, impl="xla").tokens)
  for impl, config in (("xla", None),
                       ("triton", TritonConfig(interpret=True, num_programs=1))):
    out = wts_jax.walk(tabled, base, first, hidden, impl=impl, config=config)
    np.testing.assert_array_equal(np.asarray(out.tokens), want)


def assert_mosaic_matches_xla(head, base, first, hidden, residency, temperature,
                              kernel="auto"):
  """The Mosaic walk (interpret mode, one block) against the XLA walk of the same head."""
  key = jax.random.key(3) if temperature else None
  config = wts_jax.WalkConfig(backend="mosaic", interpret=True, residency=residency,
                              mosaic_kernel=kernel)
  assert_walk_matches(*mosaic_and_xla_walks(head, base, first, hidden, impl="pallas",
                                            config=config, temperature=temperature,
                                            key=key))


def planner_option(monkeypatch, **option):
  """The batched planner with ``option`` set in every plan; returns the plans it made."""
  from wts_jax.pallas import mosaic_backend
  planned, plans = mosaic_backend.plan_batched, []

  def with_option(**kwargs):
    plans.append(planned(**{**kwargs, **option}))
    return plans[-1]
  monkeypatch.setattr(mosaic_backend, "plan_batched", with_option)
  return plans


def batched_spec_option(monkeypatch, **fields):
  """The API's batched kernel spec (``mosaic_backend._batched_plan``) with ``fields`` set
  wherever it makes one."""
  import dataclasses
  from wts_jax.pallas import mosaic_backend
  from wts_jax.pallas.mosaic_batched_walk import BatchedSpec
  planned = mosaic_backend._batched_plan

  def with_fields(*args, **kwargs):
    spec = planned(*args, **kwargs)
    return dataclasses.replace(spec, **fields) if isinstance(spec, BatchedSpec) else spec
  monkeypatch.setattr(mosaic_backend, "_batched_plan", with_fields)
