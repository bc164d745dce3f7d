"""``wts-tabletune``: profile a cost table, derive the draft-length table, evaluate the
controller against the baselines on simulated traffic, measure the controller's cost.

  wts-tabletune profile --cost modelled --target qwen3-8b --out costs.json
  wts-tabletune profile --cost loop --target qwen3-8b --out costs.json   (on the GPU)
  wts-tabletune table --costs costs.json --regime chat --regime code --plot table.png
  wts-tabletune evaluate --costs costs.json --out x_tabletune.json --plot x_tabletune.png
  wts-tabletune overhead --costs costs.json --batch 64

Targets are spelt qwen3-4b / qwen3-8b (qwen3_4b, qwen3_8b as wts-e2e-bench spells them
work too). A bad argument is one ``error:`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from wts_jax.command_line import ArgumentParser
from wts_jax.result_files import check_writable, write_failure, write_json
from wts_jax.tabletune.cost_model import MODELLED_SHAPES, modelled_cost_fn, modelled_source
from wts_jax.tabletune.cost_table import CostTable
from wts_jax.tabletune.profile import (DEFAULT_BATCHES, DEFAULT_BUDGET_S, profile_costs,
                                      remeasure_contested)
from wts_jax.tabletune.traces import REGIMES, regime_profile

MODELLED_DEVICE = "NVIDIA H200 (modelled)"
DEFAULT_MAX_DRAFT_LEN = 7
LOOP_TARGETS = ("qwen3-4b", "qwen3-8b", "tiny")


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


def _target(text: str) -> str:
  """qwen3_8b (wts-e2e-bench's spelling) is qwen3-8b."""
  return text.replace("_", "-")


def _modelled_table(target: str, draft_lens: tuple[int, ...], *, noise: float = 0.0,
                    seed: int = 0, batches=DEFAULT_BATCHES) -> CostTable:
  if target not in MODELLED_SHAPES:
    raise CliError(f"--target={target!r} must be one of {sorted(MODELLED_SHAPES)} for "
                   f"modelled costs")
  cost = modelled_cost_fn(target, noise=noise, seed=seed)
  return profile_costs(cost, device_kind=MODELLED_DEVICE, target=target,
                       drafter=cost.shape.drafter, max_draft_len=draft_lens[-1],
                       batches=batches, draft_lens=draft_lens,
                       source=modelled_source(noise))


def _load_table(path: str, option: str = "--costs") -> CostTable:
  try:
    return CostTable.load(path)
  except (OSError, ValueError, KeyError, TypeError) as err:
    raise CliError(f"{option}={path!r} could not be read as a cost table: {err}") from None


def _draft_lens(args) -> tuple[int, ...]:
  """--draft-lens, else 0..--max-draft-len; the two must agree on the longest K."""
  if args.draft_lens is None:
    return tuple(range((args.max_draft_len or DEFAULT_MAX_DRAFT_LEN) + 1))
  lens = tuple(sorted(set(args.draft_lens)))
  if len(lens) < 2:
    raise CliError(f"--draft-lens={','.join(map(str, args.draft_lens))} must name >= 2 "
                   f"draft lengths")
  if args.max_draft_len is not None and args.max_draft_len != lens[-1]:
    raise CliError(f"--max-draft-len={args.max_draft_len} and --draft-lens (longest "
                   f"{lens[-1]}) disagree; give one of them")
  return lens


def _free_memory_bytes(jax) -> float | None:
  """Memory free for the models on the default device (None when it cannot be told): a
  GPU's own, else the host's available memory."""
  device = jax.devices()[0]
  stats = device.memory_stats() if hasattr(device, "memory_stats") else None
  if stats and "bytes_limit" in stats:
    return float(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  try:
    with open("/proc/meminfo", encoding="ascii") as meminfo:
      for line in meminfo:
        if line.startswith("MemAvailable:"):
          return float(line.split()[1]) * 1024
  except OSError:
    pass
  try:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
  except (ValueError, OSError, AttributeError):
    return None


def _loop_cost(args, max_draft_len: int):
  """The real loop's cost function (needs the end-to-end loop and, in practice, a GPU)."""
  try:
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    from flax import nnx  # pylint: disable=import-outside-toplevel
    from wts_jax.specdecode import bench_e2e, dspark, qwen3  # pylint: disable=import-outside-toplevel
    from wts_jax.tabletune.profile import loop_cost_fn  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    raise CliError(f"--cost loop needs the end-to-end loop (wts_jax.specdecode): {err}") from None
  if args.target not in LOOP_TARGETS:
    raise CliError(f"--target={args.target!r} must be one of {list(LOOP_TARGETS)} for "
                   f"--cost loop")
  target_config, drafter_config = bench_e2e.model_configs(args.target.replace("-", "_"),
                                                          args.head_type)
  if max_draft_len > drafter_config.block_size:
    raise CliError(f"the longest draft length {max_draft_len} must be <= the drafter's "
                   f"block_size={drafter_config.block_size}")
  dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
  # Count the random-weight models' bytes before drawing them: an 8B target in float32
  # on a CPU host would take the machine's memory for minutes before failing.
  shapes = [nnx.eval_shape(lambda: qwen3.Qwen3(target_config, rngs=nnx.Rngs(0),
                                               param_dtype=dtype, dtype=dtype)),
            nnx.eval_shape(lambda: dspark.DSparkDrafter(drafter_config, rngs=nnx.Rngs(1),
                                                        param_dtype=dtype, dtype=dtype))]
  needed = sum(leaf.size * leaf.dtype.itemsize
               for model in shapes for leaf in jax.tree.leaves(nnx.state(model)))
  free = _free_memory_bytes(jax)
  if free is not None and needed > 0.8 * free:
    raise CliError(f"--target={args.target} builds {needed / 2**30:.1f} GiB of "
                   f"{jnp.dtype(dtype).name} weights on {jax.default_backend()}, which has "
                   f"{free / 2**30:.1f} GiB free: run it on a GPU (bfloat16), or use "
                   f"--target tiny")
  print(f"building random-weight {args.target} target and drafter "
        f"({needed / 2**30:.1f} GiB, {jnp.dtype(dtype).name})", file=sys.stderr, flush=True)
  # Random weights: the cost of an iteration does not depend on their values.
  target = qwen3.make_qwen3(target_config, seed=0, param_dtype=dtype, dtype=dtype)
  drafter = dspark.make_dspark(drafter_config, seed=1, param_dtype=dtype, dtype=dtype)
  cost = loop_cost_fn(target, drafter, prompt_len=args.prompt_len, repeats=args.repeats,
                      walk_impl=args.walk)
  return cost, jax.devices()[0].device_kind, f"dspark-{args.target}-{args.head_type}"


def _progress(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


def cmd_profile(args) -> int:
  draft_lens = _draft_lens(args)
  if args.cost == "modelled":
    if args.target not in MODELLED_SHAPES:
      raise CliError(f"--target={args.target!r} must be one of {sorted(MODELLED_SHAPES)} "
                     f"for --cost modelled")
    cost = modelled_cost_fn(args.target, noise=args.noise, seed=args.seed)
    device_kind, drafter = MODELLED_DEVICE, cost.shape.drafter
    source = modelled_source(args.noise)
  else:
    cost, device_kind, drafter = _loop_cost(args, draft_lens[-1])
    source = "measured"
  table = profile_costs(cost, device_kind=device_kind, target=args.target, drafter=drafter,
                        max_draft_len=draft_lens[-1], batches=args.batches,
                        budget_s=args.budget_s, source=source, log=_progress,
                        draft_lens=draft_lens)
  left = args.budget_s - table.provenance["profile_seconds"]
  if args.remeasure_margin > 0 and left > 0:
    points = len(table.batches) * len(table.draft_lens)
    _progress(f"measuring the contested points again ({left:.0f} s of the budget left)")
    table = remeasure_contested(table, cost, margin=args.remeasure_margin, budget_s=left,
                                point_seconds=table.provenance["profile_seconds"] / points,
                                log=_progress)
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
  return profiles or {r: regime_profile(r, max_draft_len) for r in ("chat", "code", "reasoning")}


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
  costs = (_load_table(args.costs) if args.costs
           else _modelled_table(args.target, tuple(range(DEFAULT_MAX_DRAFT_LEN + 1))))
  profiles = _profiles(args, costs.max_draft_len)
  batches = list(args.batches or costs.batches)
  print(f"K*(B) over draft lengths {list(costs.draft_lens)}")
  print("B".rjust(5) + "".join(name.rjust(16) for name in profiles))
  result = {"costs": costs.to_json(), "tables": {}}
  for name, profile in profiles.items():
    result["tables"][name] = tables.draft_len_table(costs, profile, batches)
  for i, batch in enumerate(batches):
    print(str(batch).rjust(5) + "".join(
        str(result["tables"][name]["best_draft_len"][i]).rjust(16) for name in profiles))
  return _write_outputs(args, result, lambda path: tables.plot_table(costs, profiles, path))


def cmd_evaluate(args) -> int:
  from wts_jax.tabletune import evaluate  # pylint: disable=import-outside-toplevel
  from wts_jax.tabletune.traces import standard_traces  # pylint: disable=import-outside-toplevel
  max_draft_len = args.max_draft_len or DEFAULT_MAX_DRAFT_LEN
  if args.costs:
    true_costs = _load_table(args.costs)
    true_costs = true_costs.restricted([k for k in true_costs.draft_lens
                                        if k <= max_draft_len])
  else:
    true_costs = _modelled_table(args.target, tuple(range(max_draft_len + 1)))
  if args.policy_costs:
    policy_costs = _load_table(args.policy_costs, "--policy-costs")
    if not set(true_costs.draft_lens) <= set(policy_costs.draft_lens):
      raise CliError(f"--policy-costs has draft_lens={policy_costs.draft_lens}; it must "
                     f"hold the true table's {true_costs.draft_lens}")
    policy_costs = policy_costs.restricted(true_costs.draft_lens)
  elif args.remeasure and not args.costs and args.policy_noise > 0:
    # The policies' table as the profiler would measure the noisy model, contested
    # points measured again.
    noisy = modelled_cost_fn(args.target, noise=args.policy_noise, seed=args.seed + 1)
    policy_costs = remeasure_contested(
        profile_costs(noisy, device_kind=MODELLED_DEVICE, target=args.target,
                      drafter=noisy.shape.drafter, max_draft_len=true_costs.max_draft_len,
                      draft_lens=true_costs.draft_lens,
                      source=f"modelled, noise {args.policy_noise}"), noisy)
  else:
    policy_costs = true_costs.with_noise(args.policy_noise, seed=args.seed + 1)
  max_draft_len = true_costs.max_draft_len
  traces = standard_traces(batch=args.batch, max_draft_len=max_draft_len,
                           iterations=args.iterations, seed=args.seed, costs=true_costs)
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
            "timing_sd": args.timing_sd, "seed": args.seed}
  results = evaluate.evaluate(traces, true_costs, policy_costs, calibration=calibration,
                              labels=labels, timing_sd=args.timing_sd, seed=args.seed,
                              log=_progress)
  for trace in results["traces"]:
    ratios = trace["ratio_to_best_fixed"]
    line = " ".join(f"{m}={ratios[m]:.3f}" for m in (evaluate.TABLETUNE,) + evaluate.BASELINES)
    recovery = trace.get("stale_recovery", {}).get(evaluate.TABLETUNE)
    stale = ("" if not trace["stale"] else f" stale ({trace['stale']}) recovery=" + (
        "n/a (the stale table lost nothing)" if recovery is None else f"{recovery:.3f}"))
    print(f"{trace['name']}: best {trace['best_fixed']} | {line}{stale}")
  print(json.dumps(results["summary"]["targets"]))
  return _write_outputs(args, results, lambda path: evaluate.plot_results(results, path))


def cmd_overhead(args) -> int:
  import jax  # pylint: disable=import-outside-toplevel
  from wts_jax.tabletune.controller import TableTuneController  # pylint: disable=import-outside-toplevel
  from wts_jax.tabletune.overhead import controller_overhead  # pylint: disable=import-outside-toplevel
  costs = (_load_table(args.costs) if args.costs
           else _modelled_table(args.target, tuple(range(DEFAULT_MAX_DRAFT_LEN + 1))))
  impls = args.impl or (["xla", "pallas"] if jax.default_backend() == "gpu" else ["xla"])
  iteration_s = float(costs.cost(args.batch).min())
  for impl in impls:
    controller = TableTuneController.from_table(
        costs, regime_profile("chat", costs.max_draft_len), impl=impl)
    _progress(f"timing choose + observe ({impl}) over {args.iterations} iterations at "
              f"B={args.batch}")
    result = controller_overhead(controller, batch=args.batch, iterations=args.iterations)
    result["cheapest_iteration_s"] = iteration_s
    result["cheapest_iteration_source"] = f"{costs.device_kind}, {args.costs or 'modelled'}"
    result["overhead_share"] = result["overhead_s"] / iteration_s
    print(json.dumps(result))
  return 0


def build_parser() -> argparse.ArgumentParser:
  parser = ArgumentParser(prog="wts-tabletune", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)

  def command(name, help_text, run):
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(run=run)
    return p

  target_help = "qwen3-4b, qwen3-8b (or as wts-e2e-bench spells them: qwen3_4b, qwen3_8b)"
  p = command("profile", "measure c(B, K) into a cost table JSON", cmd_profile)
  p.add_argument("--cost", choices=("modelled", "loop"), default="modelled",
                 help="modelled: the roofline model of an H200 (no device); loop: time "
                      "the real decode loop on this machine's device (a GPU)")
  p.add_argument("--target", type=_target, default="qwen3-8b",
                 help=f"{target_help}; --cost loop also takes tiny (a CPU check)")
  p.add_argument("--max-draft-len", type=_positive_int, default=None,
                 help=f"measure K = 0..this (default {DEFAULT_MAX_DRAFT_LEN}, or the "
                      f"longest of --draft-lens)")
  p.add_argument("--draft-lens", type=_int_list(0), default=None,
                 help="measure only these K (comma-separated, 0 = the target alone); the "
                      "table's columns are labelled with them")
  p.add_argument("--batches", type=_int_list(1), default=DEFAULT_BATCHES,
                 help="batch buckets (comma-separated); the two ends are always measured")
  p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                 help="seconds for the profile; middle buckets past it are skipped")
  p.add_argument("--noise", type=float, default=0.0,
                 help="modelled: lognormal sigma of each measurement")
  p.add_argument("--remeasure-margin", type=float, default=0.03,
                 help="with the budget left, measure again the K pairs within this "
                      "relative throughput of each other at a bucket (0: off)")
  p.add_argument("--seed", type=int, default=0, help="modelled: the noise's seed")
  p.add_argument("--prompt-len", type=_positive_int, default=512,
                 help="loop: context tokens per row while timing")
  p.add_argument("--repeats", type=_positive_int, default=5,
                 help="loop: timed samples per point (the median is kept)")
  p.add_argument("--head-type", choices=("vanilla", "gated", "rnn"), default="vanilla",
                 help="loop: the drafter's serial head")
  p.add_argument("--walk", choices=("auto", "pallas", "xla", "none"), default="auto",
                 help="loop: walk_impl of the drafter")
  p.add_argument("--out", required=True, help="the cost table JSON to write")

  p = command("table", "K*(B) for acceptance profiles (and the plot)", cmd_table)
  p.add_argument("--costs", help="cost table JSON (default: the modelled H200)")
  p.add_argument("--target", type=_target, default="qwen3-8b",
                 help=f"without --costs: the modelled target, {target_help}")
  p.add_argument("--regime", action="append", choices=REGIMES,
                 help="a simulated regime's acceptance profile (repeat for several; "
                      "default chat, code, reasoning)")
  p.add_argument("--acceptance", action="append", metavar="RATE[,DECAY]",
                 help="a profile p_j = RATE * DECAY^j (repeat for several)")
  p.add_argument("--batches", type=_int_list(1),
                 help="batches to print (default: the table's buckets)")
  p.add_argument("--out", help="JSON of the tables")
  p.add_argument("--plot", help="PNG of the staircases")

  p = command("evaluate", "every policy on the simulated traces", cmd_evaluate)
  p.add_argument("--costs", help="true cost table JSON (default: the modelled H200)")
  p.add_argument("--policy-costs", help="the table the policies see (default: --costs "
                                        "with --policy-noise)")
  p.add_argument("--policy-noise", type=float, default=0.03,
                 help="lognormal sigma of the policies' table against the true one "
                      "(unless --policy-costs gives it)")
  p.add_argument("--single-pass", dest="remeasure", action="store_false",
                 help="modelled costs: the policies' table is the true one with noise, "
                      "measured once (default: profiled from the noisy model with the "
                      "contested points measured again, as `profile` does)")
  p.add_argument("--timing-sd", type=float, default=0.02,
                 help="lognormal sigma of a measured iteration's time around its true "
                      "cost (what TableTune's live cost correction reads)")
  p.add_argument("--target", type=_target, default="qwen3-8b",
                 help=f"without --costs: the modelled target, {target_help}")
  p.add_argument("--max-draft-len", type=_positive_int, default=None,
                 help=f"the longest K (default {DEFAULT_MAX_DRAFT_LEN}); the table's "
                      f"draft lengths up to it are evaluated")
  p.add_argument("--batch", type=_positive_int, default=64,
                 help="slots of the traces (the large-batch traces have twice as many)")
  p.add_argument("--iterations", type=_positive_int, default=1200,
                 help="iterations per trace")
  p.add_argument("--seed", type=int, default=0,
                 help="the traces' seed (the policies' noise uses seed + 1)")
  p.add_argument("--trace", action="append", help="evaluate only this trace (repeat)")
  p.add_argument("--out", help="the evaluation JSON to write")
  p.add_argument("--plot", help="PNG of the ratios and of K over the surge trace")

  p = command("overhead", "the controller's cost per iteration on this device", cmd_overhead)
  p.add_argument("--costs", help="cost table JSON (default: the modelled H200); its "
                                 "cheapest iteration at --batch is the reference")
  p.add_argument("--target", type=_target, default="qwen3-8b",
                 help=f"without --costs: the modelled target, {target_help}")
  p.add_argument("--batch", type=_positive_int, default=64, help="rows of the batch")
  p.add_argument("--iterations", type=_positive_int, default=2000,
                 help="iterations of the timed loop")
  p.add_argument("--impl", action="append", choices=("xla", "pallas"),
                 help="the controller's implementation to time (repeat; default: xla, and "
                      "on a GPU pallas too)")
  return parser


def _check_arguments(args) -> None:
  """What can be checked before any work: noise levels, and that the output files can be
  written (a profile on the GPU takes minutes)."""
  for option in ("noise", "policy_noise", "timing_sd"):
    value = getattr(args, option, None)
    if value is not None and not (math.isfinite(value) and value >= 0):
      raise CliError(f"--{option.replace('_', '-')}={value} must be a finite number >= 0")
  budget = getattr(args, "budget_s", None)
  if budget is not None and not (math.isfinite(budget) and budget > 0):
    raise CliError(f"--budget-s={budget} must be a finite number > 0")
  check_writable(getattr(args, "out", None), "--out")
  check_writable(getattr(args, "plot", None), "--plot")


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)   # bad arguments: one line, exit 2
  try:
    _check_arguments(args)
    return args.run(args)
  except (CliError, ValueError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
