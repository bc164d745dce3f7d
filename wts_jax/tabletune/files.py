"""Writing results: JSON and PNG files land whole or not at all (a temporary file
renamed into place), with their folder created."""

from __future__ import annotations

import json
import pathlib
from typing import Any


def _temporary(path: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  return path, path.with_name(path.name + ".tmp")


def write_json(data: Any, path: str | pathlib.Path) -> pathlib.Path:
  path, tmp = _temporary(path)
  tmp.write_text(json.dumps(data, indent=1) + "\n")
  tmp.replace(path)
  return path


def save_figure(fig: Any, path: str | pathlib.Path, *, dpi: int = 110) -> pathlib.Path:
  """Saves a matplotlib figure as PNG and closes it."""
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  path, tmp = _temporary(path)
  fig.savefig(tmp, dpi=dpi, format="png")
  plt.close(fig)
  tmp.replace(path)
  return path


def pyplot():
  """matplotlib.pyplot on the Agg backend (no display needed)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt
