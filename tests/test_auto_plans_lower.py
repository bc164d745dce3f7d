"""The planner's plans lower for CUDA on the CPU machine: every head and W2 form at a
small rank, on either batch axis, greedy and sampled.

A plan the planner makes must compile: at r = 64 the int8 planes' z staging on N did not
(NOTES v25), and ``impl="auto"`` walks failed at compile time instead of being planned
elsewhere. On jax 0.11 lowering runs Mosaic's own passes (where that error was raised);
jax 0.10 serializes the kernel's module, so there the test checks less.
"""

import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from lower_for_gpu import lower_walk  # noqa: E402

pytestmark = pytest.mark.mosaic

FORMS = [("vanilla", None), ("vanilla", "int8"), ("vanilla", "int8p"), ("gated", None),
         ("gated", "int8"), ("rnn", None), ("rnn", "int8")]


@pytest.mark.parametrize("head_type,quantize", FORMS,
                         ids=[f"{h}-{q or 'bf16'}" for h, q in FORMS])
@pytest.mark.parametrize("batch", [4, 33])   # the batch on N, and on M
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_auto_plan_lowers_at_rank_64(head_type, quantize, batch, temperature):
  text = lower_walk(head_type, batch, 4, quantize=quantize, rank=64,
                    temperature=temperature)
  assert "mosaic_gpu" in text or "triton" in text


@pytest.mark.parametrize("quantize", [None, "int8p"], ids=["bf16", "int8p"])
def test_a_plan_over_fp32_base_logits_lowers(quantize):
  """fp32 base logits (a decode loop in fp32): the batch on N loads its base tile
  transposed, which Mosaic GPU lowers for bf16 only, so the planner puts 16 rows on M.
  (At Qwen3's rank: at a small rank the int8 planes go on M anyway.)"""
  text = lower_walk("vanilla", 16, 4, quantize=quantize, base_dtype=jnp.float32)
  assert "mosaic_gpu" in text
