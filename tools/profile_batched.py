"""Where the batched Mosaic walk's time goes, and what its build options change: one
device call that checks, times and profiles many variants at the Qwen3-4B shape.

  python tools/profile_batched.py --out $OUT/batched [--variants bf16:64:greedy:r2+s2,...]
      [--profile VARIANT,...] [--dump VARIANT,...]

``--variants sweep:DTYPE`` expands to the planner's choices over B and mode
(``planner_sweep``), ``auto:DTYPE`` to the planner's own plans (``auto_sweep``). A variant is ``dtype:B:mode:options`` — dtype bf16 or int8p
(int8 W2, z as two int8 planes) for the vanilla head, or gated / rnn (those heads,
bf16); int8, gated8, rnn8: the same heads with an int8 W2 quantized without planes,
widened to bf16 on the kernel (``BatchedPlan.w2_row_scale``); mode greedy or sample, options joined by ``+``: ``x`` (the head's update split
over the blocks:
``serial_update="split"``, the rnn head's only way), ``rR`` / ``sS`` / ``bN``
(resident chunks — a warpgroup's —, ring slots, base-ring slots), ``wW`` (warpgroups a
block), ``n`` (the batch on the WGMMA's N), ``P`` / ``C``
(a producer warpgroup issues every refill, or the computing warpgroups do), ``g`` /
``u`` (the z rows gathered by the leader's four warps, or by one thread; unnamed: the
planner's), ``oG`` (each chunk's WGMMA issued before the previous chunk's epilogue, in
groups of G chunks), ``k`` (profiling: a warpgroup barrier, region "skew",
before each chunk's WGMMA), ``M`` / ``N`` (warpgroup 1's bests handed over unreduced, one reduction a step,
or not; unnamed: the planner's), ``a`` (the planner's batch axis), ``F`` (profiling: the first
tokens produced by an op of the walk, which otherwise passes them to the kernel as
given), ``A`` (profiling: ≈ 3 ms of
device work queued before the timed walks, so the host launches ahead of the device),
``E`` / ``e`` (each streamed chunk's ring slot refilled before its
epilogue, or after it: ``BatchedSpec.ring_refill``; unnamed: the planner's), ``iN`` (profiling: the profiler's buffer holds N
regions a warpgroup, default 1200; its shared memory, reserved for three warpgroups, is
taken from the plan, so a smaller N can keep a plan's second warpgroup), ``T`` (profiling: each row's base logits spiked at one column of its own at every step,
so a row's token never changes and each step gathers the W1 rows the step before
gathered — the gather's cost with its rows recently read, against random tokens').
Options unnamed are the planner's, except the batch axis (M unless ``n`` or
``a``).

For each variant: tokens against the XLA walk (greedy equal, sampled bit for bit), then
the walk's device time from a CUPTI trace, each walk after an L2 flush (median of
``--walks``). ``--profile``: Mosaic GPU's on-device profiler over the kernel's named
regions (cycles; median over blocks of each region's total per walk, over every
warpgroup's trace and each warpgroup's apart). ``--dump``: the
ptxas report (registers, spills) and SASS statistics of the variant's kernel.
Writes ``results.json`` and ``summary.txt`` under ``--out``. Each ``--profile`` variant
runs in a process of its own (``--isolate on``, the default): a crash loses only that
variant, and its output stays in ``profile-*/process.log``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import wts_jax
from wts_jax import device as device_facts
from wts_jax import validation
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.bench import timing
from wts_jax.pallas import backend, mosaic_batched_backend
from wts_jax.walk_config import MosaicBatchedConfig

PROFILE_SPACE = 1200     # regions a warpgroup: 7 steps × (18 chunks × 4 + 6) + prologue
STEPS = 7


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  dtype: str
  batch: int
  greedy: bool
  resident: int | None = None
  stages: int | None = None
  base_stages: int | None = None
  batch_axis: str | None = "m"   # None: the planner's
  warpgroups: int | None = None
  producer: bool | None = None
  split: bool = False
  table: bool = False   # serial_update="table" (a gate-table dtype: gatedT, gatedT8)
  probe_skew: bool = False
  merge_tiles: bool | None = None
  first_op: bool = False
  host_ahead: bool = False
  fixed_tokens: bool = False
  ring_refill: str | None = None   # BatchedSpec.ring_refill (None: the planner's)
  profile_space: int = PROFILE_SPACE   # profiled regions a warpgroup (its buffer's size)
  # BatchedPlan fields set after planning: only those the variant names (the rest stay
  # the planner's).
  plan_options: dict = dataclasses.field(default_factory=dict)


# Single-letter options: the Variant field (or plan field, or planner argument) each
# sets, and to what.
FLAGS = {"n": ("batch_axis", "n"), "a": ("batch_axis", None),
         "x": ("split", True), "y": ("table", True),
         "g": ("warp_gather", True), "u": ("warp_gather", False),
         "P": ("producer", True), "C": ("producer", False), "k": ("probe_skew", True),
         "M": ("merge_tiles", True), "N": ("merge_tiles", False),
         "F": ("first_op", True), "A": ("host_ahead", True), "T": ("fixed_tokens", True),
         "E": ("ring_refill", "before_epilogue"), "e": ("ring_refill", "after_epilogue")}
# Plan fields a variant sets after planning (the planner's own choice otherwise).
PLAN_OPTIONS = ("warp_gather", "overlap_chunks")


# dtype -> (head type, W2 quantization: None, "planes", or "int8" widened on the kernel)
DTYPES = {"bf16": ("vanilla", None), "int8p": ("vanilla", "planes"),
          "int8": ("vanilla", "int8"), "gated": ("gated", None), "rnn": ("rnn", None),
          "gated8": ("gated", "int8"), "rnn8": ("rnn", "int8"),
          "gatedT": ("gated", None), "gatedT8": ("gated", "int8"),
          "rnnT": ("rnn", None), "rnnT8": ("rnn", "int8")}
UPDATE_DTYPES = ("gated", "rnn", "gated8", "rnn8")
# The gated heads with their gate table (``wts_jax.with_gate_table``: "auto" takes it on N).
TABLE_DTYPES = ("gatedT", "gatedT8")
# The rnn heads with their joint table (``wts_jax.with_joint_table``: "auto" takes it on N
# up to 4 rows; ``y`` asks for it up to 16).
JOINT_TABLE_DTYPES = ("rnnT", "rnnT8")


def planner_sweep(dtype: str) -> list[str]:
  """``sweep:DTYPE`` in ``--variants``: the planner's choices (batch axis, computing
  warpgroups, producer) over B 4, 16, 32, 64, greedy and sampled — what
  ``auto_batch_axis``, ``auto_warpgroups`` and ``auto_producer`` are read from. The
  gated and rnn heads (their update split) without a producer, which they do not take."""
  split = dtype in UPDATE_DTYPES
  variants = []
  for batch in (4, 16, 32, 64):
    for mode in ("greedy", "sample"):
      on_n = (["n+x+w1", "n+x+w2"] if split else ["n+w1", "n+w1+P", "n+w2+C", "n+w2+P"])
      on_m = ["x+w1", "x+w2"] if split else ["w1", "w2+C", "w2+P"]
      for options in (on_n if batch <= 32 else []) + on_m:
        variants.append(f"{dtype}:{batch}:{mode}:{options}")
  return variants


AUTO_BATCHES = (4, 5, 13, 16, 32, 64)


def auto_sweep(dtype: str) -> list[str]:
  """``auto:DTYPE`` in ``--variants``: the planner's own plans (every choice its own, the
  batch axis too) over B 4, 5, 13, 16, 32, 64, greedy and sampled."""
  return [f"{dtype}:{batch}:{mode}:a" for batch in AUTO_BATCHES
          for mode in ("greedy", "sample")]


def expand_variants(text: str) -> list[str]:
  """The comma-separated variants, each ``sweep:DTYPE`` (``planner_sweep``) or
  ``auto:DTYPE`` (``auto_sweep``) expanded."""
  out = []
  for item in (t for t in text.split(",") if t):
    kind, _, dtype = item.partition(":")
    out += ({"sweep": planner_sweep, "auto": auto_sweep}[kind](dtype)
            if kind in ("sweep", "auto") else [item])
  return out


def parse_variant(text: str) -> Variant:
  dtype, batch, mode, *rest = text.split(":")
  if dtype not in DTYPES or mode not in ("greedy", "sample"):
    raise SystemExit(f"error: bad variant {text!r}")
  options, plan_options = {}, {}
  for option in (rest[0].split("+") if rest and rest[0] else []):
    if option in FLAGS:
      key, value = FLAGS[option]
    elif m := re.fullmatch(r"([rsbwoi])(\d+)", option):
      key = {"r": "resident", "s": "stages", "b": "base_stages",
             "w": "warpgroups", "o": "overlap_chunks", "i": "profile_space"}[m.group(1)]
      value = int(m.group(2))
    else:
      raise SystemExit(f"error: bad option {option!r} in {text!r}")
    (plan_options if key in PLAN_OPTIONS else options)[key] = value
  return Variant(text, dtype, int(batch), mode == "greedy", plan_options=plan_options,
                 **options)


class Heads:
  """The Qwen3-4B-shape heads of ``DTYPES``, built once each."""

  def __init__(self):
    self._heads = {}

  @staticmethod
  def config(dtype):
    return HeadConfig.qwen3_4b(DTYPES[dtype][0], confidence=False)

  def __call__(self, dtype):
    if dtype not in self._heads:
      head = wts_jax.make_head(self.config(dtype), seed=0)
      quantized = DTYPES[dtype][1]
      if quantized:
        from wts_jax.quantize import quantize_w2
        head = quantize_w2(head, "int8",
                           state="planes" if quantized == "planes" else "float")
      if dtype in TABLE_DTYPES:
        head = wts_jax.with_gate_table(head)
      if dtype in JOINT_TABLE_DTYPES:
        head = wts_jax.with_joint_table(head)
      self._heads[dtype] = head
    return self._heads[dtype]


def build_with_profile_space(variant: Variant, heads: Heads, directory: str, tries: int = 3):
  """``build`` with the profiler's buffer beside the plan: shared memory reserved for it
  (three warpgroups' worth, a producer's included), and where the compiled kernel still
  exceeds the block's shared memory (the plan's count is not Mosaic's to the byte) the
  excess reserved too, so the planner shrinks the ring or the resident chunks."""
  return reserving_excess(
      lambda reserve: build(variant, heads, smem_reserve=reserve, profile_dir=directory),
      variant.profile_space * 2 * 4 * 3 + 1024, tries=tries)


def reserving_excess(attempt, reserve: int, *, tries: int = 3, margin: int = 1024):
  """``attempt(reserve)`` (shared memory kept back from a kernel's plan), tried again
  with the bytes the compiled kernel says it exceeds the block's shared memory by, plus
  ``margin``, kept back too (a plan's count is not Mosaic's to the byte)."""
  for attempt_number in range(tries):
    try:
      return attempt(reserve)
    except ValueError as err:
      excess = re.search(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)", str(err))
      if excess is None or attempt_number == tries - 1:
        raise
      reserve += int(excess[1]) - int(excess[2]) + margin


FIXED_TOKEN_SPIKE = 1000.0   # far above any logit of the random inputs, sampled or not


def with_fixed_tokens(base):
  """``base`` [B, K, V] with row b's logit at column (977 · b + 13) mod V raised by
  ``FIXED_TOKEN_SPIKE`` at every step: each row's token, distinct from the other rows',
  is the same at every step."""
  rows, _, vocab = base.shape
  columns = (977 * jnp.arange(rows) + 13) % vocab
  spike = jnp.zeros(base.shape, jnp.float32).at[jnp.arange(rows), :, columns].set(
      FIXED_TOKEN_SPIKE)
  return (base.astype(jnp.float32) + spike).astype(base.dtype)


def build(variant: Variant, heads: Heads, *, smem_reserve: int = 0, profile_dir: str = ""):
  head = heads(variant.dtype)
  base, first, hidden = random_inputs(heads.config(variant.dtype), variant.batch, STEPS,
                                      jax.random.key(variant.batch))
  if variant.fixed_tokens:
    base = with_fixed_tokens(base)
  if not head.config.needs_hidden:
    hidden = None
  temperature = 0.0 if variant.greedy else 0.8
  key = None if variant.greedy else jax.random.key(7)
  mode = validation.make_sampling(temperature, key, variant.batch)
  config = MosaicBatchedConfig(
      ring_stages=variant.stages, batch_axis=variant.batch_axis,
      warpgroups=variant.warpgroups, base_stages=variant.base_stages,
      producer=variant.producer,
      serial_update="split" if variant.split else "table" if variant.table else "auto",
      merge_tiles=variant.merge_tiles,
      residency=(variant.resident * 64 * (variant.warpgroups or 1)
                 if variant.resident is not None else "auto"))
  device = device_facts.current()
  device = dataclasses.replace(device, smem_per_block=device.smem_per_block - smem_reserve)
  shapes = backend.WalkShapes.of(base, mode.greedy)
  spec = mosaic_batched_backend.plan(head, shapes, config, device)
  if isinstance(spec, backend.Refusal):
    raise ValueError(f"{variant.name}: {spec.reason}")
  spec = dataclasses.replace(spec, plan=dataclasses.replace(spec.plan,
                                                            **variant.plan_options))
  from wts_jax.pallas.batched.spec import BatchedLab
  spec = dataclasses.replace(spec, lab=BatchedLab(
      profile_dir=profile_dir, probe_skew=variant.probe_skew,
      profile_space=variant.profile_space if profile_dir else 0))
  if variant.ring_refill:
    spec = dataclasses.replace(spec, ring_refill=variant.ring_refill)
  def walk(head, base, first, hidden):
    if variant.first_op:   # the first tokens produced by an op of the walk (adds 0)
      first = first + (base[0, 0, 0] != base[0, 0, 0]).astype(first.dtype)
    return mosaic_batched_backend.launch(spec, backend.WalkOperands(head, base, first, hidden,
                                                                    mode))
  run = jax.jit(walk).lower(head, base, first, hidden).compile()
  want = wts_jax.walk(head, base, first, hidden, temperature=temperature, key=key,
                      impl="xla")
  return spec, run, (head, base, first, hidden), np.asarray(want.tokens)


def mismatch(variant: Variant, tokens, want, operands) -> dict:
  """Where a variant's tokens leave the reference's: how many differ, the first (row,
  step), and for a greedy walk the reference's top-2 logit gap there (a near-tie that
  summation order can flip has a gap near fp32 rounding; a wrong kernel, any gap)."""
  differ = tokens != want
  row = int(np.flatnonzero(differ.any(axis=1))[0])
  step = int(np.flatnonzero(differ[row])[0])
  found = {"tokens_differing": int(differ.sum()), "first_differing": [row, step]}
  if variant.greedy:
    head, base, first, hidden = operands
    logits = np.asarray(wts_jax.walk(head, base, first, hidden, impl="xla",
                                     return_logits=True).logits[row, step], np.float64)
    top2 = np.sort(logits)[-2:]
    found["reference_gap"] = float(top2[1] - top2[0])
  return found


def time_walks(run, args, walks: int, host_ahead: bool = False):
  """Device µs of each walk (the sum of its ops), each after an L2 flush; the median of
  its longest op (the kernel); the last walk's ops (name, start after the walk's first
  op, duration; µs), which show what runs around the kernel and the gaps; and the
  medians of the idle between a flush and its walk's first op and between that op and
  the kernel. ``host_ahead`` (option ``A``) first queues ≈ 3 ms of device work, so the
  host has every walk launched before the device reaches it: an idle that stays is the
  device's own, one that goes was the host launching late."""
  flush_buffer = jnp.zeros((256 << 20) // 4, jnp.float32)
  flush = jax.jit(lambda x: x + 1.0)
  out = run(*args)
  jax.block_until_ready(out)
  flush_buffer = flush(flush_buffer).block_until_ready()
  with tempfile.TemporaryDirectory() as trace_dir:   # the flush's own op names
    with jax.profiler.trace(trace_dir):
      flush_buffer = flush(flush_buffer).block_until_ready()
    flush_names = {op["name"] for op in timing.gpu_events(trace_dir)}
  lead = jax.jit(lambda x: jax.lax.fori_loop(0, 30, lambda _, y: y * 1.0001 + 1.0, x))
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      if host_ahead:
        flush_buffer = lead(flush_buffer)
      for _ in range(walks):
        flush_buffer = flush(flush_buffer)
        out = run(*args)
      jax.block_until_ready(out)
    ops = timing.gpu_events(trace_dir)
  per_walk, current, biggest, longest, walk_ops = [], None, 0.0, [], []
  flush_end, lead_gaps, kernel_gaps = None, [], []
  def close_walk():
    if not walk_ops:   # two flush-like ops in a row (the lead's loop): no walk between
      return
    per_walk.append(current)
    longest.append(biggest)
    kernel = max(walk_ops, key=lambda op: float(op["dur"]))
    kernel_gaps.append(float(kernel["ts"]) - float(walk_ops[0]["ts"]))
    lead_gaps.append(float(walk_ops[0]["ts"]) - flush_end)
  for op in ops:
    if op["name"] in flush_names and op["dur"] > 50:   # the 2 × 256 MB flush itself
      if current is not None:
        close_walk()
      current, biggest, walk_ops = 0.0, 0.0, []
      flush_end = float(op["ts"]) + float(op["dur"])
    elif current is not None:
      current += float(op["dur"])
      biggest = max(biggest, float(op["dur"]))
      walk_ops.append(op)
  if current is not None:
    close_walk()
  start = float(walk_ops[0]["ts"]) if walk_ops else 0.0
  last_ops = [(op["name"][:60], round(float(op["ts"]) - start, 2), round(float(op["dur"]), 2))
              for op in walk_ops]
  gaps = {"flush_to_walk_us_median": round(statistics.median(lead_gaps), 2),
          "walk_to_kernel_us_median": round(statistics.median(kernel_gaps), 2)}
  return per_walk, statistics.median(longest), last_ops, gaps


def summarise_profile(directory: str, clock_ghz: float) -> dict:
  traces = sorted(glob.glob(os.path.join(directory, "*-trace.json")))
  if not traces:
    return {"error": "no trace written"}
  events = json.load(open(traces[-1]))["traceEvents"]
  stacks, totals, counts = collections.defaultdict(list), collections.defaultdict(
      collections.Counter), collections.Counter()
  spans = collections.defaultdict(lambda: [None, None])
  tids_of_sm = collections.defaultdict(set)
  for ev in events:
    tid, ts = ev["tid"], ev["ts"] * 1e3
    tids_of_sm[ev.get("pid")].add(tid)
    span = spans[tid]
    span[0] = ts if span[0] is None else min(span[0], ts)
    span[1] = ts if span[1] is None else max(span[1], ts)
    if ev["ph"] == "B":
      stacks[tid].append((ev["name"], ts))
    else:
      name, begin = stacks[tid].pop()
      totals[name][tid] += ts - begin
      counts[name] += 1
  blocks = len(spans)
  us = lambda cycles: round(cycles / (clock_ghz * 1e3), 2)
  regions = {name: {"median_us": us(statistics.median(per_tid.values())),
                    "max_us": us(max(per_tid.values())),
                    "count_per_block": counts[name] / max(1, len(per_tid))}
             for name, per_tid in totals.items()}
  span = [end - begin for begin, end in spans.values()]
  # Each block (one an SM) writes one trace a warpgroup, tids 1 + warpgroup + traces ·
  # block: the regions of each warpgroup apart (warpgroup 0 leads; the last one is the
  # producer where there is one), so their imbalance shows.
  traces = max(len(tids) for tids in tids_of_sm.values())
  by_warpgroup = {}
  for warpgroup in range(traces):
    def own(per_tid):
      return [t for tid, t in per_tid.items() if (tid - 1) % traces == warpgroup]
    own_spans = own({tid: end - begin for tid, (begin, end) in spans.items()})
    own_totals = {name: own(per_tid) for name, per_tid in totals.items()}
    by_warpgroup[str(warpgroup)] = {
        "span_median_us": us(statistics.median(own_spans)),
        **{name: us(statistics.median(times)) for name, times in own_totals.items()
           if times}}
  return {"blocks": blocks, "span_median_us": us(statistics.median(span)),
          "span_max_us": us(max(span)), "regions": regions,
          "regions_by_warpgroup": by_warpgroup}


def dump_stats(directory: str) -> dict:
  """Registers and spills (ptxas) and instruction counts (SASS) of the dumped kernel."""
  stats = {}
  files = sorted(glob.glob(os.path.join(directory, "*")))
  stats["files"] = [os.path.basename(f) for f in files]
  for path in files:
    text = open(path, errors="replace").read()
    if "ptxas" in os.path.basename(path) or "Used" in text[:20000] and "registers" in text:
      stats["ptxas"] = [line.strip() for line in text.splitlines()
                        if any(word in line for word in ("registers", "spill", "stack",
                                                         "wgmma", "arning"))][:30]
    if path.endswith(".sass") or "sass" in os.path.basename(path):
      ops = collections.Counter()
      for line in text.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if m:
          ops[m.group(1).split(".")[0]] += 1
      stats["sass_instructions"] = sum(ops.values())
      stats["sass_top"] = ops.most_common(40)
      with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        dst.write(src.read())
      os.remove(path)
  return stats


def profile_directory(out: str, text: str) -> str:
  return os.path.join(out, "profile-" + re.sub(r"[^\w]+", "_", text))


def run_child(command: list[str], log_path: str) -> int:
  """``command``'s exit status, its output into ``log_path``; the process is killed if
  this one is interrupted or ended (SIGTERM) first, so none is left running. (Without
  preallocation: this process may hold most of the GPU's memory already.)"""
  env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
  with open(log_path, "w") as log:
    child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
      return child.wait()
    finally:
      if child.poll() is None:
        child.kill()
        child.wait()


def crash_lines(log_path: str, keep: int = 15) -> str:
  """The last ``keep`` lines of a crashed process's log that are neither warnings nor
  native stack frames: the failed check or error above its stack."""
  try:
    lines = open(log_path, errors="replace").read().splitlines()
  except OSError as err:
    return f"(no log: {err})"
  kept = [line for line in lines if line.strip() and not line.lstrip().startswith("@ ")
          and "warn" not in line.lower()]
  return "\n".join(kept[-keep:])


def profile_isolated(text: str, args) -> dict:
  """One ``--profile`` variant in a process of its own (``--isolate on``): a crash of its
  build or its profiled walks (v38: an abort inside XLA's launch took every variant
  after it) loses only this variant, and its log stays beside its results
  (``profile-*/process.log``). The child's entry, or ``profile_error`` with its exit
  status and the log's last lines."""
  directory = profile_directory(args.out, text)
  os.makedirs(directory, exist_ok=True)
  child_out = os.path.join(directory, "process")
  log_path = os.path.join(directory, "process.log")
  status = run_child([sys.executable, os.path.abspath(__file__), "--out", child_out,
                      "--variants", "", "--profile", text, "--walks", str(args.walks),
                      "--clock-ghz", str(args.clock_ghz), "--isolate", "off"], log_path)
  try:
    with open(os.path.join(child_out, "results.json")) as f:
      entry = json.load(f)["variants"].get(text, {})
  except (OSError, ValueError, KeyError):
    entry = {}
  if status != 0 and "profile" not in entry:
    entry = {**entry, "profile_error": f"its process exited with status {status}: "
                                       + crash_lines(log_path)}
  return entry


def recorded(results: dict, record: dict) -> None:
  """A point's record printed as one JSON line as it lands (a timed-out call keeps what
  came before) and kept in ``results["points"]``."""
  print(json.dumps(record), flush=True)
  results["points"].append(record)


def write_results(directory: str, results: dict) -> None:
  with open(os.path.join(directory, "results.json"), "w") as f:
    json.dump(results, f, indent=1)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--variants", default="bf16:64:greedy,bf16:16:greedy")
  parser.add_argument("--profile", default="", help="variants to profile (comma-separated)")
  parser.add_argument("--dump", default="", help="variants whose SASS/ptxas to dump")
  parser.add_argument("--walks", type=int, default=10)
  parser.add_argument("--clock-ghz", type=float, default=1.98)
  parser.add_argument("--isolate", choices=("on", "off"), default="on",
                      help="each --profile variant in a process of its own (a crash "
                           "loses only that variant)")
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  heads = Heads()
  results = {"jax": jax.__version__, "device": jax.devices()[0].device_kind,
             "steps": STEPS, "variants": {}}
  lines = []

  def record(name, entry):
    results["variants"].setdefault(name, {}).update(entry)
    with open(os.path.join(args.out, "results.json"), "w") as f:
      json.dump(results, f, indent=1)
    lines.append(f"{name}: {json.dumps(entry)}")
    print(lines[-1], flush=True)

  for text in [t for t in args.dump.split(",") if t]:
    variant = parse_variant(text)
    directory = os.path.join(args.out, "dump-" + re.sub(r"[^\w]+", "_", text))
    os.makedirs(directory, exist_ok=True)
    flags = dict(MOSAIC_GPU_DUMP_TO=directory, MOSAIC_GPU_DUMP_PTXAS="1",
                 MOSAIC_GPU_DUMP_SASS="1")
    os.environ.update(flags)
    try:
      spec, run, operands, _ = build(variant, heads)
      jax.block_until_ready(run(*operands))
    finally:
      for name in flags:
        os.environ.pop(name, None)
    record(text, {"dump": dump_stats(directory)})

  for text in expand_variants(args.variants):
    variant = parse_variant(text)
    try:
      spec, run, operands, want = build(variant, heads)
      tokens, status = (np.asarray(x) for x in (lambda o: (o.tokens, o.status))(run(*operands)))
      per_walk, kernel_us, walk_ops, gaps = time_walks(run, operands, args.walks,
                                                       variant.host_ahead)
      equal = bool(np.array_equal(tokens, want))
      record(text, {"plan": spec.plan.describe(), "tokens_equal": equal,
          **({} if equal else mismatch(variant, tokens, want, operands)),
          "status": int(status),
          "walk_us_median": round(statistics.median(per_walk), 1),
          "walk_us_min": round(min(per_walk), 1), "kernel_us_median": round(kernel_us, 1),
          "walks": len(per_walk), **gaps, "last_walk_ops": walk_ops})
    except Exception as err:   # report every variant, then go on
      record(text, {"error": f"{type(err).__name__}: {str(err)[-1500:]}"})

  for text in [t for t in args.profile.split(",") if t]:
    variant = parse_variant(text)
    if args.isolate == "on":
      # (A SIGTERM, say from timeout, ends the child too: run_child's cleanup runs.)
      previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
      try:
        record(text, profile_isolated(text, args))
      finally:
        signal.signal(signal.SIGTERM, previous)
      continue
    directory = profile_directory(args.out, text)
    os.makedirs(directory, exist_ok=True)
    try:
      spec, run, operands, want = build_with_profile_space(variant, heads, directory)
      flush_buffer = jnp.zeros((256 << 20) // 4, jnp.float32)
      for _ in range(2):
        flush_buffer = (flush_buffer + 1).block_until_ready()
        out = run(*operands)
        jax.block_until_ready(out)
      jax.effects_barrier()
      record(text, {"profile_plan": spec.plan.describe(),
                    "profile_tokens_equal": bool(np.array_equal(np.asarray(out.tokens), want)),
                    "profile": summarise_profile(directory, args.clock_ghz)})
    except Exception as err:
      record(text, {"profile_error": f"{type(err).__name__}: {str(err)[-1500:]}"})
    for trace in glob.glob(os.path.join(directory, "*-trace.json")):
      os.remove(trace)   # large; the summary above keeps what matters

  with open(os.path.join(args.out, "summary.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
