"""``wts-bench``: every path side by side over a grid of walks, with the floor model.

Examples::

  wts-bench --quick                                   # a small grid, a few minutes
  wts-bench --shape qwen3_4b --batch 1,4,16,64 --k 4,7,16 --head vanilla,gated,rnn \\
      --mode greedy,sample --l2 cold,warm --out bench/results/h200.json \\
      --plot bench/results/h200.png
  wts-bench --render bench/results/h200.json > BENCHMARKS.md
  wts-bench --merge a.json b.json --out all.json --plot all.png   # runs split by head
  bash tools/bench_grid.sh vanilla $OUT     # one head's full grid in one device call

Every path is checked against the XLA reference on the same inputs before it is timed;
see ``wts_jax.bench.timing.METHOD`` for how it is timed and ``wts_jax.bench.floor`` for
the floor. A failure in one path or point is written into its record; the run goes on.
The JSON is rewritten atomically after every point and mode, so a run cut short (by
``--time-budget-s``, which stops starting points, or by SIGTERM from ``timeout``, which
is caught) keeps what it measured and lists the points it did not run.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import os
import platform as platform_module
import signal
import sys
import time
import traceback

import numpy as np

QUICK = {"batch": "1,16", "k": "7", "head": "vanilla", "mode": "greedy",
         "l2": "cold,warm", "repeats": 5, "walks_per_repeat": 10}
QUICK_CPU = {**QUICK, "batch": "1,4", "k": "4", "repeats": 3, "walks_per_repeat": 3}
# N = R = 10 (timing.DEFAULT_WALKS, DEFAULT_REPEATS): 100 walks per figure.
FULL = {"batch": None, "k": None, "head": "vanilla,gated,rnn", "mode": "greedy,sample",
        "l2": "cold,warm", "repeats": 10, "walks_per_repeat": 10}
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
QUANTIZED = ("int8", "fp8")   # a bf16 head with W2 quantized per row (wts_jax.quantize)


class UsageError(Exception):
  """A bad argument: ``main`` prints ``error: ...`` on one line and exits 2."""


class _Parser(argparse.ArgumentParser):
  def error(self, message):
    raise UsageError(message)


def _ints(text: str, flag: str = "--batch") -> tuple[int, ...]:
  """Comma-separated integers >= 1."""
  values = []
  for part in (part.strip() for part in text.split(",")):
    if not part:
      continue
    try:
      value = int(part)
    except ValueError:
      raise UsageError(f"{flag} {text!r}: {part!r} is not an integer") from None
    if value < 1:
      raise UsageError(f"{flag} {text!r}: {value} must be >= 1")
    values.append(value)
  if not values:
    raise UsageError(f"{flag} {text!r}: must name at least one value")
  return tuple(values)


def _names(text: str) -> tuple[str, ...]:
  return tuple(part.strip() for part in text.split(",") if part.strip())


def build_parser() -> argparse.ArgumentParser:
  parser = _Parser(
      prog="wts-bench", description=__doc__.split("\n\n")[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  grid = parser.add_argument_group("grid (comma-separated lists)")
  grid.add_argument("--shape", default=None,
                    help="named shapes from wts_jax.shapes (default qwen3_4b; "
                         "small_v1000 with --platform cpu)")
  grid.add_argument("--batch", default=None, help="batch sizes (default 1,4,16,64)")
  grid.add_argument("--k", default=None, help="walk lengths K (default 4,7,16)")
  grid.add_argument("--head", default=None, help="head types (default vanilla,gated,rnn)")
  grid.add_argument("--rank", default=None,
                    help="ranks (default: the shape's, 256 for Qwen3; 64,128 available)")
  grid.add_argument("--dtype", default="bf16",
                    help=f"head weight dtypes {sorted(DTYPES)} or a quantized W2 "
                         f"{list(QUANTIZED)} (default bf16); base logits and hidden "
                         "states are bf16")
  grid.add_argument("--mode", default=None, help="greedy,sample (default both)")
  grid.add_argument("--l2", default=None, help="cold,warm (default both)")
  grid.add_argument("--paths", default=None,
                    help="paths to run (default xla,pallas-stepwise,torch-eager,"
                         "torch-graph,wts); 'default' stands for those, 'all' for every "
                         "registered path (the wts variants too)")
  grid.add_argument("--confidence", action="store_true",
                    help="heads with the confidence head (default: serial head only)")
  grid.add_argument("--temperature", type=float, default=1.0,
                    help="temperature of --mode sample (default 1.0)")
  grid.add_argument("--return-logits", action="store_true",
                    help="JAX paths also return the [B, K, V] logits (timed too)")
  timing = parser.add_argument_group("timing")
  timing.add_argument("--repeats", type=int, default=None, help="R (default 10)")
  timing.add_argument("--walks-per-repeat", type=int, default=None, help="N (default 10)")
  timing.add_argument("--flush-impl", default=None, choices=("kernel", "cond", "static"),
                      help="the L2 flush step (default: kernel on GPU, static on CPU; "
                           "see timing.METHOD)")
  timing.add_argument("--flush-mb", type=float, default=None,
                      help="L2 flush buffer (default 256 on GPU, 4 on CPU)")
  timing.add_argument("--hbm-mb", type=float, default=None,
                      help="HBM ceiling buffer (default 2048 on GPU, 64 on CPU)")
  timing.add_argument("--l2-mb", type=float, default=None,
                      help="L2 ceiling buffer (default 24 on GPU, 4 on CPU)")
  timing.add_argument("--sync-us", type=float, default=None,
                      help="grid-sync latency; default: wts_jax.pallas."
                           "measure_sync_latency_us(), else the design note's 2.1 µs")
  timing.add_argument("--resident-fraction", type=float, default=None,
                      help="W2 fraction resident on chip in the floor (default: "
                           "num_SMs × 200 KB / bytes(W2), at most 1)")
  timing.add_argument("--no-ceilings", action="store_true",
                      help="skip measuring the ceilings (no floor)")
  run = parser.add_argument_group("running")
  run.add_argument("--jobs", type=int, default=None,
                   help="threads compiling ahead (default: the CPU count, at most 16)")
  run.add_argument("--compile-ahead", type=int, default=1, metavar="P",
                   help="compile P points together (all their executables in parallel), "
                        "then time them one by one (default 1)")
  run.add_argument("--time-budget-s", type=float, default=None,
                   help="start no point once the seconds since start plus the longest "
                        "point so far would pass this; the JSON lists skipped points")
  parser.add_argument("--quick", action="store_true", help="a tiny grid (smoke test)")
  parser.add_argument("--platform", default=None, choices=("cpu", "gpu"),
                      help="JAX platform (default: JAX's default)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None, help="results JSON path")
  parser.add_argument("--plot", default=None, help="PNG plot path")
  parser.add_argument("--render", nargs="+", default=None, metavar="JSON",
                      help="print a Markdown table of results JSON file(s) and exit")
  parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                      help="merge results JSON files of one device into --out (and "
                           "--plot), print the table and exit")
  parser.add_argument("--list-paths", action="store_true",
                      help="list the registered paths and whether each runs here")
  return parser


def _set_platform(name: str | None) -> None:
  if name is None:
    return
  import jax
  want = {"gpu": ("gpu", "cuda")}.get(name, (name,))
  try:
    jax.config.update("jax_platforms", "cuda" if name == "gpu" else name)
  except Exception:  # noqa: BLE001 - already initialised: checked below
    pass
  if jax.default_backend() not in want:
    raise UsageError(f"--platform {name}: JAX's backend is {jax.default_backend()!r} "
                     f"(set JAX_PLATFORMS before JAX starts)")


def _resolve(args) -> dict:
  """The grid: explicit flags, else --quick's, else the full defaults."""
  import jax
  from wts_jax import shapes
  cpu = jax.default_backend() == "cpu"
  preset = (QUICK_CPU if cpu else QUICK) if args.quick else FULL
  pick = lambda name: getattr(args, name) if getattr(args, name) is not None else preset[name]
  batch = pick("batch")
  k = pick("k")
  grid = {
      "shapes": _names(args.shape or ("small_v1000" if cpu else "qwen3_4b")),
      "batches": _ints(batch, "--batch") if batch else shapes.BENCH_BATCHES,
      "steps": _ints(k, "--k") if k else shapes.BENCH_STEPS,
      "heads": _names(pick("head")),
      "ranks": _ints(args.rank, "--rank") if args.rank else (None,),
      "dtypes": _names(args.dtype),
      "modes": _names(pick("mode")),
      "l2": _names(pick("l2")),
      "paths": _path_names(args.paths),
      "repeats": pick("repeats"),
      "walks": pick("walks_per_repeat"),
  }
  for name in grid["shapes"]:
    if name not in shapes.SHAPES:
      raise UsageError(f"--shape {name!r}: must be one of {sorted(shapes.SHAPES)}")
  for dtype in grid["dtypes"]:
    if dtype not in DTYPES and dtype not in QUANTIZED:
      raise UsageError(f"--dtype {dtype!r}: must be one of "
                       f"{sorted(DTYPES) + list(QUANTIZED)}")
  for mode in grid["modes"]:
    if mode not in ("greedy", "sample"):
      raise UsageError(f"--mode {mode!r}: must be greedy or sample")
  for l2 in grid["l2"]:
    if l2 not in ("cold", "warm"):
      raise UsageError(f"--l2 {l2!r}: must be cold or warm")
  if grid["repeats"] < 1 or grid["walks"] < 1:
    raise UsageError("--repeats and --walks-per-repeat must be >= 1")
  jobs = args.jobs if args.jobs is not None else min(16, os.cpu_count() or 1)
  if jobs < 1:
    raise UsageError("--jobs must be >= 1")
  grid["jobs"] = jobs
  if args.compile_ahead < 1:
    raise UsageError("--compile-ahead must be >= 1")
  grid["compile_ahead"] = args.compile_ahead
  mb = lambda value, gpu_default, cpu_default: int(
      (value if value is not None else (cpu_default if cpu else gpu_default)) * (1 << 20))
  grid["flush_bytes"] = mb(args.flush_mb, 256, 4)
  grid["hbm_bytes"] = mb(args.hbm_mb, 2048, 64)
  grid["l2_bytes"] = mb(args.l2_mb, 24, 4)
  return grid


