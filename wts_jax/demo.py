"""``wts-demo``: a random-weight Qwen3-4B DSpark head walked once by the best implementation.

No download: the head has the real shapes (V=151936, r=256, d=2560) and random weights.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

import wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="wts-demo", description=__doc__)
  parser.add_argument("--head", default="vanilla", choices=["vanilla", "gated", "rnn"])
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--steps", type=int, default=7)
  parser.add_argument("--temperature", type=float, default=0.0)
  parser.add_argument("--impl", default="auto", choices=["auto", "pallas", "xla"])
  parser.add_argument("--walks", type=int, default=20, help="timed walks")
  args = parser.parse_args(argv)

  config = HeadConfig.qwen3_4b(args.head)
  head = wts_jax.make_head(config, seed=0)
  base, first, hidden = random_inputs(config, args.batch, args.steps, jax.random.key(1))
  key = jax.random.key(2) if args.temperature > 0 else None
  impl = wts_jax.chosen_implementation(head, base, args.impl)

  walk = jax.jit(lambda h, b, f, x: wts_jax.walk(h, b, f, x, temperature=args.temperature,
                                                  key=key, impl=impl))
  out = wts_jax.check(jax.block_until_ready(walk(head, base, first, hidden)))  # compile
  start = time.perf_counter()
  for _ in range(args.walks):
    out = walk(head, base, first, hidden)
  jax.block_until_ready(out)
  per_walk_us = (time.perf_counter() - start) / args.walks * 1e6

  print(f"device: {jax.devices()[0].device_kind}  jax {jax.__version__}")
  print(f"head: {args.head}  V={config.vocab_size} r={config.rank} d={config.hidden_size}  "
        f"B={args.batch} K={args.steps}  T={args.temperature}")
  print(f"implementation: {impl}")
  for row, tokens in enumerate(np.asarray(out.tokens)[:4]):
    conf = np.asarray(out.confidence)[row] if out.confidence is not None else None
    extra = "" if conf is None else "  confidence " + " ".join(f"{c:+.2f}" for c in conf)
    print(f"  row {row}: first token {int(first[row])} -> drafted {tokens.tolist()}{extra}")
  print(f"time per walk: {per_walk_us:.1f} us (host wall-clock, mean of {args.walks} "
        "jitted calls; wts-bench measures device time)")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
