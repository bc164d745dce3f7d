"""Where a walk's span goes between its ops: the wts-bench chain (a flush step, then the
walk, N times in one executable) traced once with CUPTI, and for each op of a walk's
period its name, median duration and the median idle gap before it.

  python tools/walk_timeline.py --out $OUT/timeline [--batch 16,64] [--walks 10,30] [--events]
      [--api HEAD:DTYPE:B:MODE,...]
      [--command-buffers no-custom-calls,off] [--empty smem=227,wg=4,scratch=1,pdl=0;...]

Walks: the API's vanilla int8-planes walk at each batch and the API's walks that
``--api`` names (their tokens and status kept, as wts-bench keeps them), the stacked
kernel built with ``--stacked``'s variants (at their batches), and empty Mosaic kernels
of a given launch shape (``--empty``: shared-memory KB a block, warpgroups, blocks, whether
it signals a ``pl.get_global`` semaphore, whether it waits with griddepcontrol first,
whether its status is reduced after it). Each chain runs under each XLA command-buffer
setting of wts-bench's ``--command-buffers``. Prints one block a (walk, setting); writes
``timeline.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(__file__))

from wts_jax.bench import flush as l2_flush
from wts_jax.bench import timing


def empty_walk(smem: int = 227, wg: int = 4, blocks: int = 0, scratch: int = 1,
               pdl: int = 0, reduce: int = 1):
  """An empty Mosaic GPU kernel of the given launch shape as a walk (``--empty``'s
  names: shared memory KB a block, warpgroups, blocks, flags)."""
  return timing._launch_shape_walk(bool(scratch), bool(pdl), smem_bytes=smem * 1024,
                                   warpgroups=wg, blocks=blocks or None,
                                   reduce=bool(reduce))


def api_walk(batch: int, head_type: str = "vanilla", dtype: str = "int8p",
             mode: str = "greedy"):
  """(walk, operands, first tokens): the API's walk of ``head_type`` with W2 as wts-bench's
  ``--dtype`` names it (a gated head with its gate table, as wts-bench builds it),
  greedy or sampled at temperature 1."""
  import wts_jax
  from wts_jax.bench.support import make_bench_head
  from wts_jax.heads import HeadConfig
  from wts_jax.inputs import random_inputs
  if mode not in ("greedy", "sample"):
    raise ValueError(f"mode={mode!r} must be 'greedy' or 'sample'")
  config = HeadConfig.qwen3_4b(head_type, confidence=False)
  head, _ = make_bench_head(config, dtype, seed=0)
  base, first, hidden = random_inputs(config, batch, 7, jax.random.key(1))
  key = jax.random.key(2)

  def walk(operands, first_tokens):
    head, base, hidden, key = operands
    out = wts_jax.walk(head, base, first_tokens, hidden,
                       temperature=0.0 if mode == "greedy" else 1.0, key=key)
    return {"tokens": out.tokens, "status": out.status}   # (as wts-bench keeps them)
  return walk, (head, base.astype(jnp.bfloat16), hidden, key), first


def stacked_walk(batch: int, variant: str):
  """(walk, operands, first tokens): the stacked kernel built with ``variant``'s
  letters (``tools/stacked_probe.py``), its tokens and status kept."""
  import stacked_probe
  from wts_jax import device
  from wts_jax.pallas.stacked import launch
  from wts_jax.pallas.stacked.plan import plan_stacked
  from wts_jax.pallas.stacked.spec import StackedSpec
  from wts_jax.pallas.head_operands import serial_operands
  walk, (head, base, _, _), first = api_walk(batch)
  facts = device.current()
  plan_options, spec_options = stacked_probe.plan_and_spec_options(variant)
  plan = plan_stacked(vocab_size=head.config.vocab_size, rank=head.config.rank,
                      batch=batch, num_blocks=facts.num_sms,
                      smem_per_block=facts.smem_per_block, **plan_options)
  spec = StackedSpec(plan, batch, 7, **spec_options)
  operands = stacked_probe.walk_operands(spec, serial_operands(head, None), base, first)

  def walk(operands, first_tokens):
    w2, base, planes, _, w2_scale, s_lo = operands
    tokens, status = launch.stacked_walk(spec, w2, base, planes, first_tokens, w2_scale,
                                         s_lo)
    return {"tokens": tokens, "status": status}
  return walk, operands, first


def period_table(events: list[dict], n_walks: int) -> list[dict]:
  """Per op position of a walk's period (from one flush step to the next): name, median
  duration, median idle gap before it, over the periods of the modal length."""
  starts = [i for i, e in enumerate(events) if "flush" in e["name"]]
  if len(starts) < 2:
    return [{"error": f"{len(starts)} flush ops among {len(events)} ops"}]
  periods = list(zip(starts, starts[1:] + [len(events)]))[1:]
  size = statistics.mode(b - a for a, b in periods)
  periods = [a for a, b in periods if b - a == size]
  rows = []
  for i in range(size):
    durations, gaps = [], []
    for a in periods:
      k = a + i
      durations.append(events[k]["dur"])
      gaps.append(events[k]["ts"] - max(e["ts"] + e["dur"] for e in events[:k]))
    rows.append({"name": events[periods[0] + i]["name"][:60],
                 "dur_us": statistics.median(durations),
                 "gap_before_us": statistics.median(gaps)})
  return rows


def largest_gaps(events: list[dict], count: int = 5) -> list[dict]:
  """The chain's longest idle stretches of the device: the gap, and the op after it."""
  gaps, reach = [], None
  for i, e in enumerate(events):
    if reach is not None and e["ts"] > reach:
      gaps.append({"gap_us": e["ts"] - reach, "index": i, "name": e["name"]})
    reach = e["ts"] + e["dur"] if reach is None else max(reach, e["ts"] + e["dur"])
  return sorted(gaps, key=lambda g: -g["gap_us"])[:count]


