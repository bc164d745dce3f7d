"""The evaluation harness: every policy on every trace over one cost table.

Methods: every fixed K (the best in hindsight is the reference), the static table
(K*(B) for the profiled regime), TableTune's controller (with and without the
confidence head), SGLang-style adaptive tiers, vLLM-style adaptive verification,
a SpecDec++-style confidence stop and an AdaEDL-style entropy stop. The two stopping
rules have a threshold; it is tuned once, on a calibration trace of its own seed, and
then fixed for every trace (as a deployment would). The policies are given the
*profiled* table (a measured one, or the model with measurement noise); iterations are
charged at the *true* table.

Results: tokens/s per method and trace, the ratio to the best fixed K, and for the
stale-table traces ``stale_recovery`` = (method - stale static table) / (fresh static
table - stale static table): the share of what the stale table lost that the method
wins back.
"""

from __future__ import annotations

import datetime
import pathlib
from typing import Any

import jax
import numpy as np

from wts_jax.spec.policy import FixedDraftLength
from wts_jax.tabletune.baselines import (ConfidenceStopPolicy, EntropyStopPolicy,
                                         SGLangAdaptivePolicy, StaticTablePolicy,
                                         VLLMAdaptiveVerifyPolicy)
from wts_jax.tabletune.controller import TableTuneController
from wts_jax.tabletune.cost_table import CostTable
from wts_jax.result_files import pyplot, save_figure
from wts_jax.tabletune.simulate import replay
from wts_jax.tabletune.traces import Phase, Trace, make_trace, regime_profile

SCHEMA = "wts_jax.tabletune.evaluation/1"
TABLETUNE = "tabletune"
BASELINES = ("static_table", "sglang_adaptive", "vllm_adaptive_verify",
             "specdecpp_confidence_stop", "adaedl_entropy_stop")
METHOD_DESCRIPTIONS = {
    "fixed_k<K>": "always draft K (the best K in hindsight is the reference)",
    "static_table": "K*(B_active) from a table built for the profiled regime's acceptance",
    "static_table_fresh": "stale-table traces only: the table built for the running regime",
    "tabletune": "TableTune controller: censored online acceptance (per row), "
                 "Page-Hinkley drift reset, hysteresis, K from the cost table",
    "tabletune_confidence": "the controller with the confidence head's calibrated "
                            "soft evidence for unverified positions",
    "sglang_adaptive": "EMA of accept length picks among step-count tiers",
    "vllm_adaptive_verify": "slots by survival probability admitted up to the token budget "
                            "maximising the profiled cost model's tokens/s",
    "specdecpp_confidence_stop": "stop when 1 - sigma(confidence) passes a threshold",
    "adaedl_entropy_stop": "stop when 1 - sqrt(gamma * entropy) falls below a threshold",
    "autoregressive": "reference: K = 0, one target token per row per iteration",
    "vllm_adaptive_verify_ragged": "reference, not our loop: the vLLM-style policy charged "
                                   "as if verification cost followed the admitted tokens",
}
SPECDEC_THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ADAEDL_THRESHOLDS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


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


def methods_for(trace: Trace, policy_costs: CostTable, tuned: dict[str, float],
                controller_options: dict[str, Any] | None = None) -> dict[str, Any]:
  k = trace.max_draft_len
  batch = trace.active.shape[1]
  prior = regime_profile(trace.profiled_regime, k)
  options = dict(controller_options or {})
  methods: dict[str, Any] = {f"fixed_k{d}": FixedDraftLength(d) for d in range(1, k + 1)}
  methods["static_table"] = StaticTablePolicy.build(policy_costs, prior, batch)
  if trace.stale:
    running = np.mean([regime_profile(r, k) for r in trace.running_regimes], axis=0)
    methods["static_table_fresh"] = StaticTablePolicy.build(policy_costs, running, batch)
  methods[TABLETUNE] = TableTuneController.from_table(policy_costs, prior, **options)
  methods["tabletune_confidence"] = TableTuneController.from_table(
      policy_costs, prior, **{"confidence_bins": 8, **options})
  methods["sglang_adaptive"] = SGLangAdaptivePolicy.for_block(k)
  methods["vllm_adaptive_verify"] = VLLMAdaptiveVerifyPolicy.from_table(policy_costs)
  methods["specdecpp_confidence_stop"] = ConfidenceStopPolicy(k, tuned["specdecpp_threshold"])
  methods["adaedl_entropy_stop"] = EntropyStopPolicy(k, tuned["adaedl_threshold"])
  return methods


def autoregressive_rate(trace: Trace, true_costs: CostTable) -> float:
  rows = trace.active.sum(1)
  busy = rows > 0
  return float(rows.sum() / true_costs.cost(rows[busy], 0).sum())


