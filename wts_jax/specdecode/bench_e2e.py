"""``wts-e2e-bench``: the end-to-end decode iteration on the device, split into parts.

For each model (random weights at the real shapes), batch size and walk, it measures
with ``wts_jax.specdecode.timing.iteration_cost`` the device time of one decode iteration
(``total``) and of its parts (target ``verify``, ``drafter`` backbone, ``walk``), and
plain autoregressive decoding (one target token per iteration) beside them.

Random weights accept almost nothing, so throughput is *modelled*: under a stated
per-position acceptance profile ``α_1 … α_k`` (``α_i`` = P(draft i accepted | drafts
before it accepted)) an iteration commits ``L = 1 + Σ_j Π_{i≤j} α_i`` tokens per row in
expectation, and ``tokens/s = B · L / total``. The same profile is applied to every walk
(the persistent kernel and the step-wise walk compute the same head, so they accept the
same; "none", the backbone without a serial head, would accept less in reality). The
JSON keeps the measured times, so any other acceptance can be applied to them; the plot
draws tokens/s against L for each walk, per batch size. Each record also holds the
bytes a verify pass must read at least (the target's weights, the rows' cached keys
and values), so ``verify_s`` can be read as a fraction of the memory-bound floor.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wts_jax import result_files
from wts_jax.command_line import ArgumentParser
from wts_jax.specdecode import autoregressive, loop, phase_profile, timing
from wts_jax.specdecode.dspark import WALKS, DSparkConfig, make_dspark
from wts_jax.specdecode.loop import generate
from wts_jax.specdecode.qwen3 import Qwen3Config, make_qwen3

MODELS = {
    "qwen3_4b": (Qwen3Config.qwen3_4b, DSparkConfig.for_target),
    "qwen3_8b": (Qwen3Config.qwen3_8b, DSparkConfig.for_target),
    "tiny": (Qwen3Config.tiny, DSparkConfig.tiny),
}
DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
# A stated, plausible profile for a trained DSpark drafter at K = 7 (not a measurement).
DEFAULT_PROFILE = (0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6)


def _ints(text: str) -> tuple[int, ...]:
  try:
    values = tuple(int(v) for v in text.split(","))
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of ints")
  if not values or min(values) < 1:
    raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
  if len(set(values)) < len(values):
    raise argparse.ArgumentTypeError(f"{text!r} names a value more than once")
  return values


def _choices(allowed):
  def parse(text: str) -> tuple[str, ...]:
    values = tuple(text.split(","))
    bad = [v for v in values if v not in allowed]
    if bad:
      raise argparse.ArgumentTypeError(f"{bad[0]!r} is not one of {tuple(allowed)}")
    return values
  return parse


def _profile(text: str) -> tuple[float, ...]:
  try:
    values = tuple(float(v) for v in text.split(","))
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")
  if not values or any(not 0.0 <= v <= 1.0 for v in values):
    raise argparse.ArgumentTypeError(f"{text!r}: every acceptance must be in [0, 1]")
  return values


def build_parser() -> argparse.ArgumentParser:
  parser = ArgumentParser(
      prog="wts-e2e-bench",
      description="Device time of one speculative decode iteration (target verify, "
                  "drafter, walk) at the Qwen3-4B/8B shapes with random weights, and "
                  "modelled throughput under a stated acceptance profile.")
  parser.add_argument("--models", type=_choices(MODELS), default=("qwen3_4b", "qwen3_8b"),
                      help="comma-separated: qwen3_4b, qwen3_8b, tiny (CPU check)")
  parser.add_argument("--batches", type=_ints, default=(1, 4, 16, 64))
  parser.add_argument("--walks", type=_choices(WALKS), default=("pallas", "xla", "none"),
                      help="pallas/auto = the persistent kernel, xla = the step-wise "
                           "walk, none = no serial head")
  parser.add_argument("--head-type", choices=("vanilla", "gated", "rnn"), default="vanilla")
  parser.add_argument("--prompt-len", type=int, default=512)
  parser.add_argument("--draft-len", type=int, default=7)
  parser.add_argument("--acceptance", type=_profile, default=DEFAULT_PROFILE,
                      help="per-position acceptance α_1..α_k (modelled throughput); "
                           "shorter than k repeats its last value")
  parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--chain", type=int, default=8,
                      help="iterations chained in one timed executable")
  parser.add_argument("--method", choices=("generate", "pieces"), default="generate",
                      help="generate: whole generate calls (wall clock) and, from a "
                           "profile of one, each phase's device time per iteration; "
                           "pieces: each phase chained alone (timing.iteration_cost)")
  parser.add_argument("--new-tokens", type=int, default=64,
                      help="tokens generated per row by each measured generate call")
  parser.add_argument("--iterations-per-check", type=int, default=1,
                      help="generate: decode iterations between two host reads of the "
                           "loop's condition (generate's iterations_per_check)")
  parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                      help="where the profiles go (default: a temporary folder)")
  parser.add_argument("--agreement", action="store_true",
                      help="also report how often the int8-planes walk's tokens agree "
                           "with the bf16 walk's at each point")
  parser.add_argument("--time-budget", type=float, default=420.0,
                      help="seconds; measurements past it are skipped (and recorded so)")
  parser.add_argument("--out", type=Path, default=Path("e2e.json"))
  parser.add_argument("--plot", type=Path, default=None,
                      help="PNG path (default: --out with .png)")
  parser.add_argument("--replot", type=Path, default=None, metavar="JSON",
                      help="only draw the plot of an earlier run's JSON (no measuring)")
  return parser


def tokens_per_iteration(profile: tuple[float, ...], steps: int) -> float:
  """Expected tokens committed per row and iteration: ``1 + Σ_j Π_{i≤j} α_i``."""
  alphas = [profile[min(i, len(profile) - 1)] for i in range(steps)]
  return 1.0 + float(np.sum(np.cumprod(alphas)))


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def model_configs(name: str, head_type: str) -> tuple[Qwen3Config, DSparkConfig]:
  target_preset, drafter_preset = MODELS[name]
  target_config = target_preset()
  if name == "tiny":
    return target_config, drafter_preset(target_config, head_type=head_type, block_size=7)
  return target_config, drafter_preset(target_config, head_type=head_type)


# The rooflines' denominator: the device's HBM bandwidth as its maker states it (the
# H200's where the device is not listed).
HBM_BYTES_PER_S = {"NVIDIA H200": 4.8e12, "NVIDIA H100 80GB HBM3": 3.35e12}


def hbm_bytes_per_s() -> float:
  return HBM_BYTES_PER_S.get(jax.devices()[0].device_kind, HBM_BYTES_PER_S["NVIDIA H200"])


def weight_bytes(model, *, gathered_table: bool) -> int:
  """Bytes of the weights a forward reads once: all of ``model``'s parameters but its
  serial head (the walk's) and, when ``gathered_table``, the embedding table (a forward
  gathers a few of its rows)."""
  def size(tree):
    return sum(leaf.nbytes for leaf in jax.tree.leaves(tree))
  total = size(nnx.state(model))
  if getattr(model, "head", None) is not None:
    total -= size(nnx.state(model.head))
  if gathered_table:
    total -= model.embed_tokens.weight.nbytes
  return int(total)


def kv_bytes(config: Qwen3Config, batch: int, length: int, dtype) -> int:
  """Bytes of ``batch`` rows' cached keys and values over ``length`` positions."""
  return (2 * config.num_layers * batch * length * config.num_kv_heads * config.head_dim
          * jnp.dtype(dtype).itemsize)


