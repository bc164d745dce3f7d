"""``wts-bench``: every path side by side over a grid of walks, with the floor model.

Examples::

  wts-bench --quick                                   # a small grid, a few minutes
  wts-bench --shape qwen3_4b --batch 1,4,16,64 --k 4,7,16 --head vanilla,gated,rnn \\
      --mode greedy,sample --l2 cold,warm --out bench/results/walk/grid.json \\
      --plot bench/results/walk/grid.png
  wts-bench --render bench/results/walk/grid.json > grid.md   # markdown tables
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

import math
import os
import signal
import sys
import time

from wts_jax.bench.options import DTYPES, QUANTIZED, QUANTIZED_PLANES, UsageError
from wts_jax.command_line import ArgumentParser

QUICK = {"batch": "1,16", "k": "7", "head": "vanilla", "mode": "greedy",
         "l2": "cold,warm", "repeats": 5, "walks_per_repeat": 10}
QUICK_CPU = {**QUICK, "batch": "1,4", "k": "4", "repeats": 3, "walks_per_repeat": 3}
# N = R = 10 (timing.DEFAULT_WALKS, DEFAULT_REPEATS): 100 walks per figure.
FULL = {"batch": None, "k": None, "head": "vanilla,gated,rnn", "mode": "greedy,sample",
        "l2": "cold,warm", "repeats": 10, "walks_per_repeat": 10}


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
  return _once_each(values, text, flag)


def _names(text: str, flag: str) -> tuple[str, ...]:
  return _once_each([part.strip() for part in text.split(",") if part.strip()], text, flag)


def _once_each(values: list, text: str, flag: str) -> tuple:
  if not values:
    raise UsageError(f"{flag} {text!r}: must name at least one value")
  repeated = sorted({str(value) for value in values if values.count(value) > 1})
  if repeated:
    raise UsageError(f"{flag} {text!r}: names {', '.join(repeated)} more than once")
  return tuple(values)


def build_parser() -> ArgumentParser:
  parser = ArgumentParser(prog="wts-bench", description=__doc__.split("\n\n")[0])
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
  grid.add_argument("--gate-table", default="on", choices=("on", "off"),
                    help="the gated head with its gate table (wts_jax.with_gate_table; "
                         "default on): its walks on N gather the gate's token term")
  grid.add_argument("--joint-table", default="on", choices=("on", "off"),
                    help="the rnn head with its joint table (wts_jax.with_joint_table; "
                         "default on): its walks of up to 16 rows gather J_e e and need "
                         "no second grid barrier a step")
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
  timing.add_argument("--timing", default=None, choices=("device", "host"),
                      help="the JAX paths' clock: the device time of a CUPTI trace from "
                           "each run's first flush step "
                           "(default on GPU) or the host wall clock (default on CPU; "
                           "see timing.METHOD)")
  timing.add_argument("--command-buffers", default="no-custom-calls",
                      choices=("no-custom-calls", "off", "xla-default"),
                      help="XLA command buffers of every timed JAX chain: without custom "
                           "calls (wts_jax.KERNEL_COMPILER_OPTIONS, the default: XLA "
                           "re-records a Mosaic call each execution otherwise), none at "
                           "all, or XLA's default")
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
  from wts_jax.heads.config import HEAD_TYPES
  cpu = jax.default_backend() == "cpu"
  preset = (QUICK_CPU if cpu else QUICK) if args.quick else FULL
  pick = lambda name: getattr(args, name) if getattr(args, name) is not None else preset[name]
  batch = pick("batch")
  k = pick("k")
  grid = {
      "shapes": _names(args.shape or ("small_v1000" if cpu else "qwen3_4b"), "--shape"),
      "batches": _ints(batch, "--batch") if batch else shapes.BENCH_BATCHES,
      "steps": _ints(k, "--k") if k else shapes.BENCH_STEPS,
      "heads": _names(pick("head"), "--head"),
      "ranks": _ints(args.rank, "--rank") if args.rank else (None,),
      "dtypes": _names(args.dtype, "--dtype"),
      "modes": _names(pick("mode"), "--mode"),
      "l2": _names(pick("l2"), "--l2"),
      "paths": _path_names(args.paths),
      "repeats": pick("repeats"),
      "walks": pick("walks_per_repeat"),
  }
  for name in grid["shapes"]:
    if name not in shapes.SHAPES:
      raise UsageError(f"--shape {name!r}: must be one of {sorted(shapes.SHAPES)}")
  for dtype in grid["dtypes"]:
    if dtype not in DTYPES and dtype not in QUANTIZED + (QUANTIZED_PLANES,):
      raise UsageError(f"--dtype {dtype!r}: must be one of "
                       f"{sorted(DTYPES) + list(QUANTIZED)}")
  for head in grid["heads"]:
    if head not in HEAD_TYPES:
      raise UsageError(f"--head {head!r}: must be one of {list(HEAD_TYPES)}")
  for mode in grid["modes"]:
    if mode not in ("greedy", "sample"):
      raise UsageError(f"--mode {mode!r}: must be greedy or sample")
  if "sample" in grid["modes"] and not (math.isfinite(args.temperature)
                                        and args.temperature > 0):
    raise UsageError(f"--temperature {args.temperature}: --mode sample needs a finite "
                     "temperature > 0")
  for l2 in grid["l2"]:
    if l2 not in ("cold", "warm"):
      raise UsageError(f"--l2 {l2!r}: must be cold or warm")
  for flag, value in (("--repeats", grid["repeats"]),
                      ("--walks-per-repeat", grid["walks"]),
                      ("--compile-ahead", args.compile_ahead)):
    if value < 1:
      raise UsageError(f"{flag} {value}: must be >= 1")
  jobs = args.jobs if args.jobs is not None else min(16, os.cpu_count() or 1)
  if jobs < 1:
    raise UsageError(f"--jobs {jobs}: must be >= 1")
  grid["jobs"] = jobs
  grid["compile_ahead"] = args.compile_ahead
  for flag, value in (("--flush-mb", args.flush_mb), ("--hbm-mb", args.hbm_mb),
                      ("--l2-mb", args.l2_mb), ("--sync-us", args.sync_us),
                      ("--time-budget-s", args.time_budget_s)):
    if value is not None and not (math.isfinite(value) and value > 0):
      raise UsageError(f"{flag} {value}: must be a finite number > 0")
  if args.resident_fraction is not None and not 0 <= args.resident_fraction <= 1:
    raise UsageError(f"--resident-fraction {args.resident_fraction}: must be in [0, 1]")
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
  for name in _names(text, "--paths") if text else ("default",):
    expanded = {"default": DEFAULT_PATHS, "all": tuple(PATHS)}.get(name, (name,))
    names.update(dict.fromkeys(expanded))
  return tuple(names)


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
    if not (isinstance(results[-1], dict) and isinstance(results[-1].get("records"), list)):
      raise UsageError(f"{path!r} is not a wts-bench results JSON (no list of records)")
  return results


def _check_outputs(args) -> None:
  """--out and --plot writable before any work (a run may take an hour)."""
  from wts_jax.result_files import OutputPathError, check_writable
  try:
    check_writable(args.out, "--out")
    check_writable(args.plot, "--plot")
  except OutputPathError as err:
    raise UsageError(str(err)) from None


def _plot(results: dict, args) -> None:
  from wts_jax.bench import report
  from wts_jax.result_files import write_failure
  try:
    report.plot(results, args.plot)
  except OSError as err:
    raise UsageError(write_failure("--plot", args.plot, err, args.out)) from None


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
    _check_outputs(args)
    results = report.merge(_read_results(args.merge))
    report.write_json(results, args.out)
    print(report.render_table(results))
    if args.plot:
      _plot(results, args)
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
  _check_outputs(args)
  from wts_jax.bench.runner import Runner
  from wts_jax.bench.support import Interrupted, log, stop_on_signals
  from wts_jax.bench.timing import MIN_WALKS_PER_FIGURE
  if grid["repeats"] * grid["walks"] < MIN_WALKS_PER_FIGURE and not args.quick:
    log(f"warning: N*R = {grid['walks'] * grid['repeats']} < {MIN_WALKS_PER_FIGURE} "
         f"walks per figure")
  runner = Runner(args, grid, argv, started=started)
  restore = stop_on_signals()
  try:
    results = runner.run()
  except Interrupted as err:
    # Written already; leave at once (compile threads may still be busy).
    log(f"interrupted ({err}); wrote {os.path.abspath(args.out) if args.out else '-'}")
    print(report.render_table(runner.results), flush=True)
    sys.stderr.flush()
    os._exit(128 + signal.SIGTERM)
  finally:
    restore()
  print(report.render_table(results))
  if args.plot:
    _plot(results, args)
  if args.out:
    log(f"wrote {os.path.abspath(args.out)}")
  failures = errored(results)
  for failure in failures:
    log(f"failed: {failure.splitlines()[0][:300]}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
