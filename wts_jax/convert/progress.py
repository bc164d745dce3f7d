"""A progress bar on stderr for the bytes a conversion reads (no dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 30
# Redraw at most this often: a 14B backbone is read in thousands of chunks.
REDRAW_SECONDS = 0.1


def format_bytes(count: float) -> str:
  for unit in ("B", "KB", "MB", "GB"):
    if count < 1000 or unit == "GB":
      return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
    count /= 1000
  raise AssertionError("unreachable")


class Progress:
  """``[#####-----]  42%  1.23 GB / 2.93 GB  layers.3.mlp.up_proj.weight`` on one line.

  Disabled, every method is a no-op (the default when stderr is not a terminal).
  """

  def __init__(self, total_bytes: int, *, enabled: bool, stream: TextIO | None = None):
    self.total_bytes = max(total_bytes, 1)
    self.enabled = enabled
    self.stream = sys.stderr if stream is None else stream
    self.done_bytes = 0
    self.tensor = ""
    self._last_draw = 0.0
    self._drawn = False
    self._line_length = 0

  def start_tensor(self, name: str) -> None:
    self.tensor = name
    self._draw(force=True)

  def advance(self, count: int) -> None:
    self.done_bytes += count
    self._draw(force=self.done_bytes >= self.total_bytes)

  def stage(self, message: str) -> None:
    """A line of its own (e.g. the orbax write, which reports no progress)."""
    if self.enabled:
      self._end_line()
      print(message, file=self.stream, flush=True)

  def finish(self) -> None:
    if self.enabled:
      self._end_line()

  def _end_line(self) -> None:
    if self._drawn:
      self.stream.write("\n")
      self.stream.flush()
      self._drawn = False
      self._line_length = 0

  def _draw(self, force: bool) -> None:
    if not self.enabled:
      return
    now = time.monotonic()
    if not force and now - self._last_draw < REDRAW_SECONDS:
      return
    self._last_draw = now
    fraction = min(self.done_bytes / self.total_bytes, 1.0)
    filled = int(fraction * BAR_WIDTH)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    line = (f"[{bar}] {fraction:4.0%}  {format_bytes(self.done_bytes)} / "
            f"{format_bytes(self.total_bytes)}  {self.tensor}")
    # Pad over the previous line's tail instead of a terminal escape: stderr may be a log.
    self.stream.write("\r" + line.ljust(self._line_length))
    self._line_length = len(line)
    self.stream.flush()
    self._drawn = True
