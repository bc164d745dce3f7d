"""Ctrl-C and SIGTERM during a conversion: clean up, never in the middle of a write.

Python's default SIGTERM ends the process without running ``finally`` blocks, so a
terminated conversion would leave its staging directory behind; and a Ctrl-C that lands
while orbax's worker threads are writing lets them go on writing into a directory being
removed, and fail at interpreter shutdown ("cannot schedule new futures"). While
``interrupts_as_exceptions()`` is active both signals raise ``Interrupted`` in the main
thread — except inside ``deferred_interrupts()`` (an orbax save, the final swap), where
the signal is held until the block ends. A second signal while one is held raises at
once: the user asked twice.
"""

from __future__ import annotations

import contextlib
import signal
import threading

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
  """A conversion stopped by SIGINT or SIGTERM (``signum``). ``wrote`` is the output
  directory when the signal came during the final swap, which it let finish."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum
    self.wrote = None


class _State:
  active = False
  deferring = 0
  pending: int | None = None


def _handler(signum, frame) -> None:
  if _State.deferring and _State.pending is None:
    _State.pending = signum
    return
  _State.pending = None
  raise Interrupted(signum)


@contextlib.contextmanager
def interrupts_as_exceptions():
  """SIGINT and SIGTERM raise ``Interrupted`` (in the main thread; elsewhere, where
  Python cannot install handlers, this does nothing)."""
  if _State.active or threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {signum: signal.getsignal(signum) for signum in HANDLED_SIGNALS}
  for signum in HANDLED_SIGNALS:
    signal.signal(signum, _handler)
  _State.active = True
  try:
    yield
  finally:
    _State.active = False
    _State.pending = None
    for signum, handler in previous.items():
      signal.signal(signum, handler)


@contextlib.contextmanager
def deferred_interrupts():
  """Hold a signal that arrives inside the block; raise it when the block ends."""
  _State.deferring += 1
  try:
    yield
  finally:
    _State.deferring -= 1
  if not _State.deferring and _State.pending is not None:
    signum, _State.pending = _State.pending, None
    raise Interrupted(signum)
