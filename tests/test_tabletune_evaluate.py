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
            if t.name.startswith("stale_reasoning_table")]
  return evaluate(traces, costs, costs,
                  tuned={"specdecpp_threshold": 0.7, "adaedl_threshold": 0.3})


def test_results_schema(results, tmp_path):
  assert results["device_kind"] == "NVIDIA H200 (modelled)"
  assert results["cost_source"] == "modelled" and "simulated" in results["acceptance_source"]
  methods = {f"fixed_k{k}" for k in range(1, K + 1)} | {TABLETUNE, *BASELINES}
  for trace in results["traces"]:
    assert methods <= set(trace["tokens_per_s"]) and methods <= set(trace["ratio_to_best_fixed"])
    assert trace["ratio_to_best_fixed"][trace["best_fixed"]] == 1.0
    assert all(v > 0 for v in trace["tokens_per_s"].values())
    assert ("stale_recovery" in trace) == trace["stale"]
  stale = [t for t in results["traces"] if t["stale"]]
  recovery = stale[0]["stale_recovery"][TABLETUNE]
  assert stale[0]["stale_loss"] > 0 and np.isfinite(recovery)
  targets = results["summary"]["targets"]
  assert {"ratio_target_94", "ahead_of_every_baseline_on_mean",
          "stale_recovery_target_96"} <= set(targets)
  path = write_json(results, tmp_path / "x_tabletune.json")
  assert json.loads(path.read_text())["schema"] == results["schema"]
  assert plot_results(results, tmp_path / "x.png").stat().st_size > 0


def test_cli_table_and_errors(tmp_path, capsys):
  assert cli.main(["table", "--regime", "chat", "--batches", "1,64",
                   "--out", str(tmp_path / "t.json")]) == 0
  assert "chat" in json.loads((tmp_path / "t.json").read_text())["tables"]
  assert cli.main(["profile", "--max-draft-len", "3", "--batches", "1,8",
                   "--out", str(tmp_path / "c.json")]) == 0
  assert cli.main(["table", "--costs", str(tmp_path / "c.json"), "--acceptance", "0.8,0.9"]) == 0
  capsys.readouterr()
  assert cli.main(["table", "--costs", str(tmp_path / "missing.json")]) == 2
  assert "error: --costs=" in capsys.readouterr().err
  assert cli.main(["table", "--acceptance", "1.5"]) == 2
  assert cli.main(["profile", "--target", "nope", "--out", str(tmp_path / "x.json")]) == 2
  assert not (tmp_path / "x.json").exists()
  assert cli.main(["evaluate", "--trace", "nope", "--iterations", "6"]) == 2
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["profile", "--batches", "0,4", "--out", "x"])
  assert exit_info.value.code == 2


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
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and err.startswith("error: ")
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
