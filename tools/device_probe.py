"""One device call's worth of checks and timings for kernel development (H200).

Sections (each isolated: a failure is printed and the next section runs):
  env      versions, device, SM count
  check    wts and pallas-stepwise vs the XLA reference at the real Qwen3-4B shape
  time     per-walk device time of kernel variants vs xla / stepwise / torch, cold L2
  mgpu     the Mosaic GPU barrier experiment (tools/experiments/mgpu_barrier_probe.py)

Timing here is the quick development method: N walks on N different first-token
vectors, unrolled in one jitted executable (no host dispatch inside), host wall clock
around it; for cold L2 a 256 MB buffer is rewritten between walks and an identical
flush-only executable is subtracted. ``wts-bench`` is the reporting harness.

  python tools/device_probe.py [--sections env,check,time,mgpu] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import wts_jax
from wts_jax import validation
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.quantize import quantize_w2

RESULTS: dict = {}
DRY = False  # --dry: tiny shapes, kernels in interpret mode, on CPU (checks this script)


def section(name):
  def wrap(fn):
    def run(args):
      print(f"\n=== {name} ===", flush=True)
      start = time.perf_counter()
      try:
        fn(args)
      except Exception:
        print(f"SECTION {name} FAILED\n{traceback.format_exc()[-4000:]}", flush=True)
      print(f"--- {name}: {time.perf_counter() - start:.1f} s", flush=True)
    return run
  return wrap


@section("env")
def env(args):
  device = jax.devices()[0]
  info = {"jax": jax.__version__, "device": device.device_kind,
          "core_count": getattr(device, "core_count", None),
          "backend": jax.default_backend()}
  for module in ("flax", "torch", "triton", "orbax.checkpoint"):
    try:
      info[module] = __import__(module, fromlist=["x"]).__version__
    except Exception as err:
      info[module] = f"missing ({err})"
  RESULTS["env"] = info
  print(info)


def real_case(head_type, batch, steps=7, seed=0, rank=256):
  config = HeadConfig.qwen3_4b(head_type, rank=rank)
  if DRY:
    config = HeadConfig(1000, 32, 48, head_type, confidence=True)
  head = wts_jax.make_head(config, seed=seed)
  return head, random_inputs(config, batch, steps, jax.random.key(seed + 1))


@section("check")
def check(args):
  from wts_jax.pallas.stepwise import stepwise_walk
  rows = []
  cases = [("vanilla", 1, 0.0, None), ("vanilla", 1, 0.8, None), ("gated", 1, 0.0, None),
           ("rnn", 1, 0.0, None), ("vanilla", 16, 0.0, None), ("gated", 64, 0.7, None),
           ("rnn", 64, 0.0, None), ("vanilla", 1, 0.0, "int8"), ("vanilla", 4, 0.0, "none")]
  for head_type, batch, temperature, variant in cases:
    head, (base, first, hidden) = real_case(head_type, batch)
    config = wts_jax.WalkConfig(interpret=DRY)
    if variant == "int8":
      head = quantize_w2(head, "int8")
    elif variant == "none":
      config = wts_jax.WalkConfig(residency="none", interpret=DRY)
    key = jax.random.key(3) if temperature else None
    kwargs = dict(temperature=temperature, key=key, return_logits=True,
                  return_logprobs=True)
    ref = wts_jax.walk(head, base, first, hidden, impl="xla", **kwargs)
    for path in ("wts", "stepwise"):
      try:
        if path == "wts":
          out = jax.jit(lambda h, b, f, x: wts_jax.walk(h, b, f, x, impl="pallas",
                                                        config=config, **kwargs))(
              head, base, first, hidden)
        else:
          mode = validation.make_sampling(temperature, key, batch)
          out = stepwise_walk(head, base, first, hidden, mode, return_logits=True,
                              return_logprobs=True, interpret=DRY)
        same = bool(np.array_equal(np.asarray(out.tokens), np.asarray(ref.tokens)))
        row = dict(path=path, head=head_type, batch=batch, temperature=temperature,
                   variant=variant, tokens_equal=same, status=int(out.status),
                   logits_maxdiff=float(np.abs(np.asarray(out.logits)
                                               - np.asarray(ref.logits)).max()),
                   logprob_maxdiff=float(np.abs(np.asarray(out.logprobs)
                                                - np.asarray(ref.logprobs)).max()))
        if ref.confidence is not None:
          row["conf_maxdiff"] = float(np.abs(np.asarray(out.confidence)
                                             - np.asarray(ref.confidence)).max())
      except Exception as err:
        row = dict(path=path, head=head_type, batch=batch, variant=variant,
                   error=f"{type(err).__name__}: {str(err)[-600:]}")
      rows.append(row)
      print(row, flush=True)
  RESULTS["check"] = rows


def _chain(walk_fn, n, cold):
  """N walks (different first tokens each), optionally a 256 MB rewrite between."""
  def run(head, base, firsts, hidden, flush):
    outs = []
    for i in range(n):
      if walk_fn is not None:
        outs.append(walk_fn(head, base, firsts[i], hidden))
      if cold:
        flush = flush + 1
    return outs, flush
  return jax.jit(run)


def device_time_us(walk_fn, head, base, first, hidden, *, n=20, repeats=7, cold=True):
  if DRY:
    n, repeats = 2, 1
  vocab = base.shape[-1]
  firsts = [(first + 7919 * i) % vocab for i in range(n)]
  flush = jnp.zeros((64 << 10 if DRY else 64 << 20,), jnp.int32)  # 256 MB
  full, flush_only = _chain(walk_fn, n, cold), _chain(None, n, cold)
  jax.block_until_ready(full(head, base, firsts, hidden, flush))
  jax.block_until_ready(flush_only(head, base, firsts, hidden, flush))
  totals, flushes = [], []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(full(head, base, firsts, hidden, flush))
    totals.append(time.perf_counter() - start)
    start = time.perf_counter()
    jax.block_until_ready(flush_only(head, base, firsts, hidden, flush))
    flushes.append(time.perf_counter() - start)
  return (np.median(totals) - np.median(flushes)) / n * 1e6


def torch_time_us(head, base, first, hidden, *, graph, n=20, repeats=7, cold=True):
  import torch
  from wts_jax.peers import deepspec_torch
  device = torch.device("cuda")
  torch_head = deepspec_torch.from_wts_head(head, dtype=torch.bfloat16, device=device)
  tb = torch.from_dlpack(base)
  tf = torch.from_dlpack(first).long()
  th = None if hidden is None else torch.from_dlpack(hidden)
  flush = torch.zeros(64 << 20, dtype=torch.int32, device=device)
  run = lambda: deepspec_torch.sample_block_tokens(torch_head, tb, tf, th)
  for _ in range(3):
    run()
  if graph:
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
      run()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
      run()
    run = g.replay
  times = []
  for walks in (True, False):
    per = []
    for _ in range(repeats):
      start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      torch.cuda.synchronize()
      start.record()
      for _ in range(n):
        if cold:
          flush.add_(1)
        if walks:
          run()
      end.record()
      torch.cuda.synchronize()
      per.append(start.elapsed_time(end) * 1e3)
    times.append(np.median(per))
  return (times[0] - times[1]) / n


@section("time")
def timing(args):
  from wts_jax.pallas.stepwise import stepwise_walk
  rows = []
  points = [("vanilla", 1), ("vanilla", 64), ("gated", 1), ("rnn", 1)]
  if args.quick:
    points = points[:1]
  for head_type, batch in points:
    head, (base, first, hidden) = real_case(head_type, batch)
    ref_tokens = np.asarray(wts_jax.walk(head, base, first, hidden, impl="xla").tokens)
    variants = {
        "xla": (lambda h, b, f, x: wts_jax.walk(h, b, f, x, impl="xla").tokens, head),
        "stepwise": (lambda h, b, f, x: stepwise_walk(
            h, b, f, x, validation.make_sampling(0.0, None, batch),
            interpret=DRY).tokens, head),
    }
    configs = {"wts": dict()}
    if head_type == "vanilla" and batch == 1:
      configs.update({
          "wts-res0": dict(residency="none"), "wts-res4": dict(residency=256),
          "wts-w4": dict(num_warps=4), "wts-w16": dict(num_warps=16),
          "wts-s1": dict(num_stages=1), "wts-t32": dict(tile_rows=32),
          "wts-t128": dict(tile_rows=128, residency=256),
          "wts-p66": dict(num_programs=66),
      })
    for name, options in configs.items():
      config = wts_jax.WalkConfig(interpret=DRY, **options)
      variants[name] = ((lambda c: lambda h, b, f, x: wts_jax.walk(
          h, b, f, x, impl="pallas", config=c).tokens)(config), head)
    if head_type == "vanilla" and batch == 1:
      qhead = quantize_w2(head, "int8")
      q_tokens = np.asarray(wts_jax.walk(qhead, base, first, hidden, impl="xla").tokens)
      for name, options in (("wts-int8", dict()), ("wts-int8-res0", dict(residency="none"))):
        config = wts_jax.WalkConfig(interpret=DRY, **options)
        variants[name] = ((lambda c: lambda h, b, f, x: wts_jax.walk(
            h, b, f, x, impl="pallas", config=c).tokens)(config), qhead)
    for name, (fn, walk_head) in variants.items():
      row = dict(path=name, head=head_type, batch=batch)
      try:
        tokens = np.asarray(jax.jit(fn)(walk_head, base, first, hidden))
        want = q_tokens if "int8" in name else ref_tokens
        row["tokens_equal"] = bool(np.array_equal(tokens, want))
        row["cold_us"] = round(device_time_us(fn, walk_head, base, first, hidden), 1)
        row["warm_us"] = round(device_time_us(fn, walk_head, base, first, hidden,
                                              cold=False), 1)
      except Exception as err:
        row["error"] = f"{type(err).__name__}: {str(err)[-800:]}"
      rows.append(row)
      print(row, flush=True)
    for graph in (() if DRY else (False, True)):
      row = dict(path="torch-graph" if graph else "torch-eager", head=head_type,
                 batch=batch)
      try:
        row["cold_us"] = round(torch_time_us(head, base, first, hidden, graph=graph), 1)
        row["warm_us"] = round(torch_time_us(head, base, first, hidden, graph=graph,
                                             cold=False), 1)
      except Exception as err:
        row["error"] = f"{type(err).__name__}: {str(err)[-800:]}"
      rows.append(row)
      print(row, flush=True)
  RESULTS["time"] = rows


@section("mgpu")
def mgpu(args):
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "experiments"))
  import mgpu_barrier_probe
  mgpu_barrier_probe.main()


SECTIONS = {"env": env, "check": check, "time": timing, "mgpu": mgpu}


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--sections", default="env,check,time,mgpu")
  parser.add_argument("--out", default=os.environ.get("OUT", "."))
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--dry", action="store_true")
  args = parser.parse_args(argv)
  global DRY
  DRY = args.dry
  for name in args.sections.split(","):
    SECTIONS[name](args)
    with open(os.path.join(args.out, "probe.json"), "w") as f:
      json.dump(RESULTS, f, indent=1, default=str)
  print("\n=== summary ===")
  for row in RESULTS.get("time", []):
    print(f"{row['path']:>16} {row['head']:>8} B={row['batch']:<3} "
          f"cold={row.get('cold_us', '-')} warm={row.get('warm_us', '-')} "
          f"ok={row.get('tokens_equal', '-')} {row.get('error', '')[:120]}")


if __name__ == "__main__":
  main()
