"""The evaluation harness: every policy on every trace over one cost table.

Methods: every fixed K of the table (K = 0, not drafting, among them; the best in
hindsight is the reference), the static table (K*(B) for the profiled regime), TableTune's
controller, SGLang-style adaptive tiers, vLLM-style adaptive verification, a
SpecDec++-style confidence stop and an AdaEDL-style entropy stop. The two stopping rules
have a threshold; it is tuned once, on a calibration trace of its own seed, and then
fixed for every trace (as a deployment would). The policies are given the *profiled*
table (a measured one, or the model with measurement noise; on a cost-stale trace that
table with its costs off); iterations are charged at the *true* table, and a policy that
reads measured iteration times sees the true cost with the trace's timing noise.

Results: tokens/s per method and trace, the ratio to the best fixed K, and for the
stale traces ``stale_recovery`` = (method - stale static table) / (fresh static table -
stale static table): the share of what the stale table lost that the method wins back
(the fresh table is built for the trace's measured acceptance on costs without error; on
a cost-stale trace the stale one has that acceptance too and the costs with the error,
so that the error alone separates them; the policies see the true table with the error).
"""

from __future__ import annotations

import datetime
import pathlib
from typing import Any, Callable

import jax
import numpy as np

from wts_jax.specdecode.policy import FixedDraftLength
from wts_jax.tabletune.baselines import (ConfidenceStopPolicy, EntropyStopPolicy,
                                         SGLangAdaptivePolicy, StaticTablePolicy,
                                         VLLMAdaptiveVerifyPolicy)
from wts_jax.tabletune.controller import TableTuneController
from wts_jax.tabletune.cost_table import CostTable
from wts_jax.result_files import pyplot, save_figure
from wts_jax.tabletune.simulate import replay
from wts_jax.tabletune.traces import (Phase, Trace, make_trace, measured_profile,
                                      profiled_prior, stale_cost_factors)

SCHEMA = "wts_jax.tabletune.evaluation/2"
TABLETUNE = "tabletune"
BASELINES = ("static_table", "sglang_adaptive", "vllm_adaptive_verify",
             "specdecpp_confidence_stop", "adaedl_entropy_stop")
ADAPTIVE_BASELINES = ("sglang_adaptive", "vllm_adaptive_verify")
METHOD_DESCRIPTIONS = {
    "fixed_k<K>": "always draft K (K = 0: the target alone); the best K in hindsight is "
                  "the reference",
    "static_table": "K*(B_active) from a table built for the profiled regime's acceptance",
    "static_table_fresh": "stale traces only: the table built for the trace's measured "
                          "acceptance on the costs without error (on a cost-stale trace the "
                          "static table has that acceptance too, and the costs with the "
                          "error)",
    "tabletune": "TableTune controller: censored online acceptance (per request), "
                 "Page-Hinkley drift reset, hysteresis, K (0 included, probing while off) "
                 "from the cost table corrected live by the measured iteration times",
    "sglang_adaptive": "EMA of accept length picks among step-count tiers (always drafts)",
    "vllm_adaptive_verify": "slots by survival probability admitted up to the token budget "
                            "maximising the profiled cost model's tokens/s (always drafts)",
    "specdecpp_confidence_stop": "stop when 1 - sigma(confidence) passes a threshold",
    "adaedl_entropy_stop": "stop when 1 - sqrt(gamma * entropy) falls below a threshold",
    "vllm_adaptive_verify_ragged": "reference, not our loop: the vLLM-style policy charged "
                                   "as if verification cost followed the admitted tokens",
    "tabletune_fresh": "cost-stale traces only: TableTune given the table without the error",
}
SPECDEC_THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ADAEDL_THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# The targets, checked in ``summarize``.
RATIO_TARGET = 0.97
STALE_RECOVERY_TARGET = 0.96
BASELINE_SHORTFALL_LIMIT = 0.01


