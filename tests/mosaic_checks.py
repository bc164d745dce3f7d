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


INTERPRETED_KERNELS = {"rows": "MosaicRowConfig", "batched": "MosaicBatchedConfig",
                       "stacked": "MosaicStackedConfig"}


def interpreted_config(head, shapes, kernel="auto", **options):
  """An interpret-mode config (one block) of the Mosaic ``kernel`` ("rows", "batched",
  "stacked"), or for "auto" of the first Mosaic kernel in the planners' order, the
  stacked kernel left out (its walks have their own tests), that plans this walk."""
  from wts_jax.device import H200
  from wts_jax.pallas import backend, preference
  options = dict(interpret=True, **options)
  if kernel != "auto":
    return getattr(wts_jax, INTERPRETED_KERNELS[kernel])(**options)
  for name in preference.mosaic_order(head, shapes):
    if name == "mosaic_stacked":
      continue
    config = backend.REGISTRY[name].config_type(**options)
    if not isinstance(backend.plan_one(name, head, shapes, config, H200), backend.Refusal):
      return config
  raise AssertionError(f"no Mosaic kernel runs this walk in interpret mode ({shapes})")


def assert_mosaic_matches_xla(head, base, first, hidden, residency, temperature,
                              kernel="auto"):
  """The Mosaic walk (interpret mode, one block) against the XLA walk of the same head:
  ``kernel``'s (``interpreted_config``)."""
  from wts_jax.pallas import backend
  key = jax.random.key(3) if temperature else None
  shapes = backend.WalkShapes.of(base, not temperature)
  options = {} if kernel == "stacked" else dict(residency=residency)
  config = interpreted_config(head, shapes, kernel, **options)
  assert_walk_matches(*mosaic_and_xla_walks(head, base, first, hidden, impl="mosaic",
                                            config=config, temperature=temperature,
                                            key=key))
