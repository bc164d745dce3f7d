"""Named drafter shapes shared by the tests and the benchmarks (tokamax's arg_specs)."""

from __future__ import annotations

import dataclasses

from wts_jax.heads.config import DSPARK_RANK, QWEN3_HIDDEN, QWEN3_VOCAB, HeadConfig


@dataclasses.dataclass(frozen=True)
class DrafterShape:
  name: str
  vocab_size: int
  rank: int
  hidden_size: int

  def head_config(self, head_type: str = "vanilla", *, rank: int | None = None,
                  confidence: bool = True) -> HeadConfig:
    return HeadConfig(vocab_size=self.vocab_size, rank=self.rank if rank is None else rank,
                      hidden_size=self.hidden_size, head_type=head_type,
                      confidence=confidence)


# The released Qwen3 DSpark drafters (V = 151 936, r = 256).
REAL_SHAPES = tuple(
    DrafterShape(name, QWEN3_VOCAB, DSPARK_RANK, hidden)
    for name, hidden in QWEN3_HIDDEN.items())

# Small shapes with V not a multiple of 128 (nor of any tile), for the CPU suite.
SMALL_SHAPES = (
    DrafterShape("small_v1000", 1000, 32, 48),
    DrafterShape("small_v517", 517, 16, 24),
)

SHAPES = {shape.name: shape for shape in REAL_SHAPES + SMALL_SHAPES}

# Benchmark grid defaults (issue: batch 1/4/16/64, K 4/7/16, ranks 64/128/256).
BENCH_BATCHES = (1, 4, 16, 64)
BENCH_STEPS = (4, 7, 16)
BENCH_RANKS = (256, 128, 64)
