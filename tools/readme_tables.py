"""The README's benchmark tables, built from the committed results JSON.

  python tools/readme_tables.py [--walk bench/results/walk/grid.json]
                                [--e2e bench/results/h200_e2e_qwen3.json ...]

Prints markdown tables: the walk grid (wts-bench: each head's fastest W2 form
against DeepSpec's loop replayed as a CUDA graph, torch-graph, and the vanilla head's
int8-planes walk against the public int8 kernel's measured walks that the same run's
floor check records), the end-to-end decode iteration (wts-e2e-bench), one table per
results file (the H200 run, then the H100 run), and TableTune's evaluation (wts-tabletune
evaluate), a row per results file.
"""

from __future__ import annotations

import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
BATCHES = (1, 4, 16, 64)
W2_NAMES = {"bf16": "bf16", "int8": "int8", "int8p": "int8 planes"}
MODES = {"greedy": "greedy", "sample": "sampled"}


def _median(records, **key) -> float | None:
  for record in records:
    if all(record.get(name) == value for name, value in key.items()):
      return record.get("median_us")
  return None


def walk_table(results: dict) -> str:
  records = [r for r in results["records"] if str(r.get("check", "")).startswith("ok")]
  head = "| head | W2 | mode | " + " | ".join(f"B {b}" for b in BATCHES) + " |"
  lines = [head, "| --- | --- | --- |" + " ---: |" * len(BATCHES)]
  for head_type in ("vanilla", "gated", "rnn"):
    for mode in MODES:
      for w2 in W2_NAMES:
        cells = []
        for batch in BATCHES:
          ours = _median(records, path="wts", head=head_type, w2_dtype=w2, mode=mode,
                         batch=batch)
          torch = _median(records, path="torch-graph", head=head_type, w2_dtype="bf16",
                          mode=mode, batch=batch)
          if ours is None:
            cells.append("—")
          else:
            ratio = f" ({torch / ours:.2f}×)" if torch else ""
            cells.append(f"{ours:.1f}{ratio}")
        if all(cell == "—" for cell in cells):
          continue
        lines.append(f"| {head_type} | {W2_NAMES[w2]} | {MODES[mode]} | "
                     + " | ".join(cells) + " |")
  public = results.get("ceilings", {}).get("public_int8_check", {})
  if public:
    cells = [f"{public[str(b)]['measured_us']:.1f}" if str(b) in public else "—"
             for b in BATCHES]
    lines.append("| public int8 kernel (vanilla) | int8 | greedy | " + " | ".join(cells)
                 + " |")
  return "\n".join(lines)


def e2e_table(report: dict) -> str:
  """The README's table of a run: per model and B, the autoregressive step, the
  iteration and its phases beside their rooflines (ms), the persistent walk's gain over
  the step-wise walk, and modelled tokens/s."""
  rows = [r for r in report["results"] if "total_s" in r]
  by_point: dict[tuple, dict] = {}
  for r in rows:
    by_point.setdefault((r["model"], r["batch"]), {})[r["walk"]] = r
  lines = ["| model | B | autoregressive ms (roofline) | verify ms (roofline) | drafter ms "
           "(roofline) | iteration ms: persistent / step-wise / no walk | walk ms: "
           "persistent / step-wise | persistent over step-wise | modelled tokens/s "
           "(× autoregressive) |",
           "| --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |"]
  def ms(value, digits=2):
    return "–" if value is None else f"{value * 1e3:.{digits}f}"
  for (model, batch), walks in sorted(by_point.items()):
    first = next(iter(walks.values()))
    persistent = walks.get("pallas") or walks.get("auto")
    stepwise = walks.get("xla")
    totals = " / ".join(ms(walks[w]["total_s"]) if w in walks else "–"
                        for w in ("pallas", "xla", "none"))
    walk = " / ".join(ms(walks[w].get("walk_s"), 3) if w in walks else "–"
                         for w in ("pallas", "xla"))
    gain = (f"{100.0 * (stepwise['total_s'] / persistent['total_s'] - 1.0):+.1f} %"
            if persistent and stepwise else "–")
    speedup = persistent and persistent.get("modelled_speedup_vs_autoregressive")
    tokens = (f"{persistent['modelled_tokens_per_s']:,.0f} "
              + (f"({speedup:.2f}×)" if speedup else "(–)") if persistent else "–")
    lines.append(
        f"| {model} | {batch} | {ms(first['autoregressive_s'])} "
        f"({ms(first.get('autoregressive_roofline_s'))}) | {ms(first['verify_s'])} "
        f"({ms(first.get('verify_roofline_s'))}) | {ms(first['drafter_s'])} "
        f"({ms(first.get('drafter_roofline_s'))}) | {totals} | {walk} | {gain} | "
        f"{tokens} |")
  return "\n".join(lines)


TABLETUNE_METHODS = ("tabletune", "static_table", "sglang_adaptive", "vllm_adaptive_verify",
                     "specdecpp_confidence_stop")


def tabletune_table(results: list[dict]) -> str:
  """Per evaluation file: the ratio to the best fixed K (K = 0 included), mean / min
  over the traces, of TableTune and the baselines, and TableTune's lowest stale
  recovery on the acceptance-stale and the cost-stale traces (– where the stale table
  lost nothing)."""
  lines = ["| true costs | seed | TableTune | static table | SGLang | vLLM | SpecDec++ | "
           "stale recovery (acc., costs) |",
           "| --- | --: | --: | --: | --: | --: | --: | --: |"]
  def recovery(value):
    return "–" if value is None else f"{value:.3f}"
  for result in results:
    methods = result["summary"]["methods"]
    cells = []
    for method in TABLETUNE_METHODS:
      cell = (f"{methods[method]['mean_ratio_to_best_fixed']:.3f} / "
              f"{methods[method]['min_ratio_to_best_fixed']:.3f}")
      cells.append(f"**{cell}**" if method == "tabletune" else cell)
    targets = result["summary"]["targets"]
    lines.append(f"| {result['device_kind']} {result['target']}, {result['cost_source']} | "
                 f"{result['seed']} | " + " | ".join(cells) + " | "
                 f"{recovery(targets['min_stale_recovery_acceptance'])}, "
                 f"{recovery(targets['min_stale_recovery_costs'])} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--walk", default=str(ROOT / "bench/results/walk/grid.json"))
  parser.add_argument("--e2e", nargs="+",
                      default=[str(ROOT / f"bench/results/{device}_e2e_qwen3.json")
                               for device in ("h200", "h100")])
  parser.add_argument("--tabletune", nargs="+",
                      default=[str(ROOT / f"bench/results/h200_{model}_tabletune{seed}.json")
                               for model in ("qwen3_4b", "qwen3_8b")
                               for seed in ("", "_seed1", "_seed2")])
  args = parser.parse_args()
  walk = json.loads(pathlib.Path(args.walk).read_text())
  print(f"<!-- walk: {walk['device_kind']}, jax {walk['jax_version']}, "
        f"{walk['timestamp'][:10]} -->")
  print(walk_table(walk))
  print()
  for path in args.e2e:
    e2e = json.loads(pathlib.Path(path).read_text())
    print()
    print(f"<!-- e2e: {e2e['device_kind']}, jax {e2e['jax_version']} -->")
    print(e2e_table(e2e))
  evaluations = [json.loads(pathlib.Path(path).read_text()) for path in args.tabletune]
  print()
  print("<!-- tabletune -->")
  print(tabletune_table(evaluations))


if __name__ == "__main__":
  main()
