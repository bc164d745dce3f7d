"""``wts-tabletune``: profile a cost table, derive the draft-length table, evaluate the
controller against the baselines on simulated traffic, measure the controller's cost.

  wts-tabletune profile --cost modelled --target qwen3-8b --out costs.json
  wts-tabletune profile --cost loop --target qwen3-8b --out costs.json   (on the GPU)
  wts-tabletune table --costs costs.json --regime chat --regime code --plot table.png
  wts-tabletune evaluate --out bench/results/x_tabletune.json --plot x_tabletune.png
  wts-tabletune overhead --batch 64
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from wts_jax.command_line import ArgumentParser
from wts_jax.result_files import check_writable, write_failure, write_json
from wts_jax.tabletune.cost_model import MODELLED_SHAPES, modelled_cost_fn
from wts_jax.tabletune.cost_table import CostTable
from wts_jax.tabletune.profile import (DEFAULT_BATCHES, DEFAULT_BUDGET_S, profile_costs,
                                      remeasure_contested)
from wts_jax.tabletune.traces import REGIME_RATES, regime_profile

MODELLED_DEVICE = "NVIDIA H200 (modelled)"


class CliError(Exception):
  """A bad argument or input: printed as ``error: ...``, exit status 2."""


def _int_list(minimum: int):
  """argparse type: comma-separated ints, each >= ``minimum``."""
  def parse(text: str) -> tuple[int, ...]:
    try:
      values = tuple(int(v) for v in text.split(","))
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated ints") from None
    if min(values) < minimum:
      raise argparse.ArgumentTypeError(f"{text!r} must be ints >= {minimum}")
    return values
  return parse


def _positive_int(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} must be an int") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
  return value


def _modelled_table(target: str, max_draft_len: int, *, noise: float = 0.0, seed: int = 0,
                    batches=DEFAULT_BATCHES) -> CostTable:
  cost = modelled_cost_fn(target, noise=noise, seed=seed)
  return profile_costs(cost, device_kind=MODELLED_DEVICE, target=target,
                       drafter=cost.shape.drafter, max_draft_len=max_draft_len,
                       batches=batches, source="modelled" + (f", noise {noise}" if noise else ""))


def _load_table(path: str, option: str = "--costs") -> CostTable:
  try:
    return CostTable.load(path)
  except (OSError, ValueError, KeyError, TypeError) as err:
    raise CliError(f"{option}={path!r} could not be read as a cost table: {err}") from None


def _loop_cost(args):
  """The real loop's cost function (needs the end-to-end loop and, in practice, a GPU)."""
  try:
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    from wts_jax.spec import bench_e2e, dspark, qwen3  # pylint: disable=import-outside-toplevel
    from wts_jax.tabletune.profile import loop_cost_fn  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise CliError(f"--cost loop needs the end-to-end loop (wts_jax.spec): {err}") from None
  preset = args.target.replace("-", "_")
  if preset not in bench_e2e.MODELS:
    raise CliError(f"--target={args.target!r} must be one of {sorted(bench_e2e.MODELS)} "
                   f"for --cost loop")
  target_config, drafter_config = bench_e2e.model_configs(preset, args.head_type)
  if args.max_draft_len > drafter_config.block_size:
    raise CliError(f"--max-draft-len={args.max_draft_len} must be <= the drafter's "
                   f"block_size={drafter_config.block_size}")
  dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
  # Random weights: the cost of an iteration does not depend on their values.
  target = qwen3.make_qwen3(target_config, seed=0, param_dtype=dtype, dtype=dtype)
  drafter = dspark.make_dspark(drafter_config, seed=1, param_dtype=dtype, dtype=dtype)
  cost = loop_cost_fn(target, drafter, prompt_len=args.prompt_len, repeats=args.repeats,
                      walk_impl=args.walk)
  return cost, jax.devices()[0].device_kind, f"dspark-{args.target}-{args.head_type}"


def cmd_profile(args) -> int:
  if args.cost == "modelled":
    if args.target not in MODELLED_SHAPES:
      raise CliError(f"--target={args.target!r} must be one of {sorted(MODELLED_SHAPES)} "
                     f"for --cost modelled")
    cost = modelled_cost_fn(args.target, noise=args.noise, seed=args.seed)
    device_kind, drafter = MODELLED_DEVICE, cost.shape.drafter
    source = "modelled" + (f", noise {args.noise}" if args.noise else "")
  else:
    cost, device_kind, drafter = _loop_cost(args)
    source = "measured"
  table = profile_costs(cost, device_kind=device_kind, target=args.target, drafter=drafter,
                        max_draft_len=args.max_draft_len, batches=args.batches,
                        budget_s=args.budget_s, source=source, log=print,
                        draft_lens=args.draft_lens)
  left = args.budget_s - table.provenance["profile_seconds"]
  if args.remeasure_margin > 0 and left > 0:
    points = len(table.batches) * (table.max_draft_len + 1
                                   - len(table.provenance["interpolated_draft_lens"]))
    table = remeasure_contested(table, cost, margin=args.remeasure_margin, budget_s=left,
                                point_seconds=table.provenance["profile_seconds"] / points)
    print(f"measured {table.provenance['remeasured_points']} contested points again")
  print(f"wrote {table.save(args.out)} ({table.provenance['profile_seconds']:.1f} s, "
        f"skipped batches {table.provenance['skipped_batches']})")
  return 0


