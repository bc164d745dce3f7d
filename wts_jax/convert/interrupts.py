"""Signals during a conversion: clean up, never in the middle of a write, whatever the signal.

The default action of most signals ends the process without running ``finally`` blocks
— SIGTERM, SIGHUP (the terminal closed), SIGQUIT, SIGUSR1, SIGALRM, … — so a conversion
they stopped would leave its staging directory behind; and a signal that lands while
orbax's worker threads are writing lets them go on writing into a directory being
removed, and fail at interpreter shutdown ("cannot schedule new futures").

While ``interrupts_as_exceptions()`` is active, every signal that would end the process
(a terminating signal at its default action, and SIGINT at Python's) raises
``Interrupted`` in the main thread instead — except inside ``deferred_interrupts()`` (an
orbax save, the final swap, the clean-up), where it is held until the block ends. Only
the first signal acts: once one is held or raised, later ones are ignored, so a second
SIGTERM or Ctrl-C cannot cut the write or the clean-up short (a write takes seconds at
most). Signals the caller ignores (``nohup``) or handles itself are left to it.
``kill -9`` cannot be caught: what it leaves is removed by the next conversion in the
same folder (``staging.remove_dead_leftovers``).
"""

from __future__ import annotations

import contextlib
import signal
import threading

# Signals whose default action ends the process, less the uncatchable (SIGKILL, SIGSTOP)
# and the faults a process raises on itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
# SIGSYS, SIGABRT): after those there is nothing sound left to clean up with.
_TERMINATING = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM",
                "SIGVTALRM", "SIGPROF", "SIGXCPU", "SIGXFSZ", "SIGPIPE", "SIGIO", "SIGPWR",
                "SIGSTKFLT")


def terminating_signals() -> tuple[int, ...]:
  """This platform's terminating signals (the named ones and the real-time range)."""
  numbers = {getattr(signal, name) for name in _TERMINATING if hasattr(signal, name)}
  if hasattr(signal, "SIGRTMIN"):
    numbers |= set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
  return tuple(sorted(numbers & set(signal.valid_signals())))


def signal_name(signum: int) -> str:
  try:
    return signal.Signals(signum).name
  except ValueError:   # real-time signals have no name of their own
    return f"SIGRTMIN+{signum - signal.SIGRTMIN}" if hasattr(signal, "SIGRTMIN") else str(signum)


class Interrupted(KeyboardInterrupt):
  """A conversion stopped by signal ``signum``. ``wrote`` is the output directory when
  the signal came during the final swap, which it let finish."""

  def __init__(self, signum: int):
    super().__init__(signal_name(signum))
    self.signum = signum
    self.wrote = None


class _State:
  active = False
  deferring = 0
  pending: int | None = None   # a signal held by deferred_interrupts
  stopping = False             # an Interrupted was raised: later signals are ignored


def _handler(signum, frame) -> None:
  if _State.stopping or _State.pending is not None:
    return   # the first signal is being acted on; a second must not cut that short
  if _State.deferring:
    _State.pending = signum
    return
  _State.stopping = True
  raise Interrupted(signum)


def _ends_the_process(handler) -> bool:
  """Whether ``handler`` (a ``signal.getsignal`` result) lets the signal end the
  process: the default action, or Python's SIGINT handler. None means a handler set
  outside Python, which could not be put back."""
  return handler is signal.SIG_DFL or handler is signal.default_int_handler


@contextlib.contextmanager
def interrupts_as_exceptions():
  """Terminating signals raise ``Interrupted`` (in the main thread; elsewhere, where
  Python cannot install handlers, this does nothing)."""
  if _State.active or threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {}
  for signum in terminating_signals():
    handler = signal.getsignal(signum)
    if _ends_the_process(handler):
      previous[signum] = handler
      signal.signal(signum, _handler)
  _State.active, _State.pending, _State.stopping = True, None, False
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    _State.active, _State.pending, _State.stopping = False, None, False


@contextlib.contextmanager
def deferred_interrupts():
  """Hold a signal that arrives inside the block; raise it when the block ends (unless
  one was raised already: then the block is the clean-up after it)."""
  _State.deferring += 1
  try:
    yield
  finally:
    _State.deferring -= 1
  if not _State.deferring and _State.pending is not None and not _State.stopping:
    signum, _State.pending = _State.pending, None
    _State.stopping = True
    raise Interrupted(signum)
