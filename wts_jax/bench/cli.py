"""``wts-bench``: every path side by side over a grid of walks, with the floor model.

Examples::

  wts-bench --quick                                   # a small grid, a few minutes
  wts-bench --shape qwen3_4b --batch 1,4,16,64 --k 4,7,16 --head vanilla,gated,rnn \\
      --mode greedy,sample --l2 cold,warm --out bench/results/h200.json \\
      --plot bench/results/h200.png
  wts-bench --render bench/results/h200.json > BENCHMARKS.md
  wts-bench --merge a.json b.json --out all.json --plot all.png   # runs split by head

Every path is checked against the XLA reference on the same inputs before it is timed;
see ``wts_jax.bench.timing.METHOD`` for how it is timed and ``wts_jax.bench.floor`` for
the floor. A failure in one path or point is written into its record; the run goes on.
The JSON is rewritten after every point, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform as platform_module
import sys
import time
import traceback

QUICK = {"batch": "1,16", "k": "7", "head": "vanilla", "mode": "greedy",
         "l2": "cold,warm", "repeats": 5, "walks_per_repeat": 10}
QUICK_CPU = {**QUICK, "batch": "1,4", "k": "4", "repeats": 3, "walks_per_repeat": 3}
FULL = {"batch": None, "k": None, "head": "vanilla,gated,rnn", "mode": "greedy,sample",
        "l2": "cold,warm", "repeats": 15, "walks_per_repeat": 20}
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
QUANTIZED = ("int8", "fp8")   # a bf16 head with W2 quantized per row (wts_jax.quantize)


def _ints(text: str) -> tuple[int, ...]:
  return tuple(int(part) for part in text.split(",") if part.strip())


def _names(text: str) -> tuple[str, ...]:
  return tuple(part.strip() for part in text.split(",") if part.strip())


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
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
                         "torch-graph,wts)")
  grid.add_argument("--confidence", action="store_true",
                    help="heads with the confidence head (default: serial head only)")
  grid.add_argument("--temperature", type=float, default=1.0,
                    help="temperature of --mode sample (default 1.0)")
  grid.add_argument("--return-logits", action="store_true",
                    help="JAX paths also return the [B, K, V] logits (timed too)")
  timing = parser.add_argument_group("timing")
  timing.add_argument("--repeats", type=int, default=None, help="R (default 15)")
  timing.add_argument("--walks-per-repeat", type=int, default=None, help="N (default 20)")
  timing.add_argument("--flush-mb", type=float, default=None,
                      help="L2 flush buffer (default 256 on GPU, 4 on CPU)")
  timing.add_argument("--hbm-mb", type=float, default=None,
                      help="HBM ceiling buffer (default 2048 on GPU, 64 on CPU)")
  timing.add_argument("--l2-mb", type=float, default=None,
                      help="L2 ceiling buffer (default 24 on GPU, 4 on CPU)")
  timing.add_argument("--sync-us", type=float, default=None,
                      help="grid-sync latency; default: wts_jax.pallas."
                           "measure_sync_latency_us(), else DESIGN.md's 2.1 µs")
  timing.add_argument("--resident-fraction", type=float, default=None,
                      help="W2 fraction resident on chip in the floor (default: "
                           "num_SMs × 200 KB / bytes(W2), at most 1)")
  timing.add_argument("--no-ceilings", action="store_true",
                      help="skip measuring the ceilings (no floor)")
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
    raise SystemExit(f"--platform {name}: JAX's backend is {jax.default_backend()!r} "
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
  from wts_jax.bench.paths import DEFAULT_PATHS
  grid = {
      "shapes": _names(args.shape or ("small_v1000" if cpu else "qwen3_4b")),
      "batches": _ints(batch) if batch else shapes.BENCH_BATCHES,
      "steps": _ints(k) if k else shapes.BENCH_STEPS,
      "heads": _names(pick("head")),
      "ranks": _ints(args.rank) if args.rank else (None,),
      "dtypes": _names(args.dtype),
      "modes": _names(pick("mode")),
      "l2": _names(pick("l2")),
      "paths": _names(args.paths) if args.paths else DEFAULT_PATHS,
      "repeats": pick("repeats"),
      "walks": pick("walks_per_repeat"),
  }
  for name in grid["shapes"]:
    if name not in shapes.SHAPES:
      raise SystemExit(f"--shape {name!r}: must be one of {sorted(shapes.SHAPES)}")
  for dtype in grid["dtypes"]:
    if dtype not in DTYPES and dtype not in QUANTIZED:
      raise SystemExit(f"--dtype {dtype!r}: must be one of "
                       f"{sorted(DTYPES) + list(QUANTIZED)}")
  for mode in grid["modes"]:
    if mode not in ("greedy", "sample"):
      raise SystemExit(f"--mode {mode!r}: must be greedy or sample")
  for l2 in grid["l2"]:
    if l2 not in ("cold", "warm"):
      raise SystemExit(f"--l2 {l2!r}: must be cold or warm")
  if grid["repeats"] < 1 or grid["walks"] < 1:
    raise SystemExit("--repeats and --walks-per-repeat must be >= 1")
  mb = lambda value, gpu_default, cpu_default: int(
      (value if value is not None else (cpu_default if cpu else gpu_default)) * (1 << 20))
  grid["flush_bytes"] = mb(args.flush_mb, 256, 4)
  grid["hbm_bytes"] = mb(args.hbm_mb, 2048, 64)
  grid["l2_bytes"] = mb(args.l2_mb, 24, 4)
  return grid


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


class Runner:
  """Runs the grid, building one results dict; the JSON is rewritten after each point."""

  def __init__(self, args, grid: dict, argv: list[str]):
    self.args = args
    self.grid = grid
    self.records: list[dict] = []
    self.sanity: list[dict] = []
    self.ceilings = None
    self.started = time.time()
    self.results = {
        **_versions(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join(["wts-bench", *argv]),
        "grid": {key: value for key, value in grid.items()},
        "ceilings": None,
        "method": None,
        "sanity": self.sanity,
        "records": self.records,
        "point_errors": [],   # a point that failed before any path ran (inputs, reference)
    }

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

  def measure_sanity(self, flush_jax, flush_torch) -> None:
    from wts_jax.bench import timing
    for batch in self.grid["batches"]:
      for l2 in self.grid["l2"]:
        try:
          empties = timing.time_jax_empty(batch, l2=l2, n_walks=self.grid["walks"],
                                          repeats=self.grid["repeats"], flush=flush_jax)
        except Exception as err:  # noqa: BLE001
          empties = [("?", _error_text(err))]
        for kind, result in empties:
          entry = {"framework": "jax", "batch": batch, "l2": l2, "kind": kind}
          if isinstance(result, str):
            entry["error"] = result
          else:
            entry.update(result.as_record())
          self.sanity.append(entry)
        if flush_torch is None:
          continue
        entry = {"framework": "torch", "batch": batch, "l2": l2,
                 "kind": "torch 1-element add_"}
        try:
          result = timing.time_torch_empty(batch, l2=l2, n_walks=self.grid["walks"],
                                           repeats=self.grid["repeats"], flush=flush_torch)
          entry.update(result.as_record())
        except Exception as err:  # noqa: BLE001
          entry["error"] = _error_text(err)
        self.sanity.append(entry)

  def write(self) -> None:
    from wts_jax.bench import report
    report.add_speedups(self.records)
    if self.args.out:
      report.write_json(self.results, self.args.out)

  # --- the grid -----------------------------------------------------------------------
  def run(self) -> dict:
    import jax
    from wts_jax import shapes
    from wts_jax.bench import paths as paths_module
    from wts_jax.bench import timing
    from wts_jax.inputs import random_inputs

    self.results["method"] = timing.METHOD
    paths = []
    for name in self.grid["paths"]:
      try:
        path = paths_module.get_path(name)
      except ValueError as err:
        raise SystemExit(str(err)) from None
      reason = path.available()
      paths.append((path, reason))
      _log(f"path {name}: {'available' if reason is None else 'skipped: ' + reason}")
    self.results["paths"] = {path.name: {"description": path.description,
                                         "skipped": reason} for path, reason in paths}

    self.measure_ceilings()
    flush_jax = timing.make_jax_flush_buffer(self.grid["flush_bytes"])
    flush_torch = None
    if any(path.name.startswith("torch") and reason is None for path, reason in paths):
      try:
        flush_torch = timing.make_torch_flush_buffer(self.grid["flush_bytes"],
                                                     paths_module.torch_device())
      except Exception as err:  # noqa: BLE001
        _log(f"torch flush buffer failed: {_error_text(err)}")
    self.measure_sanity(flush_jax, flush_torch)
    self.write()

    for shape_name in self.grid["shapes"]:
      shape = shapes.SHAPES[shape_name]
      for rank in self.grid["ranks"]:
        for dtype_name in self.grid["dtypes"]:
          for head_type in self.grid["heads"]:
            config = shape.head_config(head_type, rank=rank,
                                       confidence=self.args.confidence)
            try:
              head, bf16_head = make_bench_head(config, dtype_name, self.args.seed)
            except Exception as err:  # noqa: BLE001
              _log(f"head {head_type} r={config.rank} {dtype_name}: {_error_text(err)}")
              continue
            for batch in self.grid["batches"]:
              for steps in self.grid["steps"]:
                point = {"shape": shape_name, "head": head_type, "batch": batch,
                         "k": steps, "rank": config.rank, "vocab": config.vocab_size,
                         "hidden": config.hidden_size, "w2_dtype": dtype_name,
                         "logits_dtype": "bf16", "confidence": config.confidence,
                         "return_logits": bool(self.args.return_logits)}
                try:
                  key = jax.random.key(self.args.seed * 7919 + batch * 131 + steps)
                  inputs = random_inputs(config, batch, steps, key)
                  self.run_point(point, head, inputs, paths, flush_jax, flush_torch,
                                 bf16_head=bf16_head)
                except Exception as err:  # noqa: BLE001
                  _log(f"point {point}: {_error_text(err)}")
                  traceback.print_exc(file=sys.stderr)
                  self.results["point_errors"].append(
                      {**point, "error": _error_text(err),
                       "traceback": traceback.format_exc()[-2000:]})
                inputs = None
                gc.collect()
                self.write()
            head = bf16_head = None
            gc.collect()
    self.results["elapsed_s"] = time.time() - self.started
    self.write()
    return self.results

  def run_point(self, point, head, inputs, paths, flush_jax, flush_torch, *,
                bf16_head=None) -> None:
    import jax
    import numpy as np
    from wts_jax.bench import floor
    from wts_jax.bench.paths import (BenchMode, SkipPath, compare_tokens,
                                     reference_tokens_and_gaps)
    base_logits, first_tokens, hidden = inputs
    floor_terms = None
    if self.ceilings is not None:
      try:
        nbytes = floor.walk_bytes(head, base_logits, hidden,
                                  return_logits=self.args.return_logits)
        floor_terms = floor.walk_floor(nbytes, point["k"], self.ceilings,
                                       resident_fraction=self.args.resident_fraction)
      except Exception as err:  # noqa: BLE001
        _log(f"floor failed: {_error_text(err)}")
    for mode_name in self.grid["modes"]:
      mode = BenchMode(mode_name, self.args.temperature,
                       None if mode_name == "greedy" else jax.random.key(self.args.seed + 1))
      mode_fields = {"mode": mode_name}
      if mode_name == "sample":
        mode_fields["temperature"] = mode.temperature
      reference_tokens, gaps = reference_tokens_and_gaps(head, base_logits, first_tokens,
                                                         hidden, mode)
      if bf16_head is not None:
        # A quantized W2 has its own contract; report how often it drafts the bf16 tokens.
        try:
          bf16_tokens, _ = reference_tokens_and_gaps(bf16_head, base_logits, first_tokens,
                                                     hidden, mode)
          mode_fields["agreement_vs_bf16"] = float(np.mean(bf16_tokens == reference_tokens))
        except Exception as err:  # noqa: BLE001
          mode_fields["agreement_vs_bf16"] = None
          _log(f"bf16 comparison failed: {_error_text(err)}")
      for path, reason in paths:
        base_record = {"path": path.name, **point, **mode_fields}
        if floor_terms is not None:
          base_record["floor_us"] = floor_terms["floor_us"]
          base_record["stepwise_floor_us"] = floor_terms["stepwise_floor_us"]
          base_record["floor"] = floor_terms
        else:
          base_record["floor_us"] = None
        prepared, timed, check, extra = None, True, None, {}
        started = time.time()
        if reason is not None:
          check, timed = f"skipped: {reason}", False
        else:
          try:
            prepared = path.prepare(head, base_logits, first_tokens, hidden, mode,
                                    return_logits=self.args.return_logits)
            extra["notes"] = prepared.notes
            outputs = prepared.run()
            status = getattr(outputs, "status", None)
            if status is not None and int(np.asarray(status)):
              from wts_jax.output import describe_status
              raise RuntimeError(f"walk status={int(np.asarray(status))}: "
                                 f"{describe_status(int(np.asarray(status)))}")
            tokens = prepared.tokens(outputs)
            passed, check, agreement = compare_tokens(reference_tokens, tokens, gaps,
                                                      prepared.margin)
            extra["agreement"] = agreement
            timed = passed
          except SkipPath as err:
            check, timed = f"skipped: {err}", False
          except Exception as err:  # noqa: BLE001
            check, timed = f"error: {_error_text(err)}", False
            extra["traceback"] = traceback.format_exc()[-2000:]
        for l2 in self.grid["l2"]:
          record = {**base_record, "l2": l2, "check": check, **extra,
                    "median_us": None, "min_us": None, "p90_us": None,
                    "x_floor": None}
          if timed:
            try:
              result = self._time(prepared, l2, flush_jax, flush_torch)
              record.update(result.as_record())
              if record["floor_us"]:
                record["x_floor"] = result.median_us / record["floor_us"]
            except Exception as err:  # noqa: BLE001
              record["error"] = f"timing failed: {_error_text(err)}"
              record["traceback"] = traceback.format_exc()[-2000:]
          self.records.append(record)
          _log(_progress_line(record))
        _log(f"  ({time.time() - started:.1f} s)")
        prepared = None

  def _time(self, prepared, l2, flush_jax, flush_torch):
    from wts_jax.bench import timing
    n_walks, repeats = self.grid["walks"], self.grid["repeats"]
    if prepared.framework == "jax":
      return timing.time_jax(prepared.walk_fn, prepared.operands, prepared.first_tokens,
                             l2=l2, n_walks=n_walks, repeats=repeats, flush=flush_jax,
                             traced_tokens=prepared.traced_tokens)
    if flush_torch is None:
      raise RuntimeError("no torch flush buffer")
    return timing.time_torch(prepared.run, l2=l2, n_walks=n_walks, repeats=repeats,
                             flush=flush_torch)


def _progress_line(record: dict) -> str:
  where = (f"{record['path']:>16} {record['head']:>7} B={record['batch']:<3} "
           f"K={record['k']:<2} r={record['rank']} {record['mode']:<6} {record['l2']:<4}")
  if record.get("median_us") is None:
    text = (record.get("error") or record["check"]).strip()
    return f"{where}  {text.splitlines()[0][:300] if text else ''}"
  floor_text = (f"  {record['x_floor']:.2f}× floor" if record.get("x_floor") else "")
  return f"{where}  {record['median_us']:9.1f} µs{floor_text}  [{record['check']}]"


def main(argv: list[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  args = build_parser().parse_args(argv)
  from wts_jax.bench import report
  if args.render:
    print(report.render_markdown([report.read_json(path) for path in args.render]))
    return 0
  if args.merge:
    if not args.out:
      raise SystemExit("--merge needs --out")
    results = report.merge([report.read_json(path) for path in args.merge])
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
  if grid["repeats"] * grid["walks"] < 300 and not args.quick:
    _log(f"warning: N*R = {grid['walks'] * grid['repeats']} < 300 walks per figure")
  runner = Runner(args, grid, argv)
  results = runner.run()
  print(report.render_table(results))
  if args.plot:
    report.plot(results, args.plot)
  if args.out:
    _log(f"wrote {os.path.abspath(args.out)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