def evaluate_trace(trace: Trace, true_costs: CostTable, policy_costs: CostTable,
                   tuned: dict[str, float], controller_options=None) -> dict[str, Any]:
  runs = {name: replay(policy, trace, true_costs)
          for name, policy in methods_for(trace, policy_costs, tuned,
                                          controller_options).items()}
  rates = {name: run["tokens_per_s"] for name, run in runs.items()}
  rates["autoregressive"] = autoregressive_rate(trace, true_costs)
  rates["vllm_adaptive_verify_ragged"] = replay(
      VLLMAdaptiveVerifyPolicy.from_table(policy_costs), trace, true_costs,
      ragged_verify=True)["tokens_per_s"]
  fixed = {name: rate for name, rate in rates.items() if name.startswith("fixed_k")}
  best_fixed = max(fixed, key=fixed.get)
  result = {
      "name": trace.name, "description": trace.description, "stale": trace.stale,
      "profiled_regime": trace.profiled_regime, "running_regimes": list(trace.running_regimes),
      "iterations": int(trace.active.shape[0]), "batch_slots": int(trace.active.shape[1]),
      "mean_active_rows": float(trace.active.sum(1).mean()),
      "best_fixed": best_fixed,
      "tokens_per_s": rates,
      "ratio_to_best_fixed": {name: rate / fixed[best_fixed] for name, rate in rates.items()},
      "draft_len_histogram": {
          name: np.bincount(run["draft_len"], minlength=trace.max_draft_len + 1).tolist()
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
                                if name in (TABLETUNE, "tabletune_confidence") + BASELINES
                                and name != "static_table"}
  return result


def summarize(trace_results: list[dict[str, Any]]) -> dict[str, Any]:
  competitors = (TABLETUNE, "tabletune_confidence") + BASELINES
  ratios = {m: [t["ratio_to_best_fixed"][m] for t in trace_results] for m in competitors}
  summary = {m: {"mean_ratio_to_best_fixed": float(np.mean(r)),
                 "min_ratio_to_best_fixed": float(np.min(r))} for m, r in ratios.items()}
  stale = [t["stale_recovery"][TABLETUNE] for t in trace_results
           if t.get("stale_recovery", {}).get(TABLETUNE) is not None]
  best_baseline = max(BASELINES, key=lambda m: summary[m]["mean_ratio_to_best_fixed"])
  mine = summary[TABLETUNE]
  targets = {
      "min_ratio_to_best_fixed": mine["min_ratio_to_best_fixed"],
      "ratio_target_94": mine["min_ratio_to_best_fixed"] >= 0.94,
      "ratio_aim_97": mine["min_ratio_to_best_fixed"] >= 0.97,
      "best_baseline_by_mean": best_baseline,
      "ahead_of_every_baseline_on_mean": all(
          mine["mean_ratio_to_best_fixed"] > summary[m]["mean_ratio_to_best_fixed"]
          for m in BASELINES),
      "min_stale_recovery": float(min(stale)) if stale else None,
      "stale_recovery_target_96": bool(stale) and min(stale) >= 0.96,
  }
  return {"methods": summary, "targets": targets}


def evaluate(traces: list[Trace], true_costs: CostTable, policy_costs: CostTable, *,
             calibration: Trace | None = None, tuned: dict[str, float] | None = None,
             controller_options=None, labels: dict[str, Any] | None = None) -> dict[str, Any]:
  """The whole evaluation as a JSON-ready dict (``labels`` are copied in verbatim).

  The stopping rules' thresholds are ``tuned`` if given, else tuned on ``calibration``.
  """
  if tuned is None:
    if calibration is None:
      raise ValueError("evaluate needs calibration= (a Trace) or tuned= (thresholds)")
    tuned = tune_stop_thresholds(true_costs, calibration)
  trace_results = [evaluate_trace(trace, true_costs, policy_costs, tuned, controller_options)
                   for trace in traces]
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
  methods = (TABLETUNE, "tabletune_confidence") + BASELINES
  fig, axes = plt.subplots(2, 1, figsize=(13, 9))
  width = 0.8 / len(methods)
  x = np.arange(len(traces))
  for i, method in enumerate(methods):
    axes[0].bar(x + i * width, [t["ratio_to_best_fixed"][method] for t in traces], width,
                label=method)
  axes[0].axhline(1.0, color="k", lw=0.8)
  axes[0].axhline(0.94, color="r", lw=0.8, ls="--", label="94 % target")
  axes[0].set_xticks(x + 0.4, [t["name"] for t in traces], rotation=15, fontsize=7)
  axes[0].set_ylim(0.5, 1.1)
  axes[0].set_ylabel("tokens/s / best fixed K")
  axes[0].legend(fontsize=7, ncol=4)
  shift = next((t for t in traces if "shift" in t["name"]), traces[0])
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