def walk_agreement(target, drafter, *, batch: int, draft_len: int, prompt_len: int) -> float:
  """Fraction of drafted tokens on which the walk with W2 as int8 planes agrees with the
  walk of the stored (bf16) W2, greedy, on the drafter's own block at this point."""
  last, base, hidden = timing.loop_pieces(target, drafter, batch=batch, draft_len=draft_len,
                                          prompt_len=prompt_len)["walk"].carry()
  graph, state = nnx.split(drafter)

  def draft(state, w2):
    settings = loop.LoopSettings(max_new_tokens=1, temperature=0.0,
                                 draft_lens=(draft_len,), walk_impl="auto",
                                 cache_len=1, draft_w2=w2)
    d = loop.with_walk_head(nnx.merge(graph, state), settings, batch)
    return d.draft(base[:, :draft_len], hidden[:, :draft_len], last, temperature=0.0,
                   key=None, walk_impl="auto").tokens
  tokens = {w2: np.asarray(jax.jit(draft, static_argnums=1)(state, w2))
            for w2 in ("int8_planes", "bf16")}
  return float(np.mean(tokens["int8_planes"] == tokens["bf16"]))


def _prompts(vocab: int, batch: int, prompt_len: int) -> list[list[int]]:
  return [[(b * 7 + i) % vocab for i in range(prompt_len)] for b in range(batch)]


