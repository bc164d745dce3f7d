"""Device time of a walk from a CUPTI trace (``jax.profiler``), and the host's cost per walk.

  python tools/device_time.py --dtype int8p,bf16 --batch 1 --k 1,7 --out DIR

For each point: N walks dispatched back to back (warm L2, the same inputs), traced;
the trace's GPU ops are grouped by name (count, median and total device µs per walk),
the kernel's own median duration is the headline, the busy span per walk (first op start
to last op end, over N) beside it, the host's wall time per walk (N dispatches, one
block at the end), and the wall time per walk of N walks chained in one executable —
what each launch costs the host, which a decode loop whose device waits on its host pays.
Writes one JSON per run; prints a table.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp


def _trace_events(trace_dir: str) -> list[dict]:
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  paths += glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"),
                     recursive=True)
  if not paths:
    raise SystemExit(f"error: no trace file under {trace_dir}")
  with gzip.open(sorted(paths)[0], "rt") as f:
    data = json.load(f)
  return data.get("traceEvents", data if isinstance(data, list) else [])


def _device_ops(events: list[dict]) -> list[dict]:
  """Complete events on GPU streams (the process names say which pids are devices)."""
  names = {e["pid"]: str(e.get("args", {}).get("name", "")) for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  device_pids = {pid for pid, name in names.items()
                 if "/device:GPU" in name or "gpu" in name.lower()}
  return [e for e in events if e.get("ph") == "X" and e.get("pid") in device_pids
          and "dur" in e]


def traced_ops(fn, args, calls: int, trace_dir: str) -> tuple[list[dict], dict]:
  """The device ops of ``calls`` calls of ``fn(*args)`` dispatched back to back under
  the profiler, and their durations (µs) by op name."""
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(calls):
      out = fn(*args)
    jax.block_until_ready(out)
  ops = _device_ops(_trace_events(trace_dir))
  by_name: dict[str, list[float]] = {}
  for e in ops:
    by_name.setdefault(e["name"], []).append(float(e["dur"]))
  return ops, by_name


def time_point(walk_fn, args, walks: int, trace_dir: str) -> dict:
  out = walk_fn(*args)
  jax.block_until_ready(out)            # compile + warm-up
  for _ in range(3):
    jax.block_until_ready(walk_fn(*args))
  start = time.perf_counter()
  for _ in range(walks):
    out = walk_fn(*args)
  jax.block_until_ready(out)
  host_us = (time.perf_counter() - start) / walks * 1e6
  # The same walks chained in one executable (each starts from the last one's last
  # token): no Python dispatch per walk, only what each launch costs the host.
  def chained(*walk_args):
    tokens = None
    for _ in range(walks):
      first = walk_args[1] if tokens is None else tokens[:, -1]
      tokens = walk_fn(walk_args[0], first)
    return tokens
  chain = jax.jit(chained)
  jax.block_until_ready(chain(*args))
  start = time.perf_counter()
  jax.block_until_ready(chain(*args))
  chained_host_us = (time.perf_counter() - start) / walks * 1e6
  ops, by_name = traced_ops(walk_fn, args, walks, trace_dir)
  summary = {name: {"count_per_walk": len(d) / walks, "median_us": statistics.median(d),
                    "total_us_per_walk": sum(d) / walks}
             for name, d in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))}
  kernel = max(summary.items(), key=lambda kv: kv[1]["total_us_per_walk"],
               default=("(no device ops)", {"median_us": float("nan")}))
  span = ((max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)) / walks
          if ops else float("nan"))
  return {"kernel": kernel[0], "kernel_median_us": kernel[1]["median_us"],
          "busy_us_per_walk": sum(e["dur"] for e in ops) / walks,
          "span_us_per_walk": span, "host_us_per_walk": host_us,
          "chained_wall_us_per_walk": chained_host_us, "ops": summary}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dtype", default="int8p,bf16", help="bf16, int8 or int8p")
  parser.add_argument("--batch", default="1")
  parser.add_argument("--k", default="1,7")
  parser.add_argument("--walks", type=int, default=20)
  parser.add_argument("--residency", default="auto")
  parser.add_argument("--num-stages", type=int, default=None)
  parser.add_argument("--impl", default="pallas")
  parser.add_argument("--register-chunks", type=int, default=0)
  parser.add_argument("--out", default=".")
  args = parser.parse_args(argv)
  import wts_jax
  from wts_jax.bench.support import make_bench_head
  from wts_jax.heads import HeadConfig
  from wts_jax.inputs import random_inputs
  residency = (args.residency if args.residency in ("auto", "full", "none")
               else int(args.residency))
  if args.impl == "triton":
    config = wts_jax.TritonConfig(residency=residency, num_stages=args.num_stages)
  elif args.impl == "mosaic_row" or args.register_chunks:
    config = wts_jax.MosaicRowConfig(residency=residency, ring_stages=args.num_stages,
                                     register_chunks=args.register_chunks)
  elif residency != "auto" or args.num_stages:
    parser.error("--residency and --num-stages are a kernel's: --impl triton or mosaic_row")
  else:
    config = None
  head_config = HeadConfig.qwen3_4b("vanilla", confidence=False)
  rows = []
  for dtype in args.dtype.split(","):
    head, _ = make_bench_head(head_config, dtype, seed=0)
    for batch in map(int, args.batch.split(",")):
      for steps in map(int, args.k.split(",")):
        base, first, _ = random_inputs(head_config, batch, steps, jax.random.key(1))
        base = base.astype(jnp.bfloat16)
        fn = jax.jit(lambda b, f: wts_jax.walk(head, b, f, impl=args.impl,
                                                config=config).tokens)
        with tempfile.TemporaryDirectory() as trace_dir:
          point = time_point(fn, (base, first), args.walks, trace_dir)
        point.update(dtype=dtype, batch=batch, k=steps, residency=args.residency,
                     register_chunks=args.register_chunks,
                     device_kind=jax.devices()[0].device_kind, jax=jax.__version__)
        rows.append(point)
        print(f"{dtype:6s} B={batch:<3d} K={steps:<3d} kernel {point['kernel_median_us']:8.1f}"
              f" µs  busy {point['busy_us_per_walk']:8.1f}  span "
              f"{point['span_us_per_walk']:8.1f}  host {point['host_us_per_walk']:8.1f}"
              f"  chained {point['chained_wall_us_per_walk']:8.1f}"
              f"  ({point['kernel'][:40]})", flush=True)
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, f"device_time_{args.dtype.replace(',', '_')}"
                                f"_x{args.register_chunks}.json")
  with open(path, "w") as f:
    json.dump(rows, f, indent=1)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
