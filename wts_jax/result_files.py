"""The command-line tools' result files: a JSON or PNG lands whole or not at all (written
to a temporary file in its folder, then renamed into place), and an output path is tried
before the work that fills it, so a run never measures for minutes and then fails to
write."""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from typing import Any, Callable


class OutputPathError(ValueError):
  """An output path no file can be written to; the message names the option and path."""


def check_writable(path: str | os.PathLike | None, option: str) -> None:
  """Raises ``OutputPathError`` unless a file can be written at ``path`` (None: nothing
  asked for). Tried for real — a temporary file created and removed in the folder, the
  folders that do not exist yet created for the try and removed again — since neither
  permission bits (root) nor their absence (read-only mounts, immutable folders) say it."""
  if path is None:
    return
  path = pathlib.Path(path)
  if path.is_dir():
    raise OutputPathError(f"{option}={str(path)!r} is a folder, not a file path")
  created = []
  try:
    folder = path.parent
    missing = []
    while not folder.exists():
      missing.append(folder)
      folder = folder.parent
    for folder in reversed(missing):
      folder.mkdir()
      created.append(folder)
    handle, trial = tempfile.mkstemp(prefix=".write-check-", dir=path.parent)
    os.close(handle)
    os.unlink(trial)
  except OSError as err:
    raise OutputPathError(f"{option}={str(path)!r}: cannot write a file there "
                          f"({err.strerror or err})") from None
  finally:
    for folder in reversed(created):
      try:
        folder.rmdir()
      except OSError:
        pass


def write_failure(option: str, path: str | os.PathLike, err: OSError,
                  results: str | os.PathLike | None = None) -> str:
  """The one line for a result file whose write failed after the work (its path was tried
  before it; the disk can fill meanwhile): the option, the path, the reason, and where
  the results are when they landed in another file."""
  kept = f"; the results are in {results}" if results else ""
  return f"{option}={str(path)!r}: {err.strerror or err}{kept}"


def _write_atomically(path: str | os.PathLike, write: Callable[[str], None]) -> pathlib.Path:
  """``write(temporary_path)`` then a rename onto ``path`` (its folder created); the
  temporary file is removed if anything fails."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                       dir=path.parent)
  os.close(handle)
  try:
    write(temporary)
    os.chmod(temporary, 0o644)   # (mkstemp makes it private; a result file is not)
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.unlink(temporary)
    raise
  return path


def write_json(data: Any, path: str | os.PathLike, *, indent: int = 1) -> pathlib.Path:
  def write(temporary):
    with open(temporary, "w") as out:
      json.dump(data, out, indent=indent)
      out.write("\n")
  return _write_atomically(path, write)


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 110) -> pathlib.Path:
  """Saves a matplotlib figure as PNG and closes it."""
  plt = pyplot()
  try:
    return _write_atomically(path, lambda temporary: fig.savefig(temporary, dpi=dpi,
                                                                  format="png"))
  finally:
    plt.close(fig)