def _timed_calls(call, *, repeats: int = 3) -> tuple[float, object]:
  """(median wall seconds, last result) of ``repeats`` calls after a compiling one."""
  result = jax.block_until_ready(call())
  seconds = []
  for _ in range(repeats):
    began = time.perf_counter()
    result = jax.block_until_ready(call())
    seconds.append(time.perf_counter() - began)
  return float(np.median(seconds)), result


def _traced(call, folder: Path) -> Path:
  """``folder``, holding the profile of one ``call`` (compiled before)."""
  with jax.profiler.trace(str(folder), create_perfetto_trace=True):
    jax.block_until_ready(call())
  return folder


def _profiled(call, folder: Path, hlo: str) -> list[tuple[dict, str]]:
  """The GPU kernels of one ``call`` under the profiler, each with its phase."""
  return phase_profile.attributed_kernels(_traced(call, folder), hlo)


def _top_kernels(kernels, phase: str, count: int, unit: str) -> list[dict]:
  """The phase's costliest kernels, launches and seconds per ``unit`` (``count`` of
  them in the profile)."""
  return [{"kernel": name, f"launches_per_{unit}": launches / count,
           f"seconds_per_{unit}": seconds / count}
          for name, launches, seconds in phase_profile.kernel_seconds(kernels, (phase,))]


def autoregressive_point(target, *, batch: int, prompt_len: int, new_tokens: int,
                         profile: Path) -> dict:
  """The target's own greedy decode: wall-clock tokens/s, and the device time of one
  decode step: the GPU's kernels' busy time (``phase_profile.device_time``) in a profiled
  ``new_tokens`` decode less that of a profiled one-token decode (the prefill alone),
  over the steps between them. The difference needs no phase attribution, which the
  step's library and custom-call kernels inside a CUDA graph can defeat."""
  prompts = _prompts(target.config.vocab_size, batch, prompt_len)

  def decode(count):
    return autoregressive.decode_autoregressive(target, prompts, count)

  wall, tokens = _timed_calls(lambda: decode(new_tokens))
  jax.block_until_ready(decode(1))   # compiled before it is profiled
  profiled = {count: phase_profile.device_time(
                  _traced(lambda: decode(count), profile / f"B{batch}_autoregressive_{count}"))
              for count in (1, new_tokens)}
  (totals, busy), (first_totals, first_busy) = profiled[new_tokens], profiled[1]
  steps = new_tokens - 1
  per_step = {}
  for name, (launches, seconds) in totals.items():
    first_launches, first_seconds = first_totals.get(name, (0, 0.0))
    per_step[name] = ((launches - first_launches) / steps, (seconds - first_seconds) / steps)
  step_s = (busy - first_busy) / steps
  if not step_s > 0:
    raise ValueError("the profile recorded no GPU kernel (--method generate needs a GPU; "
                     "use --method pieces)")
  top = sorted(per_step, key=lambda name: per_step[name][1], reverse=True)[:10]
  return dict(autoregressive_s=step_s,
              autoregressive_top_kernels=[
                  {"kernel": name, "launches_per_step": per_step[name][0],
                   "seconds_per_step": per_step[name][1]} for name in top],
              autoregressive_wall_s=wall,
              autoregressive_tokens_per_s=batch * new_tokens / wall), np.asarray(tokens)


