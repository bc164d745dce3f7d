"""Orbax/TensorStore read failures as one line, without asyncio's shutdown noise.

TensorStore reports a damaged array file as a bare ``Exception`` whose text is the whole
TensorStore spec (about 2 000 characters, naming no file); the file and the reason are
in the exception it was raised from. And when one read of an orbax restore fails, the
reads still in flight are abandoned: their coroutines are collected later, after orbax
has closed its event loop, and each prints ``Exception ignored in <coroutine …>`` /
``RuntimeError: Event loop is closed`` to stderr (and asyncio logs "Task was destroyed
but it is pending!") — noise after an error that already said everything.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys

MAX_REASON_CHARS = 300


def innermost_reason(err: BaseException) -> str:
  """The first line of the deepest exception ``err`` was raised from (or during)."""
  seen = set()
  while id(err) not in seen:
    seen.add(id(err))
    inner = err.__cause__ or err.__context__
    if inner is None:
      break
    err = inner
  text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
  return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 1] + "…"


def _is_abandoned_coroutine(unraisable) -> bool:
  coroutine_like = type(unraisable.object).__name__ in ("coroutine", "async_generator")
  loop_closed = (isinstance(unraisable.exc_value, RuntimeError)
                 and "Event loop is closed" in str(unraisable.exc_value))
  return coroutine_like or loop_closed


@contextlib.contextmanager
def quiet_abandoned_coroutines():
  """Drop the unraisable-exception reports of coroutines abandoned inside the block.

  Collected before the block ends (``gc.collect``), so their reports fall inside it;
  any other unraisable exception still reaches the previous hook.
  """
  previous = sys.unraisablehook

  def hook(unraisable):
    if not _is_abandoned_coroutine(unraisable):
      previous(unraisable)

  def pending_task_destroyed(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Task was destroyed but it is pending")

  asyncio_logger = logging.getLogger("asyncio")
  sys.unraisablehook = hook
  asyncio_logger.addFilter(pending_task_destroyed)
  try:
    yield
  finally:
    gc.collect()
    sys.unraisablehook = previous
    asyncio_logger.removeFilter(pending_task_destroyed)
