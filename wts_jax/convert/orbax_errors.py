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


def _is_loop_closed(unraisable) -> bool:
  return (isinstance(unraisable.exc_value, RuntimeError)
          and "Event loop is closed" in str(unraisable.exc_value))


def _is_abandoned_coroutine(unraisable) -> bool:
  coroutine_like = type(unraisable.object).__name__ in ("coroutine", "async_generator")
  return coroutine_like or _is_loop_closed(unraisable)


class _LateCallbackFilter:
  """The hook left in place after a failed restore. TensorStore finishes the reads that
  were in flight on its own threads, after the block, and hands each result to the
  closed loop (``call_soon_threadsafe``): ``RuntimeError: Event loop is closed`` reported
  with no object, at a time no ``gc.collect`` can bring forward. It drops those reports
  only, forwards everything else, and stays until the hook is set by someone else (a later
  block keeps it, and a later failed block replaces it rather than stacking another)."""

  def __init__(self, previous):
    self.previous = previous

  def __call__(self, unraisable):
    if not _is_loop_closed(unraisable):
      self.previous(unraisable)


@contextlib.contextmanager
def quiet_abandoned_coroutines():
  """Drop the unraisable-exception reports of coroutines abandoned inside the block.

  Collected before the block ends (``gc.collect``), so their reports fall inside it;
  any other unraisable exception still reaches the previous hook. When the block ends
  in an exception, a filter of the closed loop's late reports stays installed.
  """
  previous = sys.unraisablehook
  forward = previous.previous if isinstance(previous, _LateCallbackFilter) else previous

  def hook(unraisable):
    if not _is_abandoned_coroutine(unraisable):
      forward(unraisable)

  def pending_task_destroyed(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Task was destroyed but it is pending")

  asyncio_logger = logging.getLogger("asyncio")
  sys.unraisablehook = hook
  asyncio_logger.addFilter(pending_task_destroyed)
  failed = False
  try:
    yield
  except BaseException:
    failed = True
    raise
  finally:
    gc.collect()
    sys.unraisablehook = _LateCallbackFilter(forward) if failed else previous
    asyncio_logger.removeFilter(pending_task_destroyed)