def trace_chain(walk_fn, operands, first, flush, n_walks, options, carry_form="tokens"):
  """(the traced run's GPU ops, the median host wall µs of a run untraced)."""
  lowered, finish = timing.lower_chain(walk_fn, operands, first, flush, n_walks=n_walks,
                                       flush_impl="kernel", carry_form=carry_form)
  chain = finish(lowered.compile(compiler_options=options) if options
                 else lowered.compile())
  walls = []
  for _ in range(5):
    start = time.perf_counter()
    jax.block_until_ready(chain(first, flush, "cold"))
    walls.append((time.perf_counter() - start) * 1e6)
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      jax.block_until_ready(chain(first, flush, "cold"))
    return [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])}
            for e in timing.gpu_events(trace_dir)], statistics.median(walls[1:])


def main(argv=None) -> int:
  from wts_jax.bench.support import chain_compiler_options
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=".")
  parser.add_argument("--batch", default="16,64")
  parser.add_argument("--walks", default="10", help="walks a chain (comma-separated)")
  parser.add_argument("--events", action="store_true", help="keep every traced op")
  parser.add_argument("--stacked", default="",
                      help="B:VARIANT,... stacked kernels by tools/stacked_probe.py's letters")
  parser.add_argument("--api", default="",
                      help="HEAD:DTYPE:B:MODE,... more API walks (e.g. rnn:bf16:1:greedy)")
  parser.add_argument("--command-buffers", default="no-custom-calls,off")
  parser.add_argument("--carry", default="tokens",
                      help="the chain's carry forms (timing.CHAIN_CARRIES, comma-separated)")
  parser.add_argument("--empty", default="smem=227;scratch=0;pdl=1;smem=0;smem=100;wg=1;"
                      "blocks=66;reduce=0")
  args = parser.parse_args(argv)
  flush = l2_flush.make_jax_flush_buffer(l2_flush.default_flush_bytes())
  cases = []
  for batch in map(int, args.batch.split(",")):
    walk, operands, first = api_walk(batch)
    cases.append((f"int8p vanilla B={batch}", walk, operands, first))
  for text in [t for t in args.api.split(",") if t]:
    head_type, dtype, batch, mode = text.split(":")
    cases.append((f"{dtype} {head_type} B={batch} {mode}",
                  *api_walk(int(batch), head_type, dtype, mode)))
  for text in [t for t in args.stacked.split(",") if t]:
    batch, variant = text.split(":")
    cases.append((f"stacked B={batch} {variant}", *stacked_walk(int(batch), variant)))
  first16 = jnp.zeros((16,), jnp.int32)
  cases.append(("flush-only chain", None, (), first16))
  for text in [t for t in args.empty.split(";") if t]:
    params = {k: int(v) for k, v in (p.split("=") for p in text.split(","))}
    cases.append((f"empty {text}", empty_walk(**params), (), first16))
  results = []
  for (name, walk, operands, first), setting, n_walks, carry in itertools.product(
      cases, args.command_buffers.split(","), map(int, args.walks.split(",")),
      args.carry.split(",")):
    events, wall = [], float("nan")
    try:
      events, wall = trace_chain(walk, operands, first, flush, n_walks,
                                 chain_compiler_options(setting), carry)
      rows = period_table(events, n_walks)
    except Exception as err:   # one case's failure must not cost the others
      rows = [{"error": f"{type(err).__name__}: {err}"[:300]}]
    span = ((events[-1]["ts"] + events[-1]["dur"] - events[0]["ts"]) / n_walks
            if events else float("nan"))
    idle = largest_gaps(events)
    results.append({"case": name, "command_buffers": setting, "walks": n_walks,
                    "carry": carry,
                    "span_us_per_walk": span,
                    "host_wall_us_per_walk": wall / n_walks, "period": rows, "largest_gaps": idle,
                    "events": events if args.events else []})
    print(f"== {name} | command buffers {setting} | carry {carry} | {n_walks} walks | span/walk "
          f"{span:.1f} µs | host wall/walk {wall / n_walks:.1f} µs", flush=True)
    for row in rows:
      if "error" in row:
        print("   ", row["error"])
      else:
        print(f"   gap {row['gap_before_us']:7.2f}  dur {row['dur_us']:7.2f}  {row['name']}")
    print("   largest idle gaps:", ", ".join(
        f"{g['gap_us']:.1f} before #{g['index']} {g['name'][:28]}" for g in idle))
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "timeline.json"), "w") as f:
    json.dump({"device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
               "results": results}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
