"""The one exception the converter and the loader raise for a checkpoint they refuse."""

from __future__ import annotations


class ConversionError(ValueError):
  """A checkpoint (or a converted directory) that cannot be read as asked.

  The message names the offending key, file or config value, and says what was
  expected; the CLI prints it and exits with status 2. Nothing is left at the
  destination when a conversion raises it.
  """
