"""wts-convert stopped part-way: Ctrl-C, SIGTERM, ``kill -9``, a ``--force`` swap cut short.

Each case checks what the converter's refusal tests check — the exit status, one
message line, no traceback — and that nothing is left behind: no hidden staging or swap
directory, and ``DST`` holds either the old or the new output, never neither.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from convert_fixtures import drafter_config, drafter_state_dict, write_checkpoint  # noqa: E402
from wts_jax.convert import staging  # noqa: E402
from wts_jax.convert.cli import main  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS_DIR = Path(__file__).resolve().parent


def run_cli(*args) -> int:
  return main([str(arg) for arg in args] + ["--no-progress"])


def leftovers(directory: Path) -> list[str]:
  return sorted(path.name for path in directory.iterdir() if "wts-convert" in path.name)


def stored_dtype(dst: Path) -> str:
  return json.loads((dst / "wts_config.json").read_text())["dtype"]


def dead_pid() -> int:
  process = subprocess.Popen(["true"])
  process.wait()
  return process.pid


@pytest.fixture
def src(tmp_path):
  config = drafter_config("vanilla")
  return write_checkpoint(tmp_path / "src", config, drafter_state_dict(config))


# A conversion in a child process that stops at a chosen point until a signal comes.
# "manifest": after every item is staged, before the manifest (a signal raises at once);
# "save": inside an orbax save, where a signal is held until the save has finished.
CHILD = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    if os.environ.get("IGNORE_SIGHUP"):   # as nohup starts it
      signal.signal(signal.SIGHUP, signal.SIG_IGN)
    from wts_jax.convert import converter
    marker, where = pathlib.Path(sys.argv[1]), sys.argv[2]
    real_save, real_write_json = converter.save_arrays, converter.write_json

    def save_arrays(directory, arrays):
      if where == "save":
        marker.touch()
        time.sleep(3)
      real_save(directory, arrays)

    def write_json(path, content):
      if where == "manifest":
        marker.touch()
        time.sleep(120)
      real_write_json(path, content)

    converter.save_arrays, converter.write_json = save_arrays, write_json
    from wts_jax.convert.cli import main
    sys.exit(main(sys.argv[3:] + ["--no-progress"]))
""")


