"""``MosaicConfig(kernel="steps")`` (``mosaic_stepped_walk``) on the CPU: every head's update
in XLA, the batched Mosaic kernel launched once a step with z as a hi + lo bf16 pair —
in Mosaic GPU interpret mode against the XLA walk (exact tokens greedy, the same tokens
with the same key sampled), its lowering at the Qwen3 shape, its refusals.

Interpret mode runs one block (no semaphores); the GPU suite
(tests/test_stepped_walk_gpu.py) covers 132 blocks. The interpret cases need jax >= 0.11.
"""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.pallas import mosaic_stepped_walk
from wts_jax.quantize import quantize_w2
from wts_jax.walk_config import MosaicConfig, WalkConfig

from near_tie_inputs import tie_broken_by_lo

NEEDS_INTERPRETER = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11),
    reason="jax 0.10's Mosaic GPU interpreter cannot run tiled shared-memory loads")


def _head(head_type, vocab, rank, confidence=False):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type=head_type,
                      confidence=confidence)
  return wts_jax.make_head(config, seed=vocab + rank + 2)


def _walks(head, batch, steps, temperature, seed, **options):
  base, first, hidden = random_inputs(head.config, batch, steps, jax.random.key(seed))
  key = jax.random.key(seed + 10) if temperature else None
  config = MosaicConfig(interpret=True, kernel="steps", **options)
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic", config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  return out, ref


# (head, V, r, B, K, temperature, axis, warpgroups): the rnn head greedy and sampled with
# B not a multiple of 8 and V % 64 = 40, on N, r = 256 with two warpgroups, past 64 rows
# (two launches a step); the gated and vanilla heads too.
CASES = [("rnn", 1000, 128, 13, 4, 0.7, "m", 1), ("rnn", 520, 64, 5, 3, 0.0, "m", 1),
         ("rnn", 1000, 128, 16, 3, 0.0, "n", 1), ("rnn", 456, 256, 8, 3, 1.0, "m", 2),
         ("rnn", 776, 64, 70, 3, 0.8, "m", 1), ("gated", 776, 64, 13, 3, 0.0, "n", 2),
         ("vanilla", 1000, 128, 13, 4, 0.7, "n", 1)]


@NEEDS_INTERPRETER
@pytest.mark.parametrize("head_type,vocab,rank,batch,steps,temperature,axis,warpgroups",
                         CASES)
def test_tokens_equal_xla(head_type, vocab, rank, batch, steps, temperature, axis,
                          warpgroups):
  head = _head(head_type, vocab, rank, confidence=True)
  out, ref = _walks(head, batch, steps, temperature, 3, batch_axis=axis,
                    warpgroups=warpgroups, residency="none")
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(np.asarray(out.confidence), np.asarray(ref.confidence),
                             atol=1e-4)
  assert int(out.status) == 0


def test_split_hi_lo():
  z = jax.random.normal(jax.random.key(0), (5, 64)) * 3
  pair = np.asarray(mosaic_stepped_walk.split_hi_lo(z), np.float64)
  assert pair.shape == (2, 64, 64) and not pair[:, 5:].any()
  error = np.abs(pair[0, :5] + pair[1, :5] - np.asarray(z, np.float64))
  assert (error <= np.abs(np.asarray(z)) * 2.0 ** -16).all()
  assert (np.abs(pair[0, :5] - np.asarray(z)) > error).any()   # the lo half matters


@NEEDS_INTERPRETER
def test_z_lo_half_decides_a_near_tie():
  """The lo half of z reaches W2: step 0's candidates ordered one way by the exact z and
  the other way by bf16(z) (the gated head's construction)."""
  head = _head("gated", 1000, 128)
  base, first, hidden = random_inputs(head.config, 8, 2, jax.random.key(21))
  base, expected = tie_broken_by_lo(head, base, first, hidden)
  config = MosaicConfig(interpret=True, kernel="steps", residency="none")
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic", config=config)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla")
  np.testing.assert_array_equal(np.asarray(ref.tokens)[:, 0], expected)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


def test_refusals():
  head = quantize_w2(_head("rnn", 1000, 64), "int8")
  base, first, hidden = random_inputs(head.config, 8, 3, jax.random.key(0))
  with pytest.raises(ValueError, match="kernel='steps' needs a bf16 W2"):
    wts_jax.walk(head, base, first, hidden, impl="mosaic",
                 config=MosaicConfig(interpret=True, kernel="steps"))
  with pytest.raises(ValueError, match="kernel='wide' must be one of"):
    MosaicConfig(kernel="wide")


@pytest.mark.parametrize("head_type,batch,temperature,axis", [
    ("rnn", 64, 0.0, "m"), ("rnn", 96, 1.0, "m"), ("rnn", 16, 0.0, "n"),
    ("gated", 16, 1.0, "m")])
def test_lowers_for_cuda_at_the_qwen3_shape(head_type, batch, temperature, axis):
  """132 blocks, a launch a step inside the scan (B = 96: two launches a step)."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import lower_walk
  if axis == "n" and jax.__version_info__ < (0, 11):
    pytest.skip("batch_axis='n' needs jax >= 0.11")
  config = WalkConfig(num_programs=132, backend="mosaic", mosaic_kernel="steps",
                      mosaic_batch_axis=axis)
  text = lower_walk(head_type, batch, 7, temperature=temperature, config=config)
  assert text.count("mosaic_gpu") >= -(-batch // 64)
