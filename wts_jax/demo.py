"""``wts-demo``: a random-weight Qwen3-4B DSpark head walked by the best implementation.

No download: the head has the real shapes (V=151936, r=256, d=2560) and random weights.
Progress goes to stderr as the demo works (building the head and compiling the walk
take seconds on a CPU); the drafted tokens and the time per walk go to stdout.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np

import wts_jax
from wts_jax import sampling
from wts_jax.command_line import ArgumentParser, int_in, number_in
from wts_jax.heads import HeadConfig
from wts_jax.heads.config import HEAD_TYPES
from wts_jax.inputs import random_inputs

SHOWN_ROWS = 4


def build_parser() -> ArgumentParser:
  parser = ArgumentParser(prog="wts-demo", description=__doc__.splitlines()[0])
  parser.add_argument("--head", default="vanilla", choices=HEAD_TYPES,
                      help="serial head type (default: %(default)s)")
  parser.add_argument("--batch", type=int_in(1, sampling.MAX_ROWS), default=1,
                      help="rows B walked together (default: %(default)s)")
  parser.add_argument("--steps", type=int_in(1, sampling.MAX_STEPS), default=7,
                      help="draft positions K per walk (default: %(default)s)")
  parser.add_argument("--temperature", type=number_in(0), default=0.0,
                      help="0 for greedy; > 0 samples by Gumbel-max (default: %(default)s)")
  parser.add_argument("--impl", default="auto", choices=["auto", "pallas", "xla"],
                      help="pallas: the persistent kernel (needs a GPU); xla: the "
                           "step-wise walk; auto: pallas where it runs, else xla "
                           "(default: %(default)s)")
  parser.add_argument("--walks", type=int_in(1), default=20,
                      help="jitted walks timed after the first (compiling) one "
                           "(default: %(default)s)")
  return parser


def progress(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def main(argv=None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)

  progress(f"device: {jax.devices()[0].device_kind}  jax {jax.__version__}")
  config = HeadConfig.qwen3_4b(args.head)
  progress(f"building a random {args.head} head (V={config.vocab_size} r={config.rank} "
           f"d={config.hidden_size}) and inputs B={args.batch} K={args.steps} ...")
  head = wts_jax.make_head(config, seed=0)
  base, first, hidden = random_inputs(config, args.batch, args.steps, jax.random.key(1))
  key = jax.random.key(2) if args.temperature > 0 else None
  try:
    impl = wts_jax.chosen_implementation(head, base, args.impl)
  except ValueError as err:
    parser.error(f"argument --impl: {err}")

  walk = jax.jit(lambda h, b, f, x: wts_jax.walk(h, b, f, x, temperature=args.temperature,
                                                  key=key, impl=impl))
  progress(f"compiling the {impl} walk ...")
  out = wts_jax.check(jax.block_until_ready(walk(head, base, first, hidden)))
  progress(f"timing {args.walks} walks ...")
  start = time.perf_counter()
  for _ in range(args.walks):
    out = walk(head, base, first, hidden)
  jax.block_until_ready(out)
  per_walk_us = (time.perf_counter() - start) / args.walks * 1e6

  print(f"head: {args.head}  V={config.vocab_size} r={config.rank} d={config.hidden_size}  "
        f"B={args.batch} K={args.steps}  T={args.temperature}")
  print(f"implementation: {impl}")
  for row, tokens in enumerate(np.asarray(out.tokens)[:SHOWN_ROWS]):
    extra = ""
    if out.confidence is not None:
      # The confidence head's raw output: sigmoid of it is the predicted acceptance.
      logits = np.asarray(out.confidence)[row]
      extra = "  confidence logits " + " ".join(f"{c:+.2f}" for c in logits)
    print(f"  row {row}: first token {int(first[row])} -> drafted {tokens.tolist()}{extra}")
  if args.batch > SHOWN_ROWS:
    hidden_rows = args.batch - SHOWN_ROWS
    print(f"  ({hidden_rows} more row{'s' if hidden_rows > 1 else ''} not shown)")
  print(f"time per walk: {per_walk_us:.1f} us (host wall-clock, mean of {args.walks} "
        "jitted calls; wts-bench measures device time)", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