def start_child(tmp_path, where: str, *args, **env_changes) -> tuple[subprocess.Popen, Path]:
  marker = tmp_path / f"reached-{where}"
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                      os.environ.get("PYTHONPATH")])),
             **env_changes)
  child = subprocess.Popen([sys.executable, "-c", CHILD, str(marker), where,
                            *map(str, args)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 120
  while not marker.exists():
    if child.poll() is not None or time.monotonic() > deadline:
      child.kill()
      pytest.fail(f"the child never reached {where}: {child.communicate()}")
    time.sleep(0.05)
  return child, marker


@pytest.mark.parametrize("signum,where", [(signal.SIGTERM, "manifest"),
                                          (signal.SIGINT, "manifest"),
                                          (signal.SIGTERM, "save"),
                                          (signal.SIGINT, "save")])
def test_signal_removes_the_staging_directory(tmp_path, src, signum, where):
  dst = tmp_path / "dst"
  child, _ = start_child(tmp_path, where, src, dst, "--full")
  assert leftovers(tmp_path), "the child should be writing its staging directory"
  sent = time.monotonic()
  child.send_signal(signum)
  stdout, stderr = child.communicate(timeout=120)
  if where == "save":   # held until the save (which first sleeps 3 s) had finished
    assert time.monotonic() - sent > 2
  assert child.returncode == 128 + signum, stderr
  assert stderr == (f"wts-convert: interrupted ({signal.Signals(signum).name}); nothing "
                    "was written\n"), stderr
  assert not dst.exists()
  assert leftovers(tmp_path) == []


@pytest.mark.parametrize("signum,where", [(signal.SIGHUP, "manifest"),
                                          (signal.SIGHUP, "save"),
                                          (signal.SIGQUIT, "manifest"),
                                          (signal.SIGUSR1, "save"),
                                          (signal.SIGALRM, "manifest"),
                                          (signal.SIGRTMIN + 3, "manifest")],
                         ids=["SIGHUP-manifest", "SIGHUP-save", "SIGQUIT-manifest",
                              "SIGUSR1-save", "SIGALRM-manifest", "SIGRTMIN+3-manifest"])
def test_every_catchable_signal_removes_the_staging_directory(tmp_path, src, signum, where):
  """A closed terminal (SIGHUP) and every other signal that would end the process clean
  up as Ctrl-C does."""
  dst = tmp_path / "dst"
  child, _ = start_child(tmp_path, where, src, dst, "--full")
  child.send_signal(signum)
  stdout, stderr = child.communicate(timeout=120)
  name = staging_signal_name(signum)
  assert child.returncode == 128 + signum, stderr
  assert stderr == f"wts-convert: interrupted ({name}); nothing was written\n", stderr
  assert not dst.exists() and leftovers(tmp_path) == []


def staging_signal_name(signum: int) -> str:
  from wts_jax.convert.interrupts import signal_name
  return signal_name(signum)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_cannot_cut_the_write_or_the_clean_up_short(tmp_path, src, second):
  """Two signals 0.2 s apart inside an orbax save: the first is held until the save has
  finished, the second is ignored — acting on it would remove the staging directory
  while orbax's writer threads still write into it (what left 117–803 MB staging
  folders and an orbax traceback). Nothing is left, no traceback."""
  dst = tmp_path / "dst"
  child, _ = start_child(tmp_path, "save", src, dst, "--full")
  sent = time.monotonic()
  child.send_signal(signal.SIGTERM)
  time.sleep(0.2)
  child.send_signal(second)
  stdout, stderr = child.communicate(timeout=120)
  assert time.monotonic() - sent > 2   # the save (which first sleeps 3 s) was let finish
  assert child.returncode == 128 + signal.SIGTERM, stderr
  assert stderr == "wts-convert: interrupted (SIGTERM); nothing was written\n", stderr
  assert not dst.exists() and leftovers(tmp_path) == []


def test_a_signal_during_the_clean_up_lets_it_finish(tmp_path, src, monkeypatch, capsys):
  """SIGTERM stops the conversion; another SIGTERM lands inside the clean-up's removal:
  the removal finishes and the exit reports the first."""
  from wts_jax.convert import converter
  dst = tmp_path / "dst"
  real_rmtree = staging.shutil.rmtree
  removals = []

  def rmtree_signalled(path, *args, **kwargs):
    removals.append(path)
    os.kill(os.getpid(), signal.SIGTERM)
    real_rmtree(path, *args, **kwargs)

  def write_json_then_stop(path, content):
    os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(converter, "write_json", write_json_then_stop)
  monkeypatch.setattr(staging.shutil, "rmtree", rmtree_signalled)
  assert run_cli(src, dst, "--full") == 128 + signal.SIGTERM
  assert capsys.readouterr().err == ("wts-convert: interrupted (SIGTERM); nothing was "
                                     "written\n")
  assert removals and not dst.exists() and leftovers(tmp_path) == []


def test_an_ignored_sighup_stays_ignored(tmp_path, src):
  """Under nohup SIGHUP is ignored, and the conversion must not take that back."""
  dst = tmp_path / "dst"
  child, _ = start_child(tmp_path, "save", src, dst, IGNORE_SIGHUP="1")
  child.send_signal(signal.SIGHUP)
  stdout, stderr = child.communicate(timeout=120)
  assert child.returncode == 0, stderr
  assert stored_dtype(dst) == "bfloat16" and leftovers(tmp_path) == []


def test_kill_9_leftovers_are_removed_by_the_next_run(tmp_path, src):
  dst = tmp_path / "dst"
  child, _ = start_child(tmp_path, "manifest", src, dst)
  child.kill()
  child.wait()
  left = leftovers(tmp_path)
  assert left == [staging.staging_name(dst, child.pid)]

  assert run_cli(src, dst) == 0
  assert leftovers(tmp_path) == []
  assert stored_dtype(dst) == "bfloat16"


def test_only_dead_processes_leftovers_are_removed(tmp_path, src):
  """Every dead process's staging in the destination's folder, whatever output it was
  for; never a live one's, nor another host's."""
  dst = tmp_path / "dst"
  dead = tmp_path / staging.staging_name(dst, dead_pid())
  legacy = tmp_path / f".dst.wts-convert-{dead_pid()}"   # named before hosts were recorded
  other_host = tmp_path / f".dst.wts-convert-{dead_pid()}@another-host"
  other_dst = tmp_path / staging.staging_name(tmp_path / "dst2", dead_pid())
  sleeper = subprocess.Popen(["sleep", "60"])
  try:
    live = tmp_path / staging.staging_name(dst, sleeper.pid)
    for directory in (dead, legacy, other_host, other_dst, live):
      (directory / "head").mkdir(parents=True)
      (directory / "head" / "data").write_bytes(b"x" * 100)
    assert run_cli(src, dst) == 0
    # A dead process's staging for another output in the same folder goes too.
    assert leftovers(tmp_path) == sorted([other_host.name, live.name])
  finally:
    sleeper.kill()
    sleeper.wait()


def test_force_swap_interrupted_keeps_the_new_output(tmp_path, src, monkeypatch, capsys):
  """A signal during the swap waits for it: DST is whole, and nothing is left over."""
  dst = tmp_path / "dst"
  assert run_cli(src, dst) == 0
  real_exchange = staging.exchange_paths

  def exchange_then_signal(first, second):
    swapped = real_exchange(first, second)
    os.kill(os.getpid(), signal.SIGTERM)
    return swapped

  monkeypatch.setattr(staging, "exchange_paths", exchange_then_signal)
  assert run_cli(src, dst, "--dtype", "float32", "--force") == 128 + signal.SIGTERM
  assert capsys.readouterr().err == f"wts-convert: interrupted (SIGTERM); after writing {dst}\n"
  assert stored_dtype(dst) == "float32"
  assert leftovers(tmp_path) == []


def test_force_swap_without_exchange(tmp_path, src, monkeypatch):
  """Where the filesystem cannot exchange two paths, the swap is two renames."""
  dst = tmp_path / "dst"
  assert run_cli(src, dst) == 0
  monkeypatch.setattr(staging, "exchange_paths", lambda first, second: False)
  assert run_cli(src, dst, "--dtype", "float32", "--force") == 0
  assert stored_dtype(dst) == "float32"
  assert leftovers(tmp_path) == []


def test_swap_killed_between_its_renames_is_undone_by_the_next_run(tmp_path, src):
  dst = tmp_path / "dst"
  assert run_cli(src, dst) == 0
  pid = dead_pid()
  # What `kill -9` between the fallback swap's two renames leaves: the old output under
  # the swap name, the new one still staged, and no DST.
  os.rename(dst, tmp_path / staging.staging_name(dst, pid, old=True))
  (tmp_path / staging.staging_name(dst, pid)).mkdir()

  notes = staging.remove_dead_leftovers(dst)
  assert len(notes) == 2 and any(note.startswith("restored") for note in notes), notes
  assert stored_dtype(dst) == "bfloat16"
  assert leftovers(tmp_path) == []
