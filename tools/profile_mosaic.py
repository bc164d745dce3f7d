"""Where a Mosaic walk's time goes: Mosaic GPU's on-device profiler over the kernel's
named regions (``jax.named_scope`` in ``wts_jax/pallas/row/kernel.py``), per block and
per step, at the Qwen3-4B shape.

  python tools/profile_mosaic.py --out $OUT/profile [--splits 3/3,0/6/3] [--batch 1]

A split is resident chunks / ring slots [/ chunks per WGMMA wait [/ chunks in
registers]] (registers: ``--dtype int8p`` only).

For each resident/ring split: check the tokens against the XLA walk, run the profiled
kernel after an L2 flush, and summarise the last trace: per region the median over
blocks of its total per walk, per step the slowest block's work before the grid barrier,
and the barrier's wait. Times are SM clock cycles (``%clock``); µs at ``--clock-ghz``.
The profiler's own cost (two shared-memory stores per region) is in the figures.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

import wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.pallas import mosaic_plan
from wts_jax.pallas.row.launch import row_walk
from wts_jax.pallas.row.spec import RowSpec
from wts_jax import device as device_facts

PROFILE_SPACE = 320        # regions per warpgroup: 7 steps × (18 chunks × 2 + 4) + 1


def _profile_bytes(space: int) -> int:
  return space * 2 * 2 * 4 * 1   # one warpgroup: 2 events a region, 2 words an event


def _regions(trace_file):
  """{tid: [(name, begin, end)]} in cycles (the trace's ts is (ns + cycles) / 1e3)."""
  events = json.load(open(trace_file))["traceEvents"]
  per_tid = collections.defaultdict(list)
  stacks = collections.defaultdict(list)
  for ev in events:
    tid = ev["tid"]
    ts = ev["ts"] * 1e3
    if ev["ph"] == "B":
      stacks[tid].append((ev["name"], ts))
    else:
      name, begin = stacks[tid].pop()
      per_tid[tid].append((name, begin, ts))
  for regions in per_tid.values():
    regions.sort(key=lambda r: r[1])
  return per_tid


def summarise(trace_file, steps, clock_ghz):
  per_tid = _regions(trace_file)
  totals = collections.defaultdict(list)        # name -> per-block total cycles
  step_work = collections.defaultdict(list)     # step -> per-block cycles before sync
  step_sync = collections.defaultdict(list)     # step -> per-block grid_sync cycles
  spans = []
  for regions in per_tid.values():
    block_total = collections.Counter()
    step, step_begin = 0, None
    for name, begin, end in regions:
      block_total[name] += end - begin
      if name in ("prologue", "register_chunks"):
        continue
      if step_begin is None:
        step_begin = begin
      if name == "grid_sync":
        step_work[step].append(begin - step_begin)
        step_sync[step].append(end - begin)
      if name == "gather":
        step, step_begin = step + 1, end
    for name, cycles in block_total.items():
      totals[name].append(cycles)
    spans.append(regions[-1][2] - regions[0][1])
  us = lambda cycles: cycles / (clock_ghz * 1e3)
  lines = [f"trace {os.path.basename(trace_file)}: {len(per_tid)} blocks; "
           f"µs at {clock_ghz} GHz",
           f"kernel span per block (first region to last): median {us(statistics.median(spans)):.1f} µs"
           f", max {us(max(spans)):.1f} µs",
           "region            per-block total per walk: median µs (min–max)   per step"]
  for name, values in sorted(totals.items(), key=lambda kv: -statistics.median(kv[1])):
    med = statistics.median(values)
    lines.append(f"  {name:16s} {us(med):8.1f} ({us(min(values)):.1f}–{us(max(values)):.1f})"
                 f"   {us(med) / steps:6.2f}")
  lines.append("step  work before the barrier µs: median / slowest block   grid_sync µs: "
               "median / min")
  for step in sorted(step_work):
    work, sync = step_work[step], step_sync[step]
    lines.append(f"  {step}   {us(statistics.median(work)):7.2f} / {us(max(work)):7.2f}"
                 f"        {us(statistics.median(sync)):7.2f} / {us(min(sync)):7.2f}")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--splits", default="3/3,0/6",
                      help="resident/ring-slot[/group] splits, comma-separated")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--steps", type=int, default=7)
  parser.add_argument("--clock-ghz", type=float, default=1.98)
  parser.add_argument("--gemv", default="registers", choices=("registers", "wgmma"))
  parser.add_argument("--head", default="vanilla", choices=("vanilla", "gated"))
  parser.add_argument("--dtype", default="bf16", choices=("bf16", "int8", "int8p"),
                      help="W2: bf16, or int8 with per-row scales (int8p: z as two "
                           "int8 planes, the int8 x int8 WGMMA)")
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  config = HeadConfig.qwen3_4b(args.head, confidence=False)
  head = wts_jax.make_head(config, seed=0)
  if args.dtype in ("int8", "int8p"):
    from wts_jax.quantize import quantize_w2
    head = quantize_w2(head, "int8", state="planes" if args.dtype == "int8p" else "float")
  base, first, hidden = random_inputs(config, args.batch, args.steps, jax.random.key(1))
  gated = args.head == "gated"
  if not gated:
    hidden = None
  want = np.asarray(wts_jax.walk(head, base, first, hidden, impl="xla").tokens)
  serial = head.markov_head
  w2, w1 = serial.markov_w2.weight[...], serial.markov_w1.weight[...]
  w2_scale = serial.markov_w2.scale[...] if args.dtype != "bf16" else None
  planes = dict(w1_scale=serial.markov_w1_planes.scale[...]) if args.dtype == "int8p" else {}
  if planes:
    w1 = serial.markov_w1_planes.planes[...]
  device = device_facts.current()
  smem = device.smem_per_block - _profile_bytes(PROFILE_SPACE) - mosaic_plan.SMEM_ALIGNMENT
  flush = jnp.zeros((256 << 20) // 4, jnp.float32)
  report = []
  for split in args.splits.split(","):
    resident, stages, group, held = (int(x) for x in (split + "/1/0").split("/")[:4])
    plan = mosaic_plan.plan_mosaic(vocab_size=config.vocab_size, rank=config.rank,
                          num_sms=device.num_sms, smem_per_block=smem,
                          resident_chunks=resident, ring_stages=stages,
                          batch=args.batch, gemv=args.gemv,
                          w2_itemsize=jnp.dtype(w2.dtype).itemsize, group=group,
                          gated=gated, int8_state=bool(planes), register_chunks=held)
    directory = os.path.join(
        args.out,
        f"{args.head}-{args.dtype}-{args.gemv}-r{resident}s{stages}g{group}x{held}")
    os.makedirs(directory, exist_ok=True)
    spec = RowSpec(plan=plan, batch=args.batch, steps=args.steps, greedy=True,
                   spin_limit=wts_jax.MosaicRowConfig().sync_spin_limit, interpret=False,
                   profile_dir=directory, profile_space=PROFILE_SPACE)
    gate = (dict(gate_weight=serial.gate_proj.weight[...], gate_hoisted=serial.hoist(hidden))
            if gated else {})
    run = jax.jit(lambda w2, b, w1, f, s, gate, planes: row_walk(
        spec, w2, b, w1, f, w2_scale=s, **gate, **planes))
    for _ in range(3):
      flush = (flush + 1).block_until_ready()   # evict W2 from the L2
      tokens, status = run(w2, base, w1, first, w2_scale, gate, planes)
      tokens.block_until_ready()
    same = np.array_equal(np.asarray(tokens), want)
    jax.effects_barrier()   # the trace is written by a host callback
    traces = sorted(glob.glob(os.path.join(directory, "*-trace.json")))
    header = f"== split {split}: {plan.describe()}\n   tokens {'equal' if same else 'DIFFER'} " \
             f"to the XLA walk, status {int(status)}"
    report.append(header + "\n" + (summarise(traces[-1], args.steps, args.clock_ghz)
                                   if traces else "   no trace written"))
    print(report[-1], flush=True)
  with open(os.path.join(args.out, "summary.txt"), "w") as f:
    f.write("\n\n".join(report) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