def generate_point(target, drafter, *, batch: int, draft_len: int, prompt_len: int,
                   walk: str, new_tokens: int, profile: Path,
                   reference: np.ndarray | None = None, iterations_per_check: int = 1
                   ) -> dict:
  """Whole ``generate`` calls with this walk: wall-clock tokens/s (median of three after
  a compiling call, at the acceptance the random weights give) and, from one profiled
  call, the device time of an iteration and of its phases, and the verify and drafter
  phases' costliest kernels. ``reference``: the target's own greedy tokens, against
  which the output's agreement is reported (the same compute dtype, but other shapes of
  the same products: bf16 near-ties can round apart)."""
  prompts = _prompts(target.config.vocab_size, batch, prompt_len)
  kwargs = dict(draft_len=draft_len, walk_impl=walk,
                iterations_per_check=iterations_per_check)
  hlo: list[str] = []
  generate(target, drafter, prompts, new_tokens, hlo_text=hlo, **kwargs)
  wall, out = _timed_calls(lambda: generate(target, drafter, prompts, new_tokens, **kwargs))
  kernels = _profiled(lambda: generate(target, drafter, prompts, new_tokens, **kwargs),
                      profile / f"B{batch}_{walk}", hlo[0])
  phases = phase_profile.phase_seconds(kernels)
  if not sum(phases.values()) > 0:
    raise ValueError("the profile recorded no GPU kernel (--method generate needs a GPU; "
                     "use --method pieces)")
  iterations = max(int(out.iterations), 1)
  per = {f"{phase}_s": phases[phase] / iterations
         for phase in ("verify", "drafter", "walk", "other", "unattributed")}
  agreement = {}
  if reference is not None:
    agreement["greedy_agreement_with_autoregressive"] = float(
        np.mean(np.asarray(out.tokens) == reference))
  tops = {f"{phase}_top_kernels": _top_kernels(kernels, phase, iterations, "iteration")
          for phase in ("verify", "drafter")}
  return dict(total_s=sum(per.values()), **per, prefill_s=phases["prefill"], **agreement,
              idle_s=phase_profile.loop_idle_seconds(kernels) / iterations, **tops,
              generate_wall_s=wall, generate_tokens=int(np.sum(out.num_tokens)),
              generate_tokens_per_s=float(np.sum(out.num_tokens)) / wall,
              generate_iterations=iterations,
              generate_acceptance_length=float(np.mean(out.acceptance_length())))