def calibration_trace(*, batch: int, max_draft_len: int, iterations: int,
                      seed: int) -> Trace:
  """A trace the stopping thresholds are tuned on (its own seed, a mixed regime)."""
  n = iterations
  return make_trace("calibration", "threshold tuning only", [
      Phase(n // 2, min(16, batch), {"chat": 0.5, "code": 0.3, "reasoning": 0.2}),
      Phase(n - n // 2, batch, {"chat": 0.5, "code": 0.3, "reasoning": 0.2})],
                    batch=batch, max_draft_len=max_draft_len, profiled_regime="chat",
                    seed=seed + 1000)


def tune_stop_thresholds(true_costs: CostTable, trace: Trace) -> dict[str, float]:
  """The SpecDec++ and AdaEDL thresholds with the best tokens/s on ``trace``."""
  k = trace.max_draft_len
  def best(make, grid):
    rates = {t: replay(make(t), trace, true_costs)["tokens_per_s"] for t in grid}
    return max(rates, key=rates.get)
  return {"specdecpp_threshold": best(lambda t: ConfidenceStopPolicy(k, t), SPECDEC_THRESHOLDS),
          "adaedl_threshold": best(lambda t: EntropyStopPolicy(k, t), ADAEDL_THRESHOLDS)}


def trace_tables(trace: Trace, true_costs: CostTable,
                 policy_costs: CostTable) -> tuple[CostTable, CostTable]:
  """(the table the policies see on ``trace``, the table a fresh static table is built
  on), cut to the trace's draft lengths: the policies' table; on a cost-stale trace the
  true table off by the trace's cost error (that error alone), and the true table."""
  def cut(table):
    return table.restricted([k for k in table.draft_lens if k <= trace.max_draft_len])
  if trace.stale != "costs":
    return cut(policy_costs), cut(policy_costs)
  drafting, tilt = trace.cost_error
  fresh = cut(true_costs)
  return fresh.scaled(stale_cost_factors(fresh.draft_lens, trace.cost_error),
                      f"stale costs: drafting {drafting:+g}, tilt {tilt:+g}"), fresh


def methods_for(trace: Trace, true_costs: CostTable, policy_costs: CostTable,
                tuned: dict[str, float],
                controller_options: dict[str, Any] | None = None,
                seed: int = 0) -> dict[str, Any]:
  """Every method for ``trace``. The prior acceptance of TableTune and of the static
  table is the profiled regime's as measured on traffic of its own (``profiled_prior``,
  ``seed``)."""
  k = trace.max_draft_len
  batch = trace.active.shape[1]
  prior = profiled_prior(trace.profiled_regime, k, seed)
  table, fresh = trace_tables(trace, true_costs, policy_costs)
  methods: dict[str, Any] = {f"fixed_k{d}": FixedDraftLength(d) for d in table.draft_lens}
  if trace.stale:
    # Both static tables for the traffic's own acceptance, on a cost-stale trace, so
    # that the cost error alone separates them.
    measured = measured_profile(trace)
    stale_prior = prior if trace.stale == "acceptance" else measured
    methods["static_table"] = StaticTablePolicy.build(table, stale_prior, batch)
    methods["static_table_fresh"] = StaticTablePolicy.build(fresh, measured, batch)
  else:
    methods["static_table"] = StaticTablePolicy.build(table, prior, batch)
  methods[TABLETUNE] = TableTuneController.from_table(table, prior,
                                                      **(controller_options or {}))
  if trace.stale == "costs":
    methods[f"{TABLETUNE}_fresh"] = TableTuneController.from_table(
        fresh, prior, **(controller_options or {}))
  methods["sglang_adaptive"] = SGLangAdaptivePolicy.for_draft_lens(table.draft_lens)
  methods["vllm_adaptive_verify"] = VLLMAdaptiveVerifyPolicy.from_table(table)
  methods["specdecpp_confidence_stop"] = ConfidenceStopPolicy(k, tuned["specdecpp_threshold"])
  methods["adaedl_entropy_stop"] = EntropyStopPolicy(k, tuned["adaedl_threshold"])
  return methods


def evaluate_trace(trace: Trace, true_costs: CostTable, policy_costs: CostTable,
                   tuned: dict[str, float], controller_options=None,
                   timing_sd: float = 0.02, seed: int = 0) -> dict[str, Any]:
  runs = {name: replay(policy, trace, true_costs, timing_sd=timing_sd)
          for name, policy in methods_for(trace, true_costs, policy_costs, tuned,
                                          controller_options, seed).items()}
  rates = {name: run["tokens_per_s"] for name, run in runs.items()}
  by_time = {name: run["tokens_per_s_by_time"] for name, run in runs.items()}
  table, _ = trace_tables(trace, true_costs, policy_costs)
  rates["vllm_adaptive_verify_ragged"] = replay(
      VLLMAdaptiveVerifyPolicy.from_table(table), trace, true_costs,
      ragged_verify=True)["tokens_per_s"]
  fixed = {name: rate for name, rate in rates.items() if name.startswith("fixed_k")}
  best_fixed = max(fixed, key=fixed.get)
  bins = trace.max_draft_len + 1
  result = {
      "name": trace.name, "description": trace.description, "stale": trace.stale,
      "cost_error": list(trace.cost_error) if trace.stale == "costs" else None,
      "profiled_regime": trace.profiled_regime, "running_regimes": list(trace.running_regimes),
      "iterations": int(trace.active.shape[0]), "batch_slots": int(trace.active.shape[1]),
      "mean_active_rows": float(trace.active.sum(1).mean()),
      "best_fixed": best_fixed,
      "tokens_per_s": rates,
      "ratio_to_best_fixed": {name: rate / fixed[best_fixed] for name, rate in rates.items()},
      "tokens_per_s_by_time": by_time,
      "draft_len_histogram": {
          name: np.bincount(run["draft_len"], minlength=bins).tolist()
          for name, run in runs.items() if not name.startswith("fixed_k")},
      "draft_len_series": {name: runs[name]["draft_len"].tolist()
                           for name in (TABLETUNE, "sglang_adaptive", "static_table")},
  }
  if trace.stale:
    stale, fresh = rates["static_table"], rates["static_table_fresh"]
    result["stale_loss"] = (fresh - stale) / fresh
    # None where the stale table lost nothing (the two tables agree): nothing to recover.
    lost = fresh - stale > 1e-6 * fresh
    result["stale_recovery"] = {name: (rate - stale) / (fresh - stale) if lost else None
                                for name, rate in rates.items()
                                if name in (TABLETUNE,) + BASELINES
                                and name != "static_table"}
    if trace.stale == "costs":
      # Against TableTune given the table without the error: what the error itself cost
      # it (the recovery above also counts what learning acceptance online costs
      # against a static table that knows the trace's).
      own = rates[f"{TABLETUNE}_fresh"]
      result["stale_recovery_vs_tabletune_on_true_costs"] = (
          (rates[TABLETUNE] - stale) / (own - stale) if own - stale > 1e-6 * own else None)
  return result


def summarize(trace_results: list[dict[str, Any]]) -> dict[str, Any]:
  competitors = (TABLETUNE,) + BASELINES
  ratios = {m: [t["ratio_to_best_fixed"][m] for t in trace_results] for m in competitors}
  summary = {m: {"mean_ratio_to_best_fixed": float(np.mean(r)),
                 "min_ratio_to_best_fixed": float(np.min(r))} for m, r in ratios.items()}
  mine = summary[TABLETUNE]

  def recoveries(kind):
    return [t["stale_recovery"][TABLETUNE] for t in trace_results
            if t["stale"] == kind and t["stale_recovery"][TABLETUNE] is not None]

  # How far TableTune falls behind each baseline on its worst trace (> 0: behind).
  shortfall = {m: max(1.0 - t["tokens_per_s"][TABLETUNE] / t["tokens_per_s"][m]
                      for t in trace_results) for m in BASELINES}
  worst = max(shortfall, key=shortfall.get)
  stale = {kind: recoveries(kind) for kind in ("acceptance", "costs")}
  own = [t["stale_recovery_vs_tabletune_on_true_costs"] for t in trace_results
         if t.get("stale_recovery_vs_tabletune_on_true_costs") is not None]
  targets = {
      "min_ratio_to_best_fixed": mine["min_ratio_to_best_fixed"],
      "ratio_target_97": mine["min_ratio_to_best_fixed"] >= RATIO_TARGET,
      "ahead_of_adaptive_baselines_on_mean": all(
          mine["mean_ratio_to_best_fixed"] > summary[m]["mean_ratio_to_best_fixed"]
          for m in ADAPTIVE_BASELINES),
      "ahead_of_every_baseline_on_mean": all(
          mine["mean_ratio_to_best_fixed"] > summary[m]["mean_ratio_to_best_fixed"]
          for m in BASELINES),
      "max_shortfall_to_a_baseline": shortfall[worst],
      "max_shortfall_baseline": worst,
      "within_1pct_of_every_baseline": shortfall[worst] <= BASELINE_SHORTFALL_LIMIT,
      **{f"min_stale_recovery_{kind}": float(min(r)) if r else None
         for kind, r in stale.items()},
      **{f"stale_recovery_{kind}_target_96": bool(r) and min(r) >= STALE_RECOVERY_TARGET
         for kind, r in stale.items()},
      "min_stale_recovery_costs_vs_tabletune_on_true_costs": float(min(own)) if own else None,
  }
  return {"methods": summary, "shortfall_to_baseline": shortfall, "targets": targets}


def evaluate(traces: list[Trace], true_costs: CostTable, policy_costs: CostTable, *,
             calibration: Trace | None = None, tuned: dict[str, float] | None = None,
             controller_options=None, labels: dict[str, Any] | None = None,
             timing_sd: float = 0.02, seed: int = 0,
             log: Callable[[str], None] | None = None) -> dict[str, Any]:
  """The whole evaluation as a JSON-ready dict (``labels`` are copied in verbatim).

  The stopping rules' thresholds are ``tuned`` if given, else tuned on ``calibration``.
  ``timing_sd``: the spread of a measured iteration's time (``replay``); ``seed``: the
  priors' (``profiled_prior``). ``log`` gets a line as each trace starts.
  """
  if tuple(policy_costs.draft_lens) != tuple(true_costs.draft_lens):
    raise ValueError(f"the policies' table has draft_lens={policy_costs.draft_lens}, the "
                     f"true table {true_costs.draft_lens}: they must label the same K")
  if tuned is None:
    if calibration is None:
      raise ValueError("evaluate needs calibration= (a Trace) or tuned= (thresholds)")
    if log:
      log("tuning the stopping rules' thresholds on the calibration trace")
    tuned = tune_stop_thresholds(true_costs, calibration)
  trace_results = []
  for i, trace in enumerate(traces):
    if log:
      log(f"trace {i + 1}/{len(traces)}: {trace.name}")
    trace_results.append(evaluate_trace(trace, true_costs, policy_costs, tuned,
                                        controller_options, timing_sd, seed))
  return {
      "schema": SCHEMA,
      "device_kind": true_costs.device_kind,
      "cost_source": true_costs.provenance.get("source", "unknown"),
      "acceptance_source": "simulated: per-position Bernoulli with regime profiles "
                           "(wts_jax.tabletune.traces), not measured traffic",
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "jax_version": jax.__version__,
      "target": true_costs.target, "drafter": true_costs.drafter,
      "max_draft_len": traces[0].max_draft_len,
      "true_costs": true_costs.to_json(), "policy_costs": policy_costs.to_json(),
      "controller_options": dict(controller_options or {}),
      "tuned_thresholds": tuned, "methods": METHOD_DESCRIPTIONS,
      **(labels or {}),
      "traces": trace_results,
      "summary": summarize(trace_results),
  }


def plot_results(results: dict[str, Any], path: str | pathlib.Path) -> pathlib.Path:
  """PNG: ratio to the best fixed K per trace and method; K over time on the traces."""
  plt = pyplot()
  traces = results["traces"]
  methods = (TABLETUNE,) + BASELINES
  fig, axes = plt.subplots(2, 1, figsize=(13, 9))
  width = 0.8 / len(methods)
  x = np.arange(len(traces))
  for i, method in enumerate(methods):
    axes[0].bar(x + i * width, [t["ratio_to_best_fixed"][method] for t in traces], width,
                label=method)
  axes[0].axhline(1.0, color="k", lw=0.8)
  axes[0].axhline(RATIO_TARGET, color="r", lw=0.8, ls="--", label="97 % target")
  axes[0].set_xticks(x + 0.4, [t["name"] for t in traces], rotation=30, ha="right",
                     fontsize=7)
  axes[0].set_ylim(0.5, 1.1)
  axes[0].set_ylabel("tokens/s / best fixed K")
  axes[0].legend(fontsize=7, ncol=4)
  # The surge turns drafting off and on again; else a shift of acceptance.
  shift = next((t for t in traces if "surge" in t["name"]),
               next((t for t in traces if "shift" in t["name"]), traces[0]))
  styles = {"static_table": dict(ls="--", lw=1.0), "sglang_adaptive": dict(ls=":", lw=1.2),
            TABLETUNE: dict(lw=1.6)}
  for method in ("static_table", "sglang_adaptive", TABLETUNE):
    axes[1].step(np.arange(len(shift["draft_len_series"][method])),
                 shift["draft_len_series"][method], where="post", label=method,
                 **styles[method])
  axes[1].set_title(f"K per iteration: {shift['name']}")
  axes[1].set_xlabel("iteration")
  axes[1].set_ylabel("K")
  axes[1].legend(fontsize=7)
  fig.suptitle(f"TableTune evaluation: {results['device_kind']} costs "
               f"({results['cost_source']}), acceptance simulated")
  fig.tight_layout()
  return save_figure(fig, path, dpi=100)
