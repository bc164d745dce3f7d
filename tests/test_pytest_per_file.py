"""tools/pytest_per_file.py: a selection run one file per process; a failing file, or
one whose process aborts, fails the run and the other files still run."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import pytest_per_file  # noqa: E402


def _write(directory: Path, files: dict[str, str]) -> None:
  for name, body in files.items():
    (directory / name).write_text(body)


def test_every_file_runs_in_its_own_process(tmp_path, monkeypatch, capsys):
  _write(tmp_path, {
      "test_a.py": "import os\ndef test_a():\n  assert os.getpid()\n",
      "test_b.py": "def test_b():\n  assert False\n",
      "test_c.py": "import os\ndef test_c():\n  os.abort()\n",
      "test_d.py": "def test_d():\n  pass\n",
  })
  monkeypatch.chdir(tmp_path)
  args = ["-q", "-p", "no:cacheprovider"]
  assert pytest_per_file.selected_files(args) == ["test_a.py", "test_b.py", "test_c.py",
                                                  "test_d.py"]
  assert pytest_per_file.main(args) == 1
  summary = capsys.readouterr().out.split("== one process a file", 1)[1].splitlines()
  status = {line.split()[-1]: line.split()[0] for line in summary if line.strip()}
  assert status == {"test_a.py": "passed", "test_b.py": "FAILED", "test_c.py": "FAILED",
                    "test_d.py": "passed"}


def test_a_selection_that_passes_is_status_0(tmp_path, monkeypatch):
  _write(tmp_path, {"test_a.py": "def test_a():\n  pass\n",
                    "test_b.py": "def test_b():\n  assert False\n"})
  monkeypatch.chdir(tmp_path)
  assert pytest_per_file.main(["-q", "-p", "no:cacheprovider", "-k", "test_a"]) == 0
  assert pytest_per_file.main(["-q", "-p", "no:cacheprovider", "-k", "nothing"]) == 5