def run(args) -> dict:
  began = time.perf_counter()
  dtype = DTYPES[args.dtype]
  steps = args.draft_len
  per_iteration = tokens_per_iteration(args.acceptance, steps)
  records = []

  def over_budget() -> bool:
    return time.perf_counter() - began > args.time_budget

  bandwidth = hbm_bytes_per_s()
  configs = {model: model_configs(model, args.head_type) for model in args.models}
  for model, (_, drafter_config) in configs.items():
    if steps > drafter_config.block_size:
      raise ValueError(f"--draft-len={steps} exceeds the {model} drafter's block_size="
                       f"{drafter_config.block_size}")
  for model, (target_config, drafter_config) in configs.items():
    target = make_qwen3(target_config, seed=0, param_dtype=dtype, dtype=dtype)
    drafter = make_dspark(drafter_config, seed=1, param_dtype=dtype, dtype=dtype)
    target_weights = weight_bytes(target, gathered_table=not target_config.tie_word_embeddings)
    drafter_weights = weight_bytes(drafter, gathered_table=True)
    for batch in args.batches:
      c = target_config
      roofline = {   # bytes ÷ HBM bandwidth: weights once, the rows' K/V at prompt_len
          "verify": (target_weights + kv_bytes(c, batch, args.prompt_len, dtype))
                    / bandwidth,
          "autoregressive": (target_weights + kv_bytes(c, batch, args.prompt_len, dtype))
                            / bandwidth,
          "drafter": (drafter_weights + kv_bytes(drafter_config.layers, batch,
                                                 args.prompt_len, dtype)) / bandwidth}
      common = dict(batch=batch, prompt_len=args.prompt_len, repeats=args.repeats,
                    chain=args.chain)
      if over_budget():
        records.append(dict(model=model, batch=batch, skipped="time budget"))
        continue
      profile = Path(args.profile or tempfile.mkdtemp(prefix="wts-e2e-profile-"))
      reference = None
      if args.method == "generate":
        baseline, reference = autoregressive_point(
            target, batch=batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
            profile=profile)
      else:
        # the target alone (the loop's K = 0 iteration also feeds the drafter's cache)
        baseline = {"autoregressive_s": timing.iteration_cost(
            target, drafter, draft_len=0, pieces=("verify",), **common)["verify_s"]}
        baseline["autoregressive_tokens_per_s"] = batch / baseline["autoregressive_s"]
      ar = baseline["autoregressive_s"]
      _log(f"[{time.perf_counter() - began:6.1f}s] {model} B={batch} autoregressive "
           f"{ar * 1e3:.3f} ms (roofline {roofline['autoregressive'] * 1e3:.3f})")
      shared: dict[str, float] = {}
      point = []
      for walk in args.walks:
        record = dict(model=model, batch=batch, walk=walk, draft_len=steps,
                      prompt_len=args.prompt_len, method=args.method, **baseline,
                      target_weight_bytes=target_weights, drafter_weight_bytes=drafter_weights,
                      kv_cache_bytes=int(kv_bytes(c, batch, args.prompt_len, dtype)),
                      **{f"{phase}_roofline_s": value for phase, value in roofline.items()})
        if over_budget():
          records.append({**record, "skipped": "time budget"})
          continue
        try:
          if args.method == "generate":
            cost = generate_point(target, drafter, batch=batch, draft_len=steps,
                                  prompt_len=args.prompt_len, walk=walk,
                                  new_tokens=args.new_tokens, profile=profile,
                                  reference=reference,
                                  iterations_per_check=args.iterations_per_check)
          else:
            pieces = ("total", "walk") if shared else timing.PIECES
            cost = timing.iteration_cost(target, drafter, draft_len=steps, walk_impl=walk,
                                         pieces=pieces, **common)
            if not shared:
              shared = {"verify_s": cost["verify_s"], "drafter_s": cost["drafter_s"]}
            cost.update(shared)
            cost["other_s"] = (cost["total_s"] - cost["verify_s"] - cost["drafter_s"]
                               - cost["walk_s"])
        except Exception as err:   # a walk this device cannot run: recorded, not fatal
          records.append({**record, "error": f"{type(err).__name__}: {err}"})
          _log(f"  {model} B={batch} walk={walk}: {type(err).__name__}: {err}")
          continue
        modelled = batch * per_iteration / cost["total_s"]
        record.update(cost)
        record.update(
            modelled_tokens_per_iteration=per_iteration,
            modelled_tokens_per_s=modelled,
            modelled_speedup_vs_autoregressive=modelled / (batch / ar))
        records.append(record)
        point.append(record)
        _log(f"[{time.perf_counter() - began:6.1f}s] {model} B={batch} walk={walk}: "
             f"total {cost['total_s'] * 1e3:.3f} ms (verify {cost['verify_s'] * 1e3:.3f}, "
             f"drafter {cost['drafter_s'] * 1e3:.3f}, walk {cost['walk_s'] * 1e3:.3f}, "
             f"other {cost['other_s'] * 1e3:.3f})")
      add_walk_in_loop(point)
      if args.agreement and any(r["walk"] in ("auto", "pallas") for r in point):
        agreement = walk_agreement(target, drafter, batch=batch, draft_len=steps,
                                   prompt_len=args.prompt_len)
        for r in point:
          r["int8_planes_vs_bf16_token_agreement"] = agreement
      # Each (model, B) point on disk as it ends: a run cut off by its caller keeps them.
      result_files.write_json(_report(args, records, began), args.out, indent=2)
    del target, drafter
    gc.collect()

  return _report(args, records, began)


