"""What every wts_jax console script shares: one-line argument errors, visible defaults.

- A bad argument is one line on stderr, ``PROG: error: MESSAGE (see PROG --help)``, and
  exit status 2. argparse's own error prints the usage block first (4–8 lines for these
  tools), which buries the line that says what is wrong; the usage is what ``--help``
  is for.
- ``--help`` shows each option's default (``(default: bfloat16)``), also for options
  written without help text.
- Option types that refuse an out-of-range value by naming it and the range
  (``int_in``, ``number_in``), so the bound is checked where the option is read.

Subcommand parsers (``add_subparsers``) are built from the same class, so they behave
alike.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys

EXIT_USAGE = 2


def usage_line(prog: str, message: str) -> str:
  """The one line a bad argument prints."""
  return f"{prog}: error: {message} (see {prog} --help)"


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
  """Descriptions as written (examples keep their lines); every option's help ends with
  its default, unless the help speaks of its default already or there is none worth
  showing (None, False, an empty list)."""

  def _format_action(self, action):
    if action.help is None and _shows_default(action):
      action = copy.copy(action)   # the parser's own action keeps help=None
      action.help = "(default: %(default)s)"
    return super()._format_action(action)

  def _get_help_string(self, action):
    text = action.help or ""
    if _shows_default(action) and "default" not in text:
      text = f"{text} (default: %(default)s)".strip()
    return text


def _shows_default(action) -> bool:
  """An option that takes a value and has a default worth showing (flags, which take
  none, say what they do instead)."""
  default = action.default
  return (bool(action.option_strings) and action.nargs != 0
          and default is not argparse.SUPPRESS and default is not None
          and default is not False and default != [])


class ArgumentParser(argparse.ArgumentParser):
  """``argparse.ArgumentParser`` with one-line errors and visible defaults."""

  def __init__(self, *args, formatter_class=DefaultsHelpFormatter, **kwargs):
    super().__init__(*args, formatter_class=formatter_class, **kwargs)

  def error(self, message: str):
    self.exit(EXIT_USAGE, usage_line(self.prog, message) + "\n")


def int_in(low: int | None = None, high: int | None = None):
  """An argparse type: an integer in ``[low, high]`` (either bound may be open)."""
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if (low is not None and value < low) or (high is not None and value > high):
      raise argparse.ArgumentTypeError(f"{value} must be {_int_range(low, high)}")
    return value
  parse.__name__ = "integer"
  return parse


def number_in(low: float | None = None, high: float | None = None):
  """An argparse type: a finite number in ``[low, high]``."""
  def parse(text: str) -> float:
    try:
      value = float(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or (low is not None and value < low) or (
        high is not None and value > high):
      bound = ("" if low is None and high is None else
               f" and >= {low:g}" if high is None else
               f" and <= {high:g}" if low is None else f" in [{low:g}, {high:g}]")
      raise argparse.ArgumentTypeError(f"{value} must be finite{bound}")
    return value
  parse.__name__ = "number"
  return parse


def _int_range(low: int | None, high: int | None) -> str:
  if low is not None and high is not None:
    return f"an integer in [{low}, {high}]"
  if low is not None:
    return f"an integer >= {low}"
  return f"an integer <= {high}"


def print_error(message: str, prog: str | None = None) -> int:
  """Print an error found after the arguments were parsed (``error: ...`` on one line)
  and return the exit status for it."""
  first_line = str(message).strip().splitlines()[0] if str(message).strip() else "failed"
  print(f"{prog + ': ' if prog else ''}error: {first_line}", file=sys.stderr)
  return EXIT_USAGE