def _path_names(text: str | None) -> tuple[str, ...]:
  """--paths: names, 'default' (DEFAULT_PATHS) and 'all' (every registered path)."""
  from wts_jax.bench.paths import DEFAULT_PATHS, PATHS
  names: dict[str, None] = {}
  for name in _names(text) if text else ("default",):
    expanded = {"default": DEFAULT_PATHS, "all": tuple(PATHS)}.get(name, (name,))
    names.update(dict.fromkeys(expanded))
  return tuple(names)


def make_bench_head(config, dtype_name: str, seed: int):
  """(head, the bf16 head it was quantized from or None) for ``--dtype dtype_name``."""
  import jax.numpy as jnp
  from wts_jax import make_head
  if dtype_name in QUANTIZED:
    from wts_jax.quantize import quantize_w2
    bf16_head = make_head(config, seed=seed, param_dtype=jnp.bfloat16)
    return quantize_w2(bf16_head, dtype_name), bf16_head
  return make_head(config, seed=seed, param_dtype=jnp.dtype(DTYPES[dtype_name])), None


def _versions() -> dict:
  import jax
  import jaxlib
  info = {"jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
          "torch_version": None, "triton_version": None,
          "python_version": platform_module.python_version()}
  try:
    import torch
    info["torch_version"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
  except Exception:  # noqa: BLE001
    pass
  try:
    import triton
    info["triton_version"] = triton.__version__
  except Exception:  # noqa: BLE001
    pass
  device = jax.devices()[0]
  info["device_kind"] = device.device_kind
  info["platform"] = jax.default_backend()
  info["device_count"] = jax.device_count()
  return info


def _error_text(err: BaseException) -> str:
  return f"{type(err).__name__}: {err}"[:500]


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


class Interrupted(BaseException):
  """SIGTERM (``timeout``'s signal) or SIGINT: the run stops after writing its JSON. A
  BaseException, like KeyboardInterrupt, so that no ``except Exception`` records it as
  one path's error and goes on."""


_STOP: dict = {"signal": None}   # set by the signal handler, read at safe points


def _check_stop() -> None:
  """Raise ``Interrupted`` if a signal came (its own raise can be swallowed when it
  lands in a finalizer, so the runner also checks here between steps)."""
  if _STOP["signal"] is not None:
    raise Interrupted(_STOP["signal"])


def _point_name(point: dict) -> str:
  return (f"{point['head']} B={point['batch']} K={point['k']} r={point['rank']} "
          f"{point['w2_dtype']}")


class Runner:
  """Runs the grid, building one results dict; the JSON is rewritten (atomically) after
  every point and mode, so a run that is cut short keeps every figure it finished.

  Points run in windows of ``--compile-ahead`` points, each in two phases: (1) for
  every point of the window, every JAX path of every mode is prepared and its timing
  chain lowered here and compiled in a thread pool, with the reference walks and the
  flush-only chains; (2) with nothing compiling, point by point, the reference runs,
  then each path (torch paths are prepared now) is checked and timed, one at a time.
  """

  def __init__(self, args, grid: dict, argv: list[str], *, clock=time.monotonic,
               started: float | None = None):
    self.args = args
    self.grid = grid
    self.clock = clock
    self.started = self.clock() if started is None else started
    self.records: list[dict] = []
    self.sanity: list[dict] = []
    self.point_times: list[dict] = []
    self.skipped_points: list[dict] = []
    self.ceilings = None
    self.compiler = None
    self.flush_impl = None
    self.results = {
        **_versions(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join(["wts-bench", *argv]),
        "grid": {key: value for key, value in grid.items()},
        "ceilings": None,
        "method": None,
        "timing": None,
        "sanity": self.sanity,
        "records": self.records,
        "point_errors": [],   # a point that failed before any path ran (inputs, reference)
        "point_times": self.point_times,         # seconds per point, by phase
        "skipped_points": self.skipped_points,   # not started: time budget, interruption
        "time_budget_s": args.time_budget_s,
        "interrupted": None,
    }

  def elapsed(self) -> float:
    return self.clock() - self.started

  # --- pieces -------------------------------------------------------------------------
  def measure_ceilings(self) -> None:
    from wts_jax.bench import floor
    if self.args.no_ceilings:
      self.results["ceilings"] = {"error": "skipped (--no-ceilings)"}
      return
    try:
      self.ceilings = floor.measure_ceilings(hbm_bytes=self.grid["hbm_bytes"],
                                             l2_bytes=self.grid["l2_bytes"],
                                             sync_latency_us=self.args.sync_us)
      self.results["ceilings"] = {**self.ceilings.as_record(),
                                  "num_sms": floor.device_num_sms()}
      _log(f"ceilings: HBM {self.ceilings.hbm_gbps:.0f} GB/s, L2 "
           f"{self.ceilings.l2_gbps:.0f} GB/s, sync {self.ceilings.sync_us:.2f} µs "
           f"({self.ceilings.sync_source})")
    except Exception as err:  # noqa: BLE001
      self.results["ceilings"] = {"error": _error_text(err)}
      _log(f"ceilings failed: {_error_text(err)}")

  def choose_flush_impl(self, flush) -> None:
    """The asked-for flush step if the probe finds it right, else "static"."""
    from wts_jax.bench import timing
    wanted = self.args.flush_impl or timing.default_flush_impl()
    problem = timing.check_flush_impl(flush, wanted)
    self.flush_impl = wanted if problem is None else "static"
    if problem is not None:
      _log(f"flush probe failed, falling back to flush_impl=static: {problem}")
    self.compiler = timing.ChainCompiler(self.grid["jobs"], self.flush_impl)
    self.results["timing"] = {
        "flush_impl": self.flush_impl, "flush_impl_wanted": wanted,
        "flush_probe_error": problem, "flush_elements": int(flush.shape[0]),
        "n_walks": self.grid["walks"], "repeats": self.grid["repeats"],
        "warmup_runs": "JAX: the check run + 1; torch: the check run + 3",
        "compile_jobs": self.grid["jobs"], "compile_ahead": self.grid["compile_ahead"]}

  def measure_sanity(self, flush_jax, flush_torch) -> None:
    import warnings
    import jax.numpy as jnp
    from wts_jax.bench import timing
    n_walks, repeats, l2s = self.grid["walks"], self.grid["repeats"], self.grid["l2"]
    jobs = []
    for batch in self.grid["batches"]:
      first_tokens = jnp.zeros((batch,), jnp.int32)
      flush_only = self.compiler.flush_only(first_tokens, flush_jax, n_walks=n_walks,
                                            l2s=l2s)
      for kind, make in timing.empty_walks():
        with warnings.catch_warnings():
          warnings.simplefilter("ignore", DeprecationWarning)
          chains = self.compiler.chains(make(), (), first_tokens, flush_jax,
                                        n_walks=n_walks, l2s=l2s)
        jobs.append((batch, kind, first_tokens, chains, flush_only))
    for batch, kind, first_tokens, chains, flush_only in jobs:
      for l2 in l2s:
        _check_stop()
        entry = {"framework": "jax", "batch": batch, "l2": l2, "kind": kind}
        try:
          entry.update(timing.time_chain(
              chains[l2].result(), flush_only[l2].result(), first_tokens, flush_jax,
              l2=l2, repeats=repeats).as_record())
        except Exception as err:  # noqa: BLE001
          entry["error"] = _error_text(err)
        self.sanity.append(entry)
    if flush_torch is None:
      return
    for batch in self.grid["batches"]:
      for l2 in l2s:
        entry = {"framework": "torch", "batch": batch, "l2": l2,
                 "kind": "torch 1-element add_"}
        try:
          entry.update(timing.time_torch_empty(batch, l2=l2, n_walks=n_walks,
                                               repeats=repeats,
                                               flush=flush_torch).as_record())
        except Exception as err:  # noqa: BLE001
          entry["error"] = _error_text(err)
        self.sanity.append(entry)

  def write(self) -> None:
    from wts_jax.bench import report
    report.add_speedups(self.records)
    self.results["elapsed_s"] = self.elapsed()
    if self.args.out:
      report.write_json(self.results, self.args.out)

  # --- the grid -----------------------------------------------------------------------
  def grid_points(self):
    """(point, config) of every point of the grid, in the order they run."""
    from wts_jax import shapes
    for shape_name in self.grid["shapes"]:
      shape = shapes.SHAPES[shape_name]
      for rank in self.grid["ranks"]:
        for dtype_name in self.grid["dtypes"]:
          for head_type in self.grid["heads"]:
            config = shape.head_config(head_type, rank=rank,
                                       confidence=self.args.confidence)
            for batch in self.grid["batches"]:
              for steps in self.grid["steps"]:
                yield {"shape": shape_name, "head": head_type, "batch": batch,
                       "k": steps, "rank": config.rank, "vocab": config.vocab_size,
                       "hidden": config.hidden_size, "w2_dtype": dtype_name,
                       "logits_dtype": "bf16", "confidence": config.confidence,
                       "return_logits": bool(self.args.return_logits)}, config

  def point_estimate_s(self) -> float:
    """What one more point is expected to take: the longest point so far (its share of
    its window's compilation included)."""
    return max((entry["total_s"] for entry in self.point_times), default=0.0)

  def budget_refusal(self, points: int = 1) -> str | None:
    budget = self.args.time_budget_s
    if budget is None:
      return None
    elapsed, estimate = self.elapsed(), points * self.point_estimate_s()
    if elapsed + estimate > budget:
      return (f"time budget: {elapsed:.0f} s elapsed + {estimate:.0f} s expected for "
              f"{points} point(s) > --time-budget-s {budget:g}")
    return None

  def skip_point(self, point: dict, reason: str) -> None:
    self.skipped_points.append({**point, "modes": list(self.grid["modes"]),
                                "reason": reason})

  def run(self) -> dict:
    from wts_jax.bench import paths as paths_module
    from wts_jax.bench import timing

    self.results["method"] = timing.METHOD
    paths = []
    for name in self.grid["paths"]:
      try:
        path = paths_module.get_path(name)
      except ValueError as err:
        raise UsageError(str(err)) from None
      reason = path.available()
      paths.append((path, reason))
      _log(f"path {name}: {'available' if reason is None else 'skipped: ' + reason}")
    self.results["paths"] = {path.name: {"description": path.description,
                                         "skipped": reason} for path, reason in paths}
    points = list(self.grid_points())
    state: dict[int, str] = {}    # point index -> "running", "done" or "skipped"
    try:
      self.measure_ceilings()
      flush_jax = timing.make_jax_flush_buffer(self.grid["flush_bytes"])
      self.choose_flush_impl(flush_jax)
      flush_torch = None
      if any(path.name.startswith("torch") and reason is None for path, reason in paths):
        try:
          flush_torch = timing.make_torch_flush_buffer(self.grid["flush_bytes"],
                                                       paths_module.torch_device())
        except Exception as err:  # noqa: BLE001
          _log(f"torch flush buffer failed: {_error_text(err)}")
      started = self.clock()
      self.measure_sanity(flush_jax, flush_torch)
      _log(f"sanity lines: {self.clock() - started:.1f} s; setup done at "
           f"{self.elapsed():.1f} s")
      self.write()

      heads: dict = {}   # (config, dtype) -> (head, bf16 head) or the error building it
      size = self.grid["compile_ahead"]
      for first in range(0, len(points), size):
        _check_stop()
        window = list(enumerate(points))[first:first + size]
        refusal = self.budget_refusal(len(window))
        if refusal is not None:
          for index, (point, _) in window:
            _log(f"point {_point_name(point)} not started: {refusal}")
            self.skip_point(point, refusal)
            state[index] = "skipped"
          continue
        self.run_window(window, heads, paths, flush_jax, flush_torch, state)
    except (Interrupted, KeyboardInterrupt) as err:
      why = str(err) or type(err).__name__
      self.results["interrupted"] = f"{why} at {self.elapsed():.1f} s"
      for index, (point, _) in enumerate(points):
        if state.get(index) == "running":
          self.skip_point(point, f"interrupted ({why}) while running: the records of "
                                 "its finished paths and modes are kept")
        elif index not in state:
          self.skip_point(point, f"interrupted ({why})")
      self.write()
      if self.compiler is not None:
        self.compiler.close(cancel=True)
      raise Interrupted(why) from None
    if self.compiler is not None:
      self.compiler.close()
    self.write()
    return self.results

  def run_window(self, window, heads, paths, flush_jax, flush_torch, state) -> None:
    """Compile every executable of the window's points together, then time the points
    one by one (nothing compiles while anything is timed)."""
    import concurrent.futures
    import jax
    from wts_jax.inputs import random_inputs
    start = self.clock()
    submitted = self.compiler.submitted
    needed = {(config, point["w2_dtype"]) for _, (point, config) in window}
    for key in [key for key in heads if key not in needed]:
      del heads[key]
    gc.collect()
    plans = []
    for index, (point, config) in window:
      state[index] = "running"
      head_key = (config, point["w2_dtype"])
      if head_key not in heads:
        try:
          heads[head_key] = make_bench_head(config, point["w2_dtype"], self.args.seed)
        except Exception as err:  # noqa: BLE001
          heads[head_key] = err
          _log(f"head {point['head']} r={config.rank} {point['w2_dtype']}: "
               f"{_error_text(err)}")
      if isinstance(heads[head_key], Exception):
        self.skip_point(point, f"head failed: {_error_text(heads[head_key])}")
        state[index] = "skipped"
        continue
      head, bf16_head = heads[head_key]
      try:
        key = jax.random.key(self.args.seed * 7919 + point["batch"] * 131 + point["k"])
        inputs = random_inputs(config, point["batch"], point["k"], key)
        plans.append((index, self.compile_point(point, head, inputs, paths, flush_jax,
                                                bf16_head=bf16_head)))
      except Exception as err:  # noqa: BLE001
        self.point_error(point, err)
        state[index] = "done"
    pending = [future for _, plan in plans for future in plan["futures"]]
    while concurrent.futures.wait(pending, timeout=0.5).not_done:
      _check_stop()
    compile_s = self.clock() - start
    executables = self.compiler.submitted - submitted
    if len(window) > 1:
      _log(f"compiled {len(plans)} points ahead: {executables} executables in "
           f"{compile_s:.1f} s ({self.grid['jobs']} jobs)")
    for index, plan in plans:
      plan["times"].update(compile_s=compile_s / len(plans), compile_window_s=compile_s,
                           window_points=len(plans), executables=executables)
      try:
        self.time_point(plan, paths, flush_jax, flush_torch)
      except Interrupted:
        raise
      except Exception as err:  # noqa: BLE001
        self.point_error(plan["point"], err)
      state[index] = "done"
      plan.clear()
      gc.collect()
      self.write()

  def point_error(self, point: dict, err: BaseException) -> None:
    _log(f"point {point}: {_error_text(err)}")
    traceback.print_exc(file=sys.stderr)
    self.results["point_errors"].append({**point, "error": _error_text(err),
                                         "traceback": traceback.format_exc()[-2000:]})

  def bench_mode(self, mode_name: str):
    import jax
    from wts_jax.bench.paths import BenchMode
    return BenchMode(mode_name, self.args.temperature,
                     None if mode_name == "greedy" else jax.random.key(self.args.seed + 1))

  def compile_point(self, point, head, inputs, paths, flush_jax, *, bf16_head=None):
    """Phase 1 of a point: prepare its JAX paths and submit every compilation (the
    reference walks, each path's chain, the flush-only chains); returns its plan."""
    from wts_jax.bench import floor
    from wts_jax.bench import paths as paths_module
    from wts_jax.bench.paths import SkipPath
    started = self.clock()
    base_logits, first_tokens, hidden = inputs
    n_walks, l2s = self.grid["walks"], self.grid["l2"]
    plan = {"point": point, "head": head, "bf16_head": bf16_head, "inputs": inputs,
            "floor": None, "modes": [self.bench_mode(name) for name in self.grid["modes"]],
            "references": {}, "paths": {}, "futures": [],
            "times": {**{key: point[key] for key in ("head", "batch", "k", "rank",
                                                     "w2_dtype")},
                      "reference_s": 0.0, "check_s": 0.0, "timing_s": 0.0}}
    if self.ceilings is not None:
      try:
        nbytes = floor.walk_bytes(head, base_logits, hidden,
                                  return_logits=self.args.return_logits)
        kernel_plan = floor.kernel_plan(head, base_logits,
                                        return_logits=self.args.return_logits)
        plan["floor"] = floor.walk_floor(nbytes, point["k"], self.ceilings,
                                         resident_fraction=self.args.resident_fraction,
                                         plan=kernel_plan)
      except Exception as err:  # noqa: BLE001
        _log(f"floor failed: {_error_text(err)}")
    for mode in plan["modes"]:
      plan["references"][mode.name] = self.compiler.submit(functools.partial(
          paths_module.lower_reference, head, base_logits, first_tokens, hidden, mode))
      for path, reason in paths:
        if reason is not None or path.framework != "jax":
          continue
        plan["paths"][mode.name, path.name] = path_plan = {"extra": {}}
        try:
          prepared = path.prepare(head, base_logits, first_tokens, hidden, mode,
                                  return_logits=self.args.return_logits)
          path_plan["prepared"] = prepared
          path_plan["extra"]["notes"] = prepared.notes
          if prepared.framework == "jax":
            path_plan["chains"] = self.compiler.chains(
                prepared.walk_fn, prepared.operands, prepared.first_tokens, flush_jax,
                n_walks=n_walks, l2s=l2s, traced_tokens=prepared.traced_tokens)
        except SkipPath as err:
          path_plan["check"] = f"skipped: {err}"
        except Exception as err:  # noqa: BLE001
          path_plan["check"] = f"error: {_error_text(err)}"
          path_plan["extra"]["traceback"] = traceback.format_exc()[-2000:]
    plan["flush_only"] = self.compiler.flush_only(first_tokens, flush_jax,
                                                  n_walks=n_walks, l2s=l2s)
    plan["futures"] = [*plan["references"].values(), *plan["flush_only"].values(),
                       *(future for path_plan in plan["paths"].values()
                         for future in path_plan.get("chains", {}).values())]
    plan["times"]["lower_s"] = self.clock() - started
    return plan

  def time_point(self, plan, paths, flush_jax, flush_torch) -> None:
    """Phase 2 of a point, nothing compiling: per mode the reference, then each path
    (torch paths prepared now) checked and timed, one at a time."""
    from wts_jax.bench import paths as paths_module
    point, times, floor_terms = plan["point"], plan["times"], plan["floor"]
    head, bf16_head = plan["head"], plan["bf16_head"]
    base_logits, first_tokens, hidden = plan["inputs"]
    start = self.clock()
    for mode in plan["modes"]:
      phase = self.clock()
      mode_fields = {"mode": mode.name}
      if mode.name == "sample":
        mode_fields["temperature"] = mode.temperature
      reference_tokens, gaps = plan["references"][mode.name].result()()
      if bf16_head is not None:
        # A quantized W2 has its own contract; report how often it drafts the bf16 tokens.
        try:
          bf16_tokens, _ = paths_module.reference_tokens_and_gaps(
              bf16_head, base_logits, first_tokens, hidden, mode)
          mode_fields["agreement_vs_bf16"] = float(np.mean(bf16_tokens == reference_tokens))
        except Exception as err:  # noqa: BLE001
          mode_fields["agreement_vs_bf16"] = None
          _log(f"bf16 comparison failed: {_error_text(err)}")
      times["reference_s"] += self.clock() - phase
      for path, reason in paths:
        base_record = {"path": path.name, **point, **mode_fields}
        if floor_terms is not None:
          base_record["floor_us"] = floor_terms["floor_us"]
          base_record["stepwise_floor_us"] = floor_terms["stepwise_floor_us"]
          base_record["floor"] = floor_terms
        else:
          base_record["floor_us"] = None
        started = self.clock()
        if reason is not None:
          path_plan = {"check": f"skipped: {reason}", "extra": {}}
        else:
          path_plan = plan["paths"].get((mode.name, path.name)) or self.prepare_late(
              path, head, base_logits, first_tokens, hidden, mode)
        for l2 in self.grid["l2"]:
          _check_stop()
          record = {**base_record, "l2": l2, "check": path_plan.get("check"),
                    **path_plan["extra"], "median_us": None, "min_us": None,
                    "p90_us": None, "x_floor": None}
          if "prepared" in path_plan and "check" not in path_plan:
            self.check_and_time(record, path_plan, l2, reference_tokens, gaps,
                                first_tokens, flush_jax, flush_torch, plan["flush_only"],
                                times)
          self.records.append(record)
          _log(_progress_line(record))
        _log(f"  ({self.clock() - started:.1f} s)")
        path_plan.pop("prepared", None)
        path_plan.pop("chains", None)
      self.write()
    times["total_s"] = times["compile_s"] + self.clock() - start
    self.point_times.append(times)
    window = (f", {times['window_points']} points compiled together in "
              f"{times['compile_window_s']:.1f} s" if times["window_points"] > 1 else "")
    _log(f"point {_point_name(point)}: {times['total_s']:.1f} s = compile "
         f"{times['compile_s']:.1f} s ({times['executables']} executables, "
         f"{self.grid['jobs']} jobs{window}) + reference {times['reference_s']:.1f} s + "
         f"checks {times['check_s']:.1f} s + timing {times['timing_s']:.1f} s; "
         f"{self.elapsed():.0f} s elapsed")

  def prepare_late(self, path, head, base_logits, first_tokens, hidden, mode) -> dict:
    """A non-JAX path (torch), prepared after the point's compilation."""
    from wts_jax.bench.paths import SkipPath
    plan = {"extra": {}}
    try:
      prepared = path.prepare(head, base_logits, first_tokens, hidden, mode,
                              return_logits=self.args.return_logits)
      plan["prepared"] = prepared
      plan["extra"]["notes"] = prepared.notes
    except SkipPath as err:
      plan["check"] = f"skipped: {err}"
    except Exception as err:  # noqa: BLE001
      plan["check"] = f"error: {_error_text(err)}"
      plan["extra"]["traceback"] = traceback.format_exc()[-2000:]
    return plan

  def check_and_time(self, record, plan, l2, reference_tokens, gaps, first_tokens,
                     flush_jax, flush_torch, flush_only, times) -> None:
    """Check the path's tokens for this L2 state, then time it if they pass."""
    from wts_jax.bench import timing
    prepared = plan["prepared"]
    phase = self.clock()
    chain = None
    try:
      if "chains" in plan:
        chain = plan["chains"][l2].result()
        walks_out, _, flush_out = chain(first_tokens, flush_jax, l2)
        outputs = list(walks_out)
      else:
        outputs = [prepared.run()]
        flush_out = None
      passed, check, agreement = self.check_outputs(prepared, outputs, reference_tokens,
                                                    gaps)
      if passed and flush_out is not None and self.flush_impl != "static":
        expected = int(flush_jax[0]) + chain.n_walks
        if int(flush_out[0]) != expected:
          passed, check = False, (f"error: the flush chain's flush[0] is "
                                  f"{int(flush_out[0])}, not {expected}")
      record["check"], record["agreement"] = check, agreement
      if chain is not None:
        record["checked_walks"] = len(outputs)
    except Exception as err:  # noqa: BLE001
      passed = False
      record["check"] = f"error: {_error_text(err)}"
      record["traceback"] = traceback.format_exc()[-2000:]
    times["check_s"] += self.clock() - phase
    if not passed:
      return
    phase = self.clock()
    try:
      n_walks, repeats = self.grid["walks"], self.grid["repeats"]
      if chain is not None:
        result = timing.time_chain(chain, flush_only[l2].result(), first_tokens,
                                   flush_jax, l2=l2, repeats=repeats, warmup=1)
      elif flush_torch is None:
        raise RuntimeError("no torch flush buffer")
      else:
        result = timing.time_torch(prepared.run, l2=l2, n_walks=n_walks, repeats=repeats,
                                   flush=flush_torch)
      record.update(result.as_record())
      if record["floor_us"]:
        record["x_floor"] = result.median_us / record["floor_us"]
    except Exception as err:  # noqa: BLE001
      record["error"] = f"timing failed: {_error_text(err)}"
      record["traceback"] = traceback.format_exc()[-2000:]
    times["timing_s"] += self.clock() - phase

  @staticmethod
  def check_outputs(prepared, outputs, reference_tokens, gaps):
    """(passed, check text, agreement) of every walk's outputs against the reference."""
    from wts_jax.bench.paths import compare_tokens
    from wts_jax.output import describe_status
    for index, out in enumerate(outputs):
      status = getattr(out, "status", None)
      if status is not None and int(np.asarray(status)):
        raise RuntimeError(f"walk {index}: status={int(np.asarray(status))}: "
                           f"{describe_status(int(np.asarray(status)))}")
    tokens = [prepared.tokens(out) for out in outputs]
    passed, check, agreement = compare_tokens(reference_tokens, tokens[0], gaps,
                                              prepared.margin)
    for index, other in enumerate(tokens[1:], start=1):
      if passed and not np.array_equal(other, tokens[0]):
        passed, check = False, (f"mismatch: walk {index} of the chain drafted other "
                                f"tokens than walk 0 on the same inputs")
    return passed, check, agreement


def _progress_line(record: dict) -> str:
  where = (f"{record['path']:>16} {record['head']:>7} B={record['batch']:<3} "
           f"K={record['k']:<2} r={record['rank']} {record['mode']:<6} {record['l2']:<4}")
  if record.get("median_us") is None:
    text = (record.get("error") or record["check"]).strip()
    return f"{where}  {text.splitlines()[0][:300] if text else ''}"
  floor_text = (f"  {record['x_floor']:.2f}× floor" if record.get("x_floor") else "")
  return f"{where}  {record['median_us']:9.1f} µs{floor_text}  [{record['check']}]"


def main(argv: list[str] | None = None) -> int:
  """Exit status: 0, 1 when a point or path errored (not: skipped), 2 on a bad
  argument (one line ``error: ...`` on stderr)."""
  try:
    return _main(argv)
  except UsageError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2


def _read_results(paths):
  from wts_jax.bench import report
  results = []
  for path in paths:
    try:
      results.append(report.read_json(path))
    except (OSError, ValueError) as err:
      raise UsageError(f"{path!r} is not a readable results JSON: "
                       f"{getattr(err, 'strerror', None) or err}") from None
  return results


def errored(results: dict) -> list[str]:
  """What failed in a run (skips are not failures): point errors, and paths whose check
  or timing raised."""
  def where(entry):
    return " ".join(f"{key}={entry[key]}" for key in ("head", "batch", "k", "rank",
                                                        "mode", "l2") if key in entry)
  failures = [f"point {where(point)}: {point['error']}"
              for point in results.get("point_errors", [])]
  for record in results.get("records", []):
    problem = record.get("error") or (record.get("check") or "")
    if problem.startswith(("error", "timing failed")):
      failures.append(f"{record.get('path')} {where(record)}: {problem}")
  return failures


def _main(argv: list[str] | None) -> int:
  started = time.monotonic()   # --time-budget-s counts from here (JAX starts below)
  argv = list(sys.argv[1:] if argv is None else argv)
  args = build_parser().parse_args(argv)
  from wts_jax.bench import report
  if args.render:
    print(report.render_markdown(_read_results(args.render)))
    return 0
  if args.merge:
    if not args.out:
      raise UsageError("--merge needs --out")
    results = report.merge(_read_results(args.merge))
    report.write_json(results, args.out)
    print(report.render_table(results))
    if args.plot:
      report.plot(results, args.plot)
    return 0
  _set_platform(args.platform)
  if args.list_paths:
    from wts_jax.bench.paths import PATHS
    for name, path in PATHS.items():
      reason = path.available()
      print(f"{name:>16}  {'available' if reason is None else 'skipped: ' + reason}  "
            f"({path.description})")
    return 0
  grid = _resolve(args)
  from wts_jax.bench.timing import MIN_WALKS_PER_FIGURE
  if grid["repeats"] * grid["walks"] < MIN_WALKS_PER_FIGURE and not args.quick:
    _log(f"warning: N*R = {grid['walks'] * grid['repeats']} < {MIN_WALKS_PER_FIGURE} "
         f"walks per figure")
  runner = Runner(args, grid, argv, started=started)
  restore = _stop_on_signals()
  try:
    results = runner.run()
  except Interrupted as err:
    # Written already; leave at once (compile threads may still be busy).
    _log(f"interrupted ({err}); wrote {os.path.abspath(args.out) if args.out else '-'}")
    print(report.render_table(runner.results), flush=True)
    sys.stderr.flush()
    os._exit(128 + signal.SIGTERM)
  finally:
    restore()
  print(report.render_table(results))
  if args.plot:
    report.plot(results, args.plot)
  if args.out:
    _log(f"wrote {os.path.abspath(args.out)}")
  failures = errored(results)
  for failure in failures:
    _log(f"failed: {failure.splitlines()[0][:300]}")
  return 1 if failures else 0


def _stop_on_signals():
  """SIGTERM (what ``timeout`` sends) raises ``Interrupted`` in the main thread, so the
  runner writes its JSON before the process ends. Returns a function undoing it."""
  import threading
  if threading.current_thread() is not threading.main_thread():
    return lambda: None

  def handler(signum, frame):
    del frame
    _STOP["signal"] = signal.Signals(signum).name
    raise Interrupted(_STOP["signal"])

  _STOP["signal"] = None
  previous = signal.signal(signal.SIGTERM, handler)
  return lambda: signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
  sys.exit(main())
