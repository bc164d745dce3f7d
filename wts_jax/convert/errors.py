"""The exceptions the converter and the loader raise for a checkpoint they refuse."""

from __future__ import annotations


class ConversionError(ValueError):
  """A checkpoint (or a converted directory) that cannot be read as asked.

  The message names the offending key, file or config value, and says what was
  expected; the CLI prints it and exits with status 2. Nothing is left at the
  destination when a conversion raises it.
  """


class CheckpointError(ConversionError):
  """A converted directory that ``wts_jax.load`` cannot load: incomplete, edited, or
  with a damaged (truncated, zeroed, bit-flipped) array file.

  The one-line message names the file (the manifest, or the item's orbax checkpoint and
  the tensor's key) and what is wrong with it.
  """