def _profiles(args, max_draft_len: int) -> dict[str, np.ndarray]:
  profiles = {r: regime_profile(r, max_draft_len) for r in (args.regime or [])}
  for text in args.acceptance or []:
    parts = text.split(",")
    try:
      if len(parts) > 2:
        raise ValueError
      rate, decay = (float(v) for v in (parts + ["1"])[:2])
    except ValueError:
      raise CliError(f"--acceptance={text!r} must be RATE[,DECAY] floats") from None
    if not (0 <= rate <= 1 and 0 < decay <= 1):
      raise CliError(f"--acceptance={text!r} must have 0 <= RATE <= 1, 0 < DECAY <= 1")
    profiles[f"p={rate:g}x{decay:g}^j"] = rate * decay ** np.arange(max_draft_len)
  return profiles or {r: regime_profile(r, max_draft_len) for r in sorted(REGIME_RATES)}


def _write_outputs(args, result, plot) -> int:
  """``--out`` (the JSON) and ``--plot`` (the PNG), where asked for. Both were tried
  before the work; a write that fails anyway (the disk filled meanwhile) is an
  ``error:`` line naming the file, and where the JSON landed if it did."""
  for option, path, write in (("--out", args.out, lambda: write_json(result, args.out)),
                              ("--plot", args.plot, lambda: plot(args.plot))):
    if not path:
      continue
    try:
      print(f"wrote {write()}")
    except OSError as err:
      results = args.out if option == "--plot" else None
      raise CliError(write_failure(option, path, err, results)) from None
  return 0


def cmd_table(args) -> int:
  from wts_jax.tabletune import table as tables  # pylint: disable=import-outside-toplevel
  costs = _load_table(args.costs) if args.costs else _modelled_table(args.target, 7)
  profiles = _profiles(args, costs.max_draft_len)
  batches = list(args.batches or costs.batches)
  print("B".rjust(5) + "".join(name.rjust(16) for name in profiles))
  result = {"costs": costs.to_json(), "tables": {}}
  for name, profile in profiles.items():
    result["tables"][name] = tables.draft_len_table(costs, profile, batches, min_draft_len=1)
  for i, batch in enumerate(batches):
    print(str(batch).rjust(5) + "".join(
        str(result["tables"][name]["best_draft_len"][i]).rjust(16) for name in profiles))
  return _write_outputs(args, result, lambda path: tables.plot_table(costs, profiles, path))


def cmd_evaluate(args) -> int:
  from wts_jax.tabletune import evaluate  # pylint: disable=import-outside-toplevel
  from wts_jax.tabletune.traces import standard_traces  # pylint: disable=import-outside-toplevel
  true_costs = (_load_table(args.costs) if args.costs
                else _modelled_table(args.target, args.max_draft_len))
  if args.policy_costs:
    policy_costs = _load_table(args.policy_costs, "--policy-costs")
  elif args.remeasure and not args.costs and args.policy_noise > 0:
    # The policies' table as the profiler would measure the noisy model, contested
    # points measured again.
    noisy = modelled_cost_fn(args.target, noise=args.policy_noise, seed=args.seed + 1)
    policy_costs = remeasure_contested(
        profile_costs(noisy, device_kind=MODELLED_DEVICE, target=args.target,
                      drafter=noisy.shape.drafter, max_draft_len=args.max_draft_len,
                      source=f"modelled, noise {args.policy_noise}"), noisy)
  else:
    policy_costs = true_costs.with_noise(args.policy_noise, seed=args.seed + 1)
  max_draft_len = min(args.max_draft_len, true_costs.max_draft_len)
  traces = standard_traces(batch=args.batch, max_draft_len=max_draft_len,
                           iterations=args.iterations, seed=args.seed)
  if args.trace:
    unknown = sorted(set(args.trace) - {t.name for t in traces})
    if unknown:
      raise CliError(f"--trace={unknown!r} must be among {[t.name for t in traces]}")
    traces = [t for t in traces if t.name in args.trace]
  calibration = evaluate.calibration_trace(batch=args.batch, max_draft_len=max_draft_len,
                                           iterations=args.iterations, seed=args.seed)
  labels = {"policy_cost_noise": None if args.policy_costs else args.policy_noise,
            "policy_table_remeasured": bool(args.remeasure and not args.costs
                                            and args.policy_noise > 0),
            "seed": args.seed}
  results = evaluate.evaluate(traces, true_costs, policy_costs, calibration=calibration,
                              labels=labels)
  for trace in results["traces"]:
    ratios = trace["ratio_to_best_fixed"]
    line = " ".join(f"{m}={ratios[m]:.3f}" for m in (evaluate.TABLETUNE,) + evaluate.BASELINES)
    recovery = trace.get("stale_recovery", {}).get(evaluate.TABLETUNE)
    stale = ("" if not trace["stale"] else " stale_recovery=" + (
        "n/a (the stale table lost nothing)" if recovery is None else f"{recovery:.3f}"))
    print(f"{trace['name']}: best {trace['best_fixed']} | {line}{stale}")
  print(json.dumps(results["summary"]["targets"]))
  return _write_outputs(args, results, lambda path: evaluate.plot_results(results, path))


