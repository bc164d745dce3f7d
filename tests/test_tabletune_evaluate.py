"""The evaluation harness (tiny traces) and the wts-tabletune command line."""

import json

import numpy as np
import pytest

from wts_jax.tabletune import cli
from wts_jax.tabletune.cost_model import modelled_cost_fn
from wts_jax.tabletune.evaluate import BASELINES, TABLETUNE, evaluate, plot_results
from wts_jax.result_files import write_json
from wts_jax.tabletune.profile import profile_costs
from wts_jax.tabletune.traces import standard_traces

K = 7


@pytest.fixture(scope="module")
def results():
  costs = profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="NVIDIA H200 (modelled)",
                        target="qwen3-8b", drafter="dspark", max_draft_len=K,
                        batches=(1, 16, 64), source="modelled")
  traces = [t for t in standard_traces(batch=64, max_draft_len=K, iterations=60, seed=1)
            if t.name.startswith(("stale_chat_table_hard", "stale_costs_drafting_dear"))]
  return evaluate(traces, costs, costs.with_noise(0.03, 2),
                  tuned={"specdecpp_threshold": 0.7, "adaedl_threshold": 0.3})


def test_results_schema(results, tmp_path):
  assert results["device_kind"] == "NVIDIA H200 (modelled)"
  assert results["cost_source"] == "modelled" and "simulated" in results["acceptance_source"]
  # K = 0 is a fixed choice like the others.
  methods = {f"fixed_k{k}" for k in range(K + 1)} | {TABLETUNE, *BASELINES}
  for trace in results["traces"]:
    assert methods <= set(trace["tokens_per_s"]) and methods <= set(trace["ratio_to_best_fixed"])
    assert trace["ratio_to_best_fixed"][trace["best_fixed"]] == 1.0
    assert all(v > 0 for v in trace["tokens_per_s"].values())
    assert ("stale_recovery" in trace) == bool(trace["stale"])
  kinds = {t["stale"]: t for t in results["traces"]}
  assert set(kinds) == {"acceptance", "costs"}
  assert kinds["acceptance"]["stale_loss"] > 0
  assert np.isfinite(kinds["acceptance"]["stale_recovery"][TABLETUNE])
  assert kinds["costs"]["cost_error"] == [0.05, 0.0]
  assert TABLETUNE + "_fresh" in kinds["costs"]["tokens_per_s"]
  targets = results["summary"]["targets"]
  assert {"ratio_target_97", "ahead_of_adaptive_baselines_on_mean",
          "within_1pct_of_every_baseline", "stale_recovery_acceptance_target_96",
          "stale_recovery_costs_target_96", "max_shortfall_to_a_baseline"} <= set(targets)
  path = write_json(results, tmp_path / "x_tabletune.json")
  assert json.loads(path.read_text())["schema"] == results["schema"]
  assert plot_results(results, tmp_path / "x.png").stat().st_size > 0


def _exit_code(argv) -> int:
  """``cli.main``'s status, whether it returned it or the parser exited with it."""
  try:
    return cli.main(argv)
  except SystemExit as stop:
    return stop.code


