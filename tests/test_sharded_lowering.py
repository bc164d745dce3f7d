"""The sharded walk compiled for two H200s without a GPU (``tools/lower_sharded_for_gpu``;
jax's CUDA plugin needed): the step-wise walk's only collective is a step's packed
candidates, and each device reads its half of W2 a step; the in-kernel device exchange
(``device_exchange_mgpu``) lowers and compiles through XLA's collective metadata, with
no NVLink multicast, and its inline PTX assembles. None of this is timed."""

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import hlo_traffic  # noqa: E402

pytestmark = pytest.mark.skipif(not hlo_traffic.cuda_available(),
                                reason="compiling for the H200 needs jax[cuda12]")

QWEN3_VOCAB, RANK = 151_936, 256


@pytest.mark.parametrize("head_type,batch,split_w1", [("vanilla", 1, False),
                                                      ("gated", 16, True)])
def test_sharded_walk_compiles_for_two_h200s(head_type, batch, split_w1):
  import lower_sharded_for_gpu as tool
  from sharded_checks import assert_nothing_vocab_sized_moves
  text = tool.compile_sharded_walk(2, head_type, batch, split_w1=split_w1)
  moved = tool.collectives(text)
  assert moved and {op for op, _ in moved} == {"all-gather"}, moved
  words = 2 + (RANK // 2 if split_w1 else 0)     # score, index (and the bf16 W1 row)
  assert_nothing_vocab_sized_moves(text, QWEN3_VOCAB, 2, 2 * batch * words)
  # A step reads the device's half of W2 (bf16), not all of it.
  half_w2 = QWEN3_VOCAB // 2 * RANK * 2
  assert half_w2 <= hlo_traffic.summary(text)["moved_bytes"] < 2 * half_w2


def test_device_exchange_probe_lowers_and_compiles_for_two_h200s():
  import lower_sharded_for_gpu as tool
  lowered = tool.lower_exchange_probe(2)
  text = lowered.as_text()
  assert "multimem" not in text                          # never NVLink multicast
  compiled = lowered.compile().as_text()
  assert "mosaic_gpu" in compiled
  assert "uses_xla_collective_metadata = true" in compiled   # remote refs and signals


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas on PATH")
def test_device_exchange_inline_ptx_assembles():
  import lower_sharded_for_gpu as tool
  assembled, failures = tool.probe_asm_check(2)
  assert failures == []
  assert assembled >= 2          # at least the publish and the collect were checked
