"""The README's tables from results JSON (tools/readme_tables.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import readme_tables  # noqa: E402


def test_the_e2e_table_gives_the_gain_from_the_iterations():
  def record(walk, total):
    return dict(model="qwen3_4b", batch=16, walk=walk, total_s=total, verify_s=2e-3,
                drafter_s=5e-4, autoregressive_s=2.5e-3, autoregressive_roofline_s=1.7e-3,
                verify_roofline_s=1.7e-3, drafter_roofline_s=4e-4, walk_s=1e-4,
                modelled_tokens_per_s=1000.0, modelled_speedup_vs_autoregressive=2.5)
  report = dict(results=[record("pallas", 3.0e-3), record("xla", 3.3e-3),
                         record("none", 2.9e-3), dict(model="qwen3_8b", batch=1,
                                                      skipped="time budget")])
  lines = readme_tables.e2e_table(report).splitlines()
  assert len(lines) == 3   # header, rule, the one measured point
  assert "| 3.00 / 3.30 / 2.90 |" in lines[2] and "+10.0 %" in lines[2]
  assert "| 2.50 (1.70) |" in lines[2] and "| 0.100 / 0.100 |" in lines[2]
  assert lines[2].endswith("| 1,000 (2.50×) |")


def test_the_e2e_table_marks_an_autoregressive_step_not_measured():
  record = dict(model="qwen3_4b", batch=4, walk="pallas", total_s=3e-3, verify_s=2e-3,
                drafter_s=5e-4, autoregressive_s=None, autoregressive_roofline_s=1.7e-3,
                walk_s=1e-4, modelled_tokens_per_s=1000.0,
                modelled_speedup_vs_autoregressive=None)
  [row] = readme_tables.e2e_table(dict(results=[record])).splitlines()[2:]
  assert "| – (1.70) |" in row and row.endswith("| 1,000 (–) |")


def test_the_tabletune_table_gives_each_runs_ratios_and_recoveries():
  def methods(mean, low):
    return {m: dict(mean_ratio_to_best_fixed=mean, min_ratio_to_best_fixed=low)
            for m in readme_tables.TABLETUNE_METHODS}
  run = dict(device_kind="NVIDIA H200", target="qwen3-4b", cost_source="measured", seed=2,
             summary=dict(methods=methods(1.0191, 0.9874),
                          targets=dict(min_stale_recovery_acceptance=0.9961,
                                       min_stale_recovery_costs=None)))
  lines = readme_tables.tabletune_table([run]).splitlines()
  assert len(lines) == 3
  assert lines[2].startswith("| NVIDIA H200 qwen3-4b, measured | 2 | **1.019 / 0.987** |")
  assert lines[2].endswith("| 0.996, – |")
