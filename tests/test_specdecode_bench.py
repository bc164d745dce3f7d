"""wts-e2e-bench on the CPU at the tiny preset: the JSON, its modelled figures, the plot."""

import json

import pytest

from wts_jax.specdecode import bench_e2e


def test_tiny_run_writes_the_json_and_the_plot(tmp_path):
  out = tmp_path / "e2e.json"
  code = bench_e2e.main(["--models", "tiny", "--batches", "2", "--walks", "none",
                         "--method", "pieces",
                         "--prompt-len", "8", "--draft-len", "3", "--repeats", "1",
                         "--chain", "1", "--dtype", "float32", "--acceptance", "0.5",
                         "--out", str(out)])
  assert code == 0
  report = json.loads(out.read_text())
  assert report["device_kind"] and report["jax_version"] and "MODELLED" in report["modelled_note"]
  rows = {r["walk"]: r for r in report["results"]}
  assert set(rows) == {"none"}
  for row in rows.values():
    for name in ("total_s", "verify_s", "drafter_s", "walk_s", "autoregressive_s"):
      assert row[name] > 0, (name, row)
    # L = 1 + 0.5 + 0.25 + 0.125 under a flat 0.5 profile
    assert row["modelled_tokens_per_iteration"] == pytest.approx(1.875)
    assert row["modelled_tokens_per_s"] == pytest.approx(2 * 1.875 / row["total_s"])
  assert (tmp_path / "e2e.png").stat().st_size > 0
  assert bench_e2e.main(["--replot", str(out), "--plot", str(tmp_path / "again.png")]) == 0
  assert (tmp_path / "again.png").stat().st_size > 0


def test_replot_that_fails_to_write_is_one_error_line(tmp_path, capsys, monkeypatch):
  """A plot whose write fails after its path was tried: one ``error:`` line, exit 2."""
  out = tmp_path / "e2e.json"
  out.write_text(json.dumps({"device_kind": "cpu", "results": []}))
  def disk_full(*_args):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(bench_e2e, "plot", disk_full)
  png = tmp_path / "again.png"
  assert bench_e2e.main(["--replot", str(out), "--plot", str(png)]) == 2
  assert capsys.readouterr().err.strip() == (f"error: --plot={str(png)!r}: No space left "
                                             "on device")


def test_bad_arguments_exit_2(capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench_e2e.main(["--walks", "fast"])
  assert exit_info.value.code == 2 and "'fast'" in capsys.readouterr().err
  assert bench_e2e.main(["--models", "tiny", "--draft-len", "9", "--dtype", "float32",
                         "--out", "/tmp/never.json"]) == 2
  assert "block_size" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--time-budget", "-1"], "--time-budget=-1.0 must be a finite number > 0"),
    (["--out", "{file}/e.json"], "--out='{file}/e.json': cannot write a file there"),
    (["--out", "{dir}/e.json", "--plot", "{file}/e.png"],
     "--plot='{file}/e.png': cannot write a file there"),
    (["--replot", "{list}"], "--replot='{list}' is not a wts-e2e-bench JSON"),
    (["--replot", "{empty}"], "--replot='{empty}' is not a wts-e2e-bench JSON"),
    (["--new-tokens", "1"], "--new-tokens=1 must be >= 2 with --method generate"),
    (["--iterations-per-check", "0"], "--iterations-per-check=0 must be >= 1"),
])
def test_refused_before_measuring(argv, message, tmp_path, capsys):
  """One error line naming the value and exit 2 before any measurement; nothing
  written."""
  (tmp_path / "file").write_text("")
  (tmp_path / "list.json").write_text("[1, 2]")
  (tmp_path / "empty.json").write_text("{}")
  names = dict(file=tmp_path / "file", dir=tmp_path, list=tmp_path / "list.json",
               empty=tmp_path / "empty.json")
  argv = [a.format(**names) for a in argv]
  assert bench_e2e.main(["--models", "tiny", "--dtype", "float32", *argv]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message.format(**names) in err, err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.json", "file", "list.json"]


def test_duplicate_batches_refused(capsys):
  with pytest.raises(SystemExit) as exit_info:
    bench_e2e.main(["--batches", "1,1"])
  assert exit_info.value.code == 2 and "'1,1' names a value more than once" in (
      capsys.readouterr().err)


def test_the_generate_method_reads_phases_from_a_profile(tmp_path, monkeypatch):
  """--method generate on the CPU, the profile's kernels stubbed (a CPU records no GPU
  kernel): the records carry per-iteration phases, the verify and drafter phases'
  costliest kernels, wall-clock rates and the greedy output's agreement with the
  target's own decode (exact in float32)."""
  microseconds = {"verify": [("gemm_a", 5000.0), ("gemm_a", 2000.0), ("norm", 1000.0)],
                  "drafter": [("gemm_b", 2000.0)], "walk": [("walk", 1000.0)],
                  "prefill": [("gemm_a", 5000.0)], "other": [("copy", 1000.0)]}
  kernels = [({"name": name, "dur": dur}, phase)
             for phase, events in microseconds.items() for name, dur in events]
  monkeypatch.setattr(bench_e2e.phase_profile, "attributed_kernels",
                      lambda folder, hlo: kernels)
  # the autoregressive decode of 6 tokens and of 1 (its prefill): 5 steps between them;
  # the step is the difference of the kernels' busy times
  autoregressive = {"_1": ({"gemm_a": (1, 5e-3), "prefill_only": (1, 1e-3)}, 6e-3),
                    "_6": ({"gemm_a": (3, 12e-3), "prefill_only": (1, 1e-3),
                            "norm": (5, 1e-3), "attn": (2, 3e-3)}, 14e-3)}
  monkeypatch.setattr(bench_e2e.phase_profile, "device_time",
                      lambda folder: autoregressive[str(folder)[-2:]])
  out = tmp_path / "e2e.json"
  assert bench_e2e.main(["--models", "tiny", "--batches", "2", "--walks", "xla",
                         "--prompt-len", "8", "--draft-len", "3", "--new-tokens", "6",
                         "--dtype", "float32", "--profile", str(tmp_path / "profile"),
                         "--iterations-per-check", "2", "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  assert report["iterations_per_check"] == 2
  [row] = report["results"]
  iterations = row["generate_iterations"]
  assert row["verify_s"] == pytest.approx(8e-3 / iterations)
  assert row["total_s"] == pytest.approx(12e-3 / iterations)
  assert row["autoregressive_s"] == pytest.approx(8e-3 / 5)
  assert [k["kernel"] for k in row["autoregressive_top_kernels"]][:3] == [
      "gemm_a", "attn", "norm"]
  first, second = row["verify_top_kernels"]
  assert first["kernel"] == "gemm_a" and second["kernel"] == "norm"
  assert first["launches_per_iteration"] == pytest.approx(2 / iterations)
  assert first["seconds_per_iteration"] == pytest.approx(7e-3 / iterations)
  assert [k["kernel"] for k in row["drafter_top_kernels"]] == ["gemm_b"]
  assert row["autoregressive_top_kernels"][0]["launches_per_step"] == pytest.approx(2 / 5)
  assert row["autoregressive_top_kernels"][2]["launches_per_step"] == pytest.approx(1)
  assert row["idle_s"] == 0.0   # the stubbed kernels carry no start times: no gap
  assert row["greedy_agreement_with_autoregressive"] == 1.0
  assert row["generate_tokens"] == 12 and row["generate_tokens_per_s"] > 0
