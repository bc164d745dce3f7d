"""The benchmark's runner: builds each point's head and inputs, compiles every JAX path's
timing chain ahead, checks every path against the reference (``gate``), times it
(``timing``, ``torch_paths``) and writes the results JSON after every point and mode.
"""

from __future__ import annotations

import datetime
import functools
import gc
import sys
import time
import traceback

import numpy as np

from wts_jax.bench import flush as l2_flush
from wts_jax.bench import gate, torch_paths
from wts_jax.bench.options import UsageError
from wts_jax.bench.support import (Interrupted, chain_compiler_options, check_stop, error_text,
                                   log, make_bench_head, point_name, progress_line, versions)


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
    self.placed_flush: dict = {}   # the flush buffer on a path's mesh, by device count
    self.results = {
        **versions(),
        "chain_compiler_options": chain_compiler_options(args.command_buffers),
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
    import jax
    from wts_jax.bench import floor
    if self.args.no_ceilings:
      self.results["ceilings"] = {"error": "skipped (--no-ceilings)"}
      return
    try:
      self.ceilings = floor.measure_ceilings(hbm_bytes=self.grid["hbm_bytes"],
                                             l2_bytes=self.grid["l2_bytes"],
                                             sync_latency_us=self.args.sync_us)
      self.results["ceilings"] = {**self.ceilings.as_record(),
                                  "num_sms": floor.device_num_sms(),
                                  "public_int8_check": floor.public_int8_check(
                                      self.ceilings, jax.default_backend())}
      log(f"ceilings: HBM {self.ceilings.hbm_gbps:.0f} GB/s, L2 "
           f"{self.ceilings.l2_gbps:.0f} GB/s, sync {self.ceilings.sync_us:.2f} µs "
           f"({self.ceilings.sync_source})")
    except Exception as err:  # noqa: BLE001
      self.results["ceilings"] = {"error": error_text(err)}
      log(f"ceilings failed: {error_text(err)}")

  def timing_method(self) -> str:
    from wts_jax.bench import timing
    return getattr(self.args, "timing", None) or timing.default_timing_method()

  def choose_flush_impl(self, flush) -> None:
    """The asked-for flush step if the probe finds it right, else "static"."""
    from wts_jax.bench import timing
    wanted = self.args.flush_impl or l2_flush.default_flush_impl()
    problem = l2_flush.check_flush_impl(flush, wanted)
    self.flush_impl = wanted if problem is None else "static"
    if problem is not None:
      log(f"flush probe failed, falling back to flush_impl=static: {problem}")
    self.compiler = timing.ChainCompiler(
        self.grid["jobs"], self.flush_impl,
        compiler_options=self.results["chain_compiler_options"])
    self.results["timing"] = {
        "flush_impl": self.flush_impl, "flush_impl_wanted": wanted,
        "flush_probe_error": problem, "flush_elements": int(flush.shape[0]),
        "n_walks": self.grid["walks"], "repeats": self.grid["repeats"],
        "method": self.timing_method(),
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
        check_stop()
        entry = {"framework": "jax", "batch": batch, "l2": l2, "kind": kind}
        try:
          entry.update(timing.time_chain(
              chains[l2].result(), flush_only[l2].result(), first_tokens, flush_jax,
              l2=l2, repeats=repeats, method=self.timing_method()).as_record())
        except Exception as err:  # noqa: BLE001
          entry["error"] = error_text(err)
        self.sanity.append(entry)
    if flush_torch is None:
      return
    for batch in self.grid["batches"]:
      for l2 in l2s:
        entry = {"framework": "torch", "batch": batch, "l2": l2,
                 "kind": "torch 1-element add_"}
        try:
          entry.update(torch_paths.time_torch_empty(batch, l2=l2, n_walks=n_walks,
                                               repeats=repeats,
                                               flush=flush_torch).as_record())
        except Exception as err:  # noqa: BLE001
          entry["error"] = error_text(err)
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
      log(f"path {name}: {'available' if reason is None else 'skipped: ' + reason}")
    self.results["paths"] = {path.name: {"description": path.description,
                                         "skipped": reason} for path, reason in paths}
    points = list(self.grid_points())
    state: dict[int, str] = {}    # point index -> "running", "done" or "skipped"
    try:
      self.measure_ceilings()
      flush_jax = l2_flush.make_jax_flush_buffer(self.grid["flush_bytes"])
      self.choose_flush_impl(flush_jax)
      flush_torch = None
      if any(path.name.startswith("torch") and reason is None for path, reason in paths):
        try:
          flush_torch = l2_flush.make_torch_flush_buffer(self.grid["flush_bytes"],
                                                       torch_paths.torch_device())
        except Exception as err:  # noqa: BLE001
          log(f"torch flush buffer failed: {error_text(err)}")
      started = self.clock()
      self.measure_sanity(flush_jax, flush_torch)
      log(f"sanity lines: {self.clock() - started:.1f} s; setup done at "
           f"{self.elapsed():.1f} s")
      self.write()

      heads: dict = {}   # (config, dtype) -> (head, bf16 head) or the error building it
      size = self.grid["compile_ahead"]
      for first in range(0, len(points), size):
        check_stop()
        window = list(enumerate(points))[first:first + size]
        refusal = self.budget_refusal(len(window))
        if refusal is not None:
          for index, (point, _) in window:
            log(f"point {point_name(point)} not started: {refusal}")
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
          heads[head_key] = make_bench_head(config, point["w2_dtype"], self.args.seed,
                                            gate_table=self.args.gate_table == "on",
                                            joint_table=self.args.joint_table == "on")
        except Exception as err:  # noqa: BLE001
          heads[head_key] = err
          log(f"head {point['head']} r={config.rank} {point['w2_dtype']}: "
               f"{error_text(err)}")
      if isinstance(heads[head_key], Exception):
        self.skip_point(point, f"head failed: {error_text(heads[head_key])}")
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
      check_stop()
    compile_s = self.clock() - start
    executables = self.compiler.submitted - submitted
    if len(window) > 1:
      log(f"compiled {len(plans)} points ahead: {executables} executables in "
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
    log(f"point {point}: {error_text(err)}")
    traceback.print_exc(file=sys.stderr)
    self.results["point_errors"].append({**point, "error": error_text(err),
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
        nbytes = plan["walk_bytes"] = floor.walk_bytes(
            head, base_logits, hidden, return_logits=self.args.return_logits)
        kernel_plan = floor.kernel_plan(head, base_logits,
                                        return_logits=self.args.return_logits)
        plan["floor"] = floor.walk_floor(nbytes, point["k"], self.ceilings,
                                         resident_fraction=self.args.resident_fraction,
                                         plan=kernel_plan)
      except Exception as err:  # noqa: BLE001
        log(f"floor failed: {error_text(err)}")
    for mode in plan["modes"]:
      plan["references"][mode.name] = self.compiler.submit(functools.partial(
          gate.lower_reference, head, base_logits, first_tokens, hidden, mode))
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
            flush = path_plan["flush"] = self.placed(prepared, flush_jax)
            path_plan["chains"] = self.compiler.chains(
                prepared.walk_fn, prepared.operands, prepared.first_tokens, flush,
                n_walks=n_walks, l2s=l2s, traced_tokens=prepared.traced_tokens,
                carry_form=prepared.chain_carry)
            if prepared.place is not None:
              path_plan["flush_only"] = self.compiler.flush_only(
                  prepared.first_tokens, flush, n_walks=n_walks, l2s=l2s)
        except SkipPath as err:
          path_plan["check"] = f"skipped: {err}"
        except Exception as err:  # noqa: BLE001
          path_plan["check"] = f"error: {error_text(err)}"
          path_plan["extra"]["traceback"] = traceback.format_exc()[-2000:]
    plan["flush_only"] = self.compiler.flush_only(first_tokens, flush_jax,
                                                  n_walks=n_walks, l2s=l2s)
    plan["futures"] = [*plan["references"].values(), *plan["flush_only"].values(),
                       *(future for path_plan in plan["paths"].values()
                         for name in ("chains", "flush_only")
                         for future in path_plan.get(name, {}).values())]
    plan["times"]["lower_s"] = self.clock() - started
    return plan

  def placed(self, prepared, flush_jax):
    """The flush buffer where ``prepared``'s walk runs (one copy for each placement)."""
    if prepared.place is None:
      return flush_jax
    key = prepared.notes.get("devices")
    if key not in self.placed_flush:
      self.placed_flush[key] = prepared.place(flush_jax)
    return self.placed_flush[key]

  def time_point(self, plan, paths, flush_jax, flush_torch) -> None:
    """Phase 2 of a point, nothing compiling: per mode the reference, then each path
    (torch paths prepared now) checked and timed, one at a time."""
    from wts_jax.bench import floor
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
          bf16_tokens, _ = gate.reference_tokens_and_gaps(
              bf16_head, base_logits, first_tokens, hidden, mode)
          mode_fields["agreement_vs_bf16"] = float(np.mean(bf16_tokens == reference_tokens))
        except Exception as err:  # noqa: BLE001
          mode_fields["agreement_vs_bf16"] = None
          log(f"bf16 comparison failed: {error_text(err)}")
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
        devices = path_plan["extra"].get("notes", {}).get("devices", 1)
        if devices > 1 and "walk_bytes" in plan and self.ceilings is not None:
          # A walk split over several GPUs has its own floor (one GPU's share, plus the
          # cross-device exchange).
          sharded_floor = floor.walk_floor(plan["walk_bytes"], point["k"], self.ceilings,
                                           devices=devices)
          base_record.update(floor_us=sharded_floor["floor_us"], floor=sharded_floor,
                             stepwise_floor_us=sharded_floor["stepwise_floor_us"])
        for l2 in self.grid["l2"]:
          check_stop()
          record = {**base_record, "l2": l2, "check": path_plan.get("check"),
                    **path_plan["extra"], "median_us": None, "min_us": None,
                    "p90_us": None, "x_floor": None}
          if "prepared" in path_plan and "check" not in path_plan:
            self.check_and_time(record, path_plan, l2, reference_tokens, gaps,
                                first_tokens, flush_jax, flush_torch, plan["flush_only"],
                                times)
          self.records.append(record)
          log(progress_line(record))
        log(f"  ({self.clock() - started:.1f} s)")
        for name in ("prepared", "chains", "flush_only", "flush"):
          path_plan.pop(name, None)
      self.write()
    times["total_s"] = times["compile_s"] + self.clock() - start
    self.point_times.append(times)
    window = (f", {times['window_points']} points compiled together in "
              f"{times['compile_window_s']:.1f} s" if times["window_points"] > 1 else "")
    log(f"point {point_name(point)}: {times['total_s']:.1f} s = compile "
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
      plan["check"] = f"error: {error_text(err)}"
      plan["extra"]["traceback"] = traceback.format_exc()[-2000:]
    return plan

  def check_and_time(self, record, plan, l2, reference_tokens, gaps, first_tokens,
                     flush_jax, flush_torch, flush_only, times) -> None:
    """Check the path's tokens for this L2 state, then time it if they pass."""
    from wts_jax.bench import timing
    prepared = plan["prepared"]
    if prepared.place is not None:   # the path's own arrays, where its walk runs
      first_tokens, flush_jax = prepared.first_tokens, plan["flush"]
      flush_only = plan["flush_only"]
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
      record["check"] = f"error: {error_text(err)}"
      record["traceback"] = traceback.format_exc()[-2000:]
    times["check_s"] += self.clock() - phase
    if not passed:
      return
    phase = self.clock()
    try:
      n_walks, repeats = self.grid["walks"], self.grid["repeats"]
      if chain is not None:
        result = timing.time_chain(chain, flush_only[l2].result(), first_tokens,
                                   flush_jax, l2=l2, repeats=repeats, warmup=1,
                                   method=self.timing_method())
      elif flush_torch is None:
        raise RuntimeError("no torch flush buffer")
      else:
        result = torch_paths.time_torch(prepared.run, l2=l2, n_walks=n_walks, repeats=repeats,
                                   flush=flush_torch)
      record.update(result.as_record())
      if record["floor_us"]:
        record["x_floor"] = result.median_us / record["floor_us"]
    except Exception as err:  # noqa: BLE001
      record["error"] = f"timing failed: {error_text(err)}"
      record["traceback"] = traceback.format_exc()[-2000:]
    times["timing_s"] += self.clock() - phase

  @staticmethod
  def check_outputs(prepared, outputs, reference_tokens, gaps):
    """(passed, check text, agreement) of every walk's outputs against the reference."""
    from wts_jax.bench.gate import compare_tokens
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