def cmd_overhead(args) -> int:
  from wts_jax.tabletune.controller import TableTuneController  # pylint: disable=import-outside-toplevel
  from wts_jax.tabletune.overhead import controller_overhead  # pylint: disable=import-outside-toplevel
  costs = _load_table(args.costs) if args.costs else _modelled_table(args.target, 7)
  controller = TableTuneController.from_table(
      costs, regime_profile("chat", costs.max_draft_len),
      confidence_bins=args.confidence_bins)
  result = controller_overhead(controller, batch=args.batch, iterations=args.iterations)
  iteration_s = float(costs.cost(args.batch).min())
  result["cheapest_iteration_s"] = iteration_s
  result["overhead_share"] = result["overhead_s"] / iteration_s
  print(json.dumps(result))
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = ArgumentParser(prog="wts-tabletune", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)

  p = sub.add_parser("profile", help="measure c(B, K) into a cost table JSON")
  p.add_argument("--cost", choices=("modelled", "loop"), default="modelled")
  p.add_argument("--target", default="qwen3-8b")
  p.add_argument("--max-draft-len", type=_positive_int, default=7)
  p.add_argument("--batches", type=_int_list(1), default=DEFAULT_BATCHES)
  p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
  p.add_argument("--draft-lens", type=_int_list(0), default=None,
                 help="measure only these K (must hold 0 and the max); interpolate the rest")
  p.add_argument("--noise", type=float, default=0.0, help="modelled: lognormal sigma")
  p.add_argument("--remeasure-margin", type=float, default=0.03,
                 help="with the budget left, measure again the K pairs within this "
                      "relative throughput of each other at a bucket (0: off)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--prompt-len", type=_positive_int, default=512)
  p.add_argument("--repeats", type=_positive_int, default=5)
  p.add_argument("--head-type", default="vanilla", help="loop: the drafter's serial head")
  p.add_argument("--walk", default="auto", help="loop: walk_impl of the drafter")
  p.add_argument("--out", required=True)
  p.set_defaults(run=cmd_profile)

  p = sub.add_parser("table", help="K*(B) for acceptance profiles (and the plot)")
  p.add_argument("--costs", help="cost table JSON (default: the modelled H200)")
  p.add_argument("--target", default="qwen3-8b")
  p.add_argument("--regime", action="append", choices=sorted(REGIME_RATES))
  p.add_argument("--acceptance", action="append", metavar="RATE[,DECAY]")
  p.add_argument("--batches", type=_int_list(1))
  p.add_argument("--out")
  p.add_argument("--plot")
  p.set_defaults(run=cmd_table)

  p = sub.add_parser("evaluate", help="every policy on the simulated traces")
  p.add_argument("--costs", help="true cost table JSON (default: the modelled H200)")
  p.add_argument("--policy-costs", help="the table the policies see (default: --costs)")
  p.add_argument("--policy-noise", type=float, default=0.03,
                 help="lognormal sigma of the policies' table against the true one "
                      "(unless --policy-costs gives it)")
  p.add_argument("--single-pass", dest="remeasure", action="store_false",
                 help="modelled costs: the policies' table is the true one with noise, "
                      "measured once (default: profiled from the noisy model with the "
                      "contested points measured again, as `profile` does)")
  p.add_argument("--target", default="qwen3-8b")
  p.add_argument("--max-draft-len", type=_positive_int, default=7)
  p.add_argument("--batch", type=_positive_int, default=64)
  p.add_argument("--iterations", type=_positive_int, default=1200)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--trace", action="append")
  p.add_argument("--out")
  p.add_argument("--plot")
  p.set_defaults(run=cmd_evaluate)

  p = sub.add_parser("overhead", help="the controller's cost per iteration on this device")
  p.add_argument("--costs")
  p.add_argument("--target", default="qwen3-8b")
  p.add_argument("--batch", type=_positive_int, default=64)
  p.add_argument("--iterations", type=_positive_int, default=2000)
  p.add_argument("--confidence-bins", type=int, default=8)
  p.set_defaults(run=cmd_overhead)
  return parser


def _check_arguments(args) -> None:
  """What can be checked before any work: noise levels, and that the output files can be
  written (a profile on the GPU takes minutes)."""
  for option in ("noise", "policy_noise"):
    value = getattr(args, option, None)
    if value is not None and not (math.isfinite(value) and value >= 0):
      raise CliError(f"--{option.replace('_', '-')}={value} must be a finite number >= 0")
  check_writable(getattr(args, "out", None), "--out")
  check_writable(getattr(args, "plot", None), "--plot")


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  try:
    _check_arguments(args)
    return args.run(args)
  except (CliError, ValueError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