def _report(args, records: list[dict], began: float) -> dict:
  """The run's JSON so far."""
  return dict(
      benchmark="wts-e2e-bench",
      device_kind=jax.devices()[0].device_kind,
      platform=jax.default_backend(),
      jax_version=jax.__version__,
      dtype=args.dtype,
      head_type=args.head_type,
      iterations_per_check=args.iterations_per_check,
      weights="random (throughput is modelled, see modelled_note)",
      method=timing.METHOD,
      roofline_note=(f"*_roofline_s = bytes the phase must read (weights once, the rows' "
                     f"K/V at prompt_len) / {hbm_bytes_per_s() / 1e12:.2f} TB/s"),
      walk_in_loop_note=("walk_in_loop_s = total_s - total_s(walk=none) + walk_s(none): "
                         "what the walk adds to the measured iteration; walk_s is the walk "
                         "chained alone"),
      generate_note=("method=generate: total_s and its phases are device time per "
                     "iteration of a profiled generate call (kernels summed by the phase "
                     "of their HLO operation; prefill apart); idle_s: the GPU's idle "
                     "time per iteration between the loop's first and last kernels (host "
                     "condition reads, launches); generate_*: wall clock of "
                     "whole generate calls at the acceptance the random weights give "
                     "(generate_acceptance_length); autoregressive_s: one step of the "
                     "target's own decode loop: the GPU's kernels' busy time (the union "
                     "of their intervals; copies left out) in a profiled decode less "
                     "that of a profiled one-token decode (its prefill), over the steps "
                     "between them"),
      acceptance_profile=list(args.acceptance),
      modelled_note=(
          "MODELLED, not measured: tokens/s = B * L / total_s with L = 1 + sum_j "
          "prod_{i<=j} alpha_i from acceptance_profile, the same for every walk; "
          "total_s, verify_s, drafter_s, walk_s are measured device times"),
      persistent_walk_gain=walk_gains(records),
      results=records,
      elapsed_s=time.perf_counter() - began)


def add_walk_in_loop(point: list[dict]) -> None:
  """Each record of one (model, B) gains ``walk_in_loop_s`` when the "none" walk (no
  serial head) was measured beside it."""
  none = next((r for r in point if r["walk"] == "none"), None)
  if none is None:
    return
  for r in point:
    r["walk_in_loop_s"] = r["total_s"] - none["total_s"] + none["walk_s"]


def walk_gains(records: list[dict]) -> list[dict]:
  """End-to-end gain of the persistent walk over the step-wise walk, per model and B:
  the throughput ratio at equal acceptance, ``total(xla) / total(pallas) − 1``."""
  times = {(r["model"], r["batch"], r["walk"]): r["total_s"]
           for r in records if "total_s" in r}
  gains = []
  for (model, batch, walk), total in times.items():
    if walk in ("pallas", "auto") and (model, batch, "xla") in times:
      stepwise = times[(model, batch, "xla")]
      gains.append(dict(model=model, batch=batch, walk=walk,
                        gain_percent=100.0 * (stepwise / total - 1.0),
                        walk_saving_s=stepwise - total))
  return gains