def test_cli_table_and_errors(tmp_path, capsys):
  assert _exit_code(["table", "--regime", "chat", "--batches", "1,64",
                   "--out", str(tmp_path / "t.json")]) == 0
  assert "chat" in json.loads((tmp_path / "t.json").read_text())["tables"]
  assert _exit_code(["profile", "--max-draft-len", "3", "--batches", "1,8",
                   "--out", str(tmp_path / "c.json")]) == 0
  assert _exit_code(["table", "--costs", str(tmp_path / "c.json"), "--acceptance", "0.8,0.9"]) == 0
  capsys.readouterr()
  assert _exit_code(["table", "--costs", str(tmp_path / "missing.json")]) == 2
  assert "error: --costs=" in capsys.readouterr().err
  assert _exit_code(["table", "--acceptance", "1.5"]) == 2
  assert _exit_code(["profile", "--target", "nope", "--out", str(tmp_path / "x.json")]) == 2
  assert not (tmp_path / "x.json").exists()
  assert _exit_code(["evaluate", "--trace", "nope", "--iterations", "6"]) == 2
  capsys.readouterr()
  # An argument error is one line with a pointer to --help, not usage lines.
  assert _exit_code(["profile", "--batches", "0,4", "--out", "x"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "error: argument --batches" in err
  assert err.endswith("(see wts-tabletune profile --help)")


@pytest.mark.parametrize("argv, message", [
    (["table", "--costs", "{list}"], "--costs='{list}' could not be read as a cost table: "
                                     "a cost table is a JSON object, not a list"),
    (["evaluate", "--policy-costs", "{missing}", "--iterations", "6"],
     "--policy-costs='{missing}' could not be read"),
    (["table", "--acceptance", "0.5,0.9,0.1"], "--acceptance='0.5,0.9,0.1' must be"),
    (["profile", "--noise", "-1", "--out", "{dir}/p.json"], "--noise=-1.0 must be"),
    (["evaluate", "--policy-noise", "nan"], "--policy-noise=nan must be"),
    (["profile", "--out", "{file}/p.json"], "--out='{file}/p.json': cannot write a file"),
    (["table", "--out", "{dir}/t.json", "--plot", "{file}/t.png"],
     "--plot='{file}/t.png': cannot write a file"),
])
def test_cli_refuses_before_any_work(argv, message, tmp_path, capsys):
  """One error line naming the value, exit 2, and no output file left (the output paths
  are tried before a profile or an evaluation starts)."""
  (tmp_path / "file").write_text("")
  (tmp_path / "list.json").write_text("[1, 2]")
  names = dict(list=tmp_path / "list.json", missing=tmp_path / "missing.json",
               file=tmp_path / "file", dir=tmp_path)
  argv = [a.format(**names) for a in argv]
  assert _exit_code(argv) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "error: " in err
  assert message.format(**names) in err, err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "list.json"]


def test_cli_plot_that_fails_after_the_work_is_one_error_line(tmp_path, capsys, monkeypatch):
  """The paths were writable when tried, the plot's write fails afterwards (a disk that
  filled meanwhile): one ``error:`` line naming the plot and where the JSON is, exit 2,
  no partial PNG."""
  from wts_jax.tabletune import table as tables

  def disk_full(*_args, **_kwargs):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(tables, "plot_table", disk_full)
  out, plot = tmp_path / "t.json", tmp_path / "t.png"
  assert cli.main(["table", "--regime", "chat", "--batches", "1,64", "--out", str(out),
                   "--plot", str(plot)]) == 2
  err = capsys.readouterr().err.strip()
  assert err == (f"error: --plot={str(plot)!r}: No space left on device; the results are "
                 f"in {out}"), err
  assert out.exists() and not plot.exists()


def test_cli_honours_draft_len_labels(tmp_path, capsys):
  """Issue 54, item 4: a table measured at K = 0, 1, 2, 3, 5, 7 reports K* = 7 where its
  costs are flat in K, and a table whose labels do not match its columns is refused."""
  table = {"schema": "wts_jax.tabletune.cost_table/1", "device_kind": "x", "target": "t",
           "drafter": "d", "batches": [1, 64], "draft_lens": [0, 1, 2, 3, 5, 7],
           "seconds": [[0.010, 0.0101, 0.0102, 0.0103, 0.0105, 0.0107]] * 2}
  path = tmp_path / "labelled.json"
  path.write_text(json.dumps(table))
  assert cli.main(["table", "--costs", str(path), "--acceptance", "0.9",
                   "--batches", "1"]) == 0
  out = capsys.readouterr().out
  assert "draft lengths [0, 1, 2, 3, 5, 7]" in out
  assert out.strip().splitlines()[-1].split() == ["1", "7"]
  path.write_text(json.dumps({**table, "draft_lens": list(range(8))}))
  assert cli.main(["table", "--costs", str(path)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "labels 8 columns" in err
  # The profiler labels what it measured.
  assert cli.main(["profile", "--draft-lens", "0,1,2,3,5,7", "--batches", "1,8",
                   "--out", str(tmp_path / "p.json")]) == 0
  assert json.loads((tmp_path / "p.json").read_text())["draft_lens"] == [0, 1, 2, 3, 5, 7]
  assert cli.main(["profile", "--draft-lens", "0,3", "--max-draft-len", "5",
                   "--out", str(tmp_path / "q.json")]) == 2
  assert "disagree" in capsys.readouterr().err


def test_cli_help_shows_every_default_and_the_targets_spelling(capsys):
  """Issue 54, item 13: every option has help text, defaults are visible, and the
  target is spelt either way."""
  for command in ("profile", "table", "evaluate", "overhead"):
    with pytest.raises(SystemExit):
      cli.main([command, "--help"])
    text = capsys.readouterr().out
    options = [line.split()[0] for line in text.splitlines()
               if line.startswith("  --") and line.split()[0] != "--help"]
    assert options, command
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]  # pylint: disable=protected-access
    for action in sub._actions:  # pylint: disable=protected-access
      assert action.help, (command, action.option_strings)
  with pytest.raises(SystemExit):
    cli.main(["profile", "--help"])
  text = capsys.readouterr().out
  assert "(default: 300.0)" in text and "(default: modelled)" in text
  assert cli.main(["table", "--target", "qwen3_8b", "--regime", "hard",
                   "--batches", "128"]) == 0
  assert "hard" in capsys.readouterr().out


def test_cli_loop_profile_refuses_a_model_larger_than_memory(tmp_path, capsys, monkeypatch):
  """Issue 54, item 13: --cost loop counts the weights before drawing them."""
  pytest.importorskip("wts_jax.specdecode.bench_e2e")
  monkeypatch.setattr(cli, "_free_memory_bytes", lambda jax: 4.0 * 2**30)
  assert cli.main(["profile", "--cost", "loop", "--target", "qwen3-8b",
                   "--out", str(tmp_path / "c.json")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "GiB" in err and "--target tiny" in err
  assert not (tmp_path / "c.json").exists()


def test_cost_stale_traces_sit_where_the_error_changes_the_choice():
  """On a table where drafting and not drafting cross, each cost-stale trace runs at the
  rows and regime where a table 5 % off picks another K than the truth; on a table where
  not drafting wins by far everywhere, no such place exists and the traces keep their
  default rows."""
  from wts_jax.tabletune.cost_table import CostTable
  from wts_jax.tabletune.table import best_draft_len
  from wts_jax.tabletune.traces import profiled_prior, stale_cost_factors, stale_cost_point
  lens = (0, 1, 3, 7)
  crossing = CostTable("x", "t", "d", (1, 64, 128), lens,
                       tuple(tuple(0.01 + 1e-3 * (k > 0) + 1e-4 * k * b for k in lens)
                             for b in (1, 64, 128)), {"source": "test"})
  for error in (0.05, -0.05):
    regime, rows, loss = stale_cost_point(crossing, (error, 0.0), 128)
    stale = crossing.scaled(stale_cost_factors(lens, (error, 0.0)), "stale")
    profile = profiled_prior(regime, 7)
    assert 0 < loss < 0.05
    assert best_draft_len(stale, profile, rows) != best_draft_len(crossing, profile, rows)
    names = [t.name for t in standard_traces(batch=64, max_draft_len=7, iterations=20,
                                             costs=crossing) if t.stale == "costs"]
    assert f"stale_costs_drafting_{'dear' if error > 0 else 'cheap'}_{regime}_b{rows}" in names
  flat = CostTable("x", "t", "d", (1, 128), lens,
                   tuple(tuple(0.01 * (1 + 10 * (k > 0)) for k in lens) for _ in (1, 128)),
                   {"source": "test"})
  assert stale_cost_point(flat, (0.05, 0.0), 128) is None
  names = [t.name for t in standard_traces(batch=64, max_draft_len=7, iterations=20,
                                           costs=flat) if t.stale == "costs"]
  assert names == ["stale_costs_drafting_dear_hard_b72", "stale_costs_drafting_cheap_hard_b120"]
