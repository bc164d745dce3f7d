"""A few walks after an L2 flush each, for ncu: how many bytes a walk reads from HBM.

  ncu --kernel-name regex:mosaic --launch-skip 2 --launch-count 3 \\
      --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \\
      python tools/walk_dram_bytes.py [--dtype bf16|int8p] [--batch 16] [--walks 3]

Two warm-up walks (compile, first launch), then ``--walks`` walks, each after a 256 MB
flush through the L2. The walk's DRAM bytes against what its plan streams (NOTES v22:
a bf16 plan streams 69-97 MB a step, more than the 60 MB L2) say how much of the
streamed W2 the L2 serves across steps.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp

import wts_jax
from wts_jax.bench.registry import gpu_reason
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.quantize import quantize_w2


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dtype", choices=("bf16", "int8p"), default="bf16")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--steps", type=int, default=7)
  parser.add_argument("--walks", type=int, default=3)
  args = parser.parse_args(argv)
  reason = gpu_reason()
  if reason is not None:
    print(f"error: {reason}", file=sys.stderr)
    return 2
  config = HeadConfig.qwen3_4b("vanilla", confidence=False)
  head = wts_jax.make_head(config, seed=3)
  if args.dtype == "int8p":
    head = quantize_w2(head, "int8", state="planes")
  base, first, hidden = random_inputs(config, args.batch, args.steps, jax.random.key(5))
  walk = jax.jit(lambda h, b, f, x: wts_jax.walk(h, b, f, x, impl="mosaic").tokens)
  flush = jax.jit(lambda buffer: buffer + 1)
  buffer = jnp.zeros((64 << 20,), jnp.int32)   # 256 MB, > 4x the L2
  for _ in range(2):
    jax.block_until_ready(walk(head, base, first, hidden))
  for _ in range(args.walks):
    buffer = jax.block_until_ready(flush(buffer))
    jax.block_until_ready(walk(head, base, first, hidden))
  print(f"{args.walks} walks, {args.dtype} B={args.batch} K={args.steps}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