def plot(report: dict, path: Path) -> bool:
  """tokens/s against tokens per iteration L, one line per walk, one panel per model/B;
  False when no point was measured (nothing to draw)."""
  plt = result_files.pyplot()
  rows = [r for r in report["results"] if "total_s" in r]
  panels = sorted({(r["model"], r["batch"]) for r in rows})
  if not panels:
    return False
  models = sorted({model for model, _ in panels})
  batches = sorted({batch for _, batch in panels})
  fig, axes = plt.subplots(len(models), len(batches),
                           figsize=(3.6 * len(batches), 3.2 * len(models)), squeeze=False)
  for ax in axes.flat:
    ax.set_visible(False)
  for model, batch in panels:
    ax = axes[models.index(model), batches.index(batch)]
    ax.set_visible(True)
    for r in (r for r in rows if (r["model"], r["batch"]) == (model, batch)):
      lengths = np.linspace(1.0, r["draft_len"] + 1.0, 50)
      ax.plot(lengths, batch * lengths / r["total_s"], label=f"walk={r['walk']}")
      ax.plot([r["modelled_tokens_per_iteration"]], [r["modelled_tokens_per_s"]], "k.")
    ar = next(r["autoregressive_tokens_per_s"] for r in rows
              if (r["model"], r["batch"]) == (model, batch))
    ax.axhline(ar, color="grey", linestyle="--", label="autoregressive")
    ax.set_title(f"{model}, B={batch}")
    ax.set_xlabel("tokens per iteration L (accepted + 1)")
    ax.set_ylabel("tokens/s (modelled)")
    ax.legend(fontsize=7)
  fig.suptitle(f"{report['device_kind']}: measured iteration time, modelled tokens/s "
               f"= B·L / total", fontsize=9)
  fig.tight_layout()
  result_files.save_figure(fig, path, dpi=110)
  return True


def _plot_or_say_why(report: dict, path: Path, results: Path | None = None) -> int:
  """The plot, or why not: 0, or 2 with an ``error:`` line when it cannot be written
  (naming ``results``, where the run's JSON is)."""
  try:
    drawn = plot(report, path)
  except ImportError as err:   # a device image without matplotlib: the JSON is the result
    _log(f"no plot ({err}); draw it elsewhere with: wts-e2e-bench --replot JSON")
    return 0
  except OSError as err:
    print(f"error: {result_files.write_failure('--plot', path, err, results)}",
          file=sys.stderr)
    return 2
  _log(f"wrote {path}" if drawn else f"no plot: no point of {path.stem} was measured")
  return 0


def _read_report(path: Path) -> dict:
  """An earlier run's JSON, or ValueError naming the file."""
  try:
    report = json.loads(path.read_text())
  except (OSError, json.JSONDecodeError) as err:
    raise ValueError(f"--replot={str(path)!r}: {getattr(err, 'strerror', None) or err}") \
        from None
  if not (isinstance(report, dict) and isinstance(report.get("results"), list)
          and all(isinstance(r, dict) for r in report["results"])):
    raise ValueError(f"--replot={str(path)!r} is not a wts-e2e-bench JSON (no list of "
                     "results)")
  return report


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    if args.replot is not None:
      plot_path = args.plot or args.replot.with_suffix(".png")
      report = _read_report(args.replot)
      result_files.check_writable(plot_path, "--plot")
      return _plot_or_say_why(report, plot_path)
    for name in ("prompt_len", "draft_len", "repeats", "chain", "new_tokens",
                 "iterations_per_check"):
      if getattr(args, name) < 1:
        raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.method == "generate" and args.new_tokens < 2:
      raise ValueError(f"--new-tokens={args.new_tokens} must be >= 2 with --method "
                       "generate (a decode step is timed between two decodes)")
    if not (math.isfinite(args.time_budget) and args.time_budget > 0):
      raise ValueError(f"--time-budget={args.time_budget} must be a finite number > 0")
    plot_path = args.plot or args.out.with_suffix(".png")
    # (Tried before measuring: a run takes minutes.)
    result_files.check_writable(args.out, "--out")
    result_files.check_writable(plot_path, "--plot")
    report = run(args)
  except ValueError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  result_files.write_json(report, args.out, indent=2)
  _log(f"wrote {args.out} ({report['elapsed_s']:.0f} s)")
  return _plot_or_say_why(report, plot_path, results=args.out)


if __name__ == "__main__":
  sys.exit(main())
