"""Writing a converted directory atomically: stage next to DST, rename at the end.

Everything is written into a hidden sibling of ``DST`` (same filesystem, so the final
``rename`` is atomic); on any error, or Ctrl-C, the staging directory is removed and
``DST`` is untouched. An existing ``DST`` is replaced only with ``force``, and only when
it is an earlier wts-convert output or an empty directory — ``--force`` never deletes a
directory the converter did not write.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from wts_jax.convert.errors import ConversionError
from wts_jax.convert.manifest import MANIFEST_FILE, nest


def _replaceable(dst: Path) -> bool:
  return dst.is_dir() and not dst.is_symlink() and (
      (dst / MANIFEST_FILE).is_file() or not any(dst.iterdir()))


def check_destination(dst: Path, force: bool, sources: list[Path]) -> None:
  """Refuse a DST that exists (without ``force``) or that would overwrite the source."""
  resolved = dst.resolve()
  for source in sources:
    source = source.resolve()
    if resolved == source or resolved in source.parents:
      raise ConversionError(
          f"DST {dst} would overwrite the checkpoint being converted ({source})")
  if dst.exists() or dst.is_symlink():
    if not force:
      raise ConversionError(f"DST {dst} already exists; pass --force to replace it")
    if not _replaceable(dst):
      raise ConversionError(
          f"DST {dst} exists and is not a wts-convert output (no {MANIFEST_FILE}) nor an "
          "empty directory; refusing to replace it even with --force")


class StagingDirectory:
  """``with StagingDirectory(dst, force) as staging:`` write under ``staging.path``,
  then ``staging.commit()``; leaving the block without a commit removes everything."""

  def __init__(self, dst: str | Path, *, force: bool):
    self.dst = Path(dst).absolute()
    self.force = force
    self.path = self.dst.parent / f".{self.dst.name}.wts-convert-{os.getpid()}"
    self._created_parents: list[Path] = []
    self._committed = False

  def __enter__(self) -> "StagingDirectory":
    missing = [parent for parent in self.dst.parents if not parent.exists()]
    for parent in reversed(missing):
      parent.mkdir()
      self._created_parents.append(parent)
    if self.path.exists():
      shutil.rmtree(self.path)   # left by a killed run of this same process id
    self.path.mkdir()
    return self

  def commit(self) -> None:
    previous = None
    if self.dst.exists() or self.dst.is_symlink():
      check_destination(self.dst, self.force, [])   # it may have appeared meanwhile
      previous = self.dst.parent / f".{self.dst.name}.wts-convert-old-{os.getpid()}"
      os.rename(self.dst, previous)
    try:
      os.rename(self.path, self.dst)
    except OSError:
      if previous is not None:
        os.rename(previous, self.dst)
      raise
    self._committed = True
    if previous is not None:
      shutil.rmtree(previous, ignore_errors=True)

  def __exit__(self, *exc) -> None:
    if self._committed:
      return
    shutil.rmtree(self.path, ignore_errors=True)
    for parent in reversed(self._created_parents):
      try:
        parent.rmdir()
      except OSError:
        pass


def _numpy_handler_without_copy():
  from orbax.checkpoint import type_handlers
  try:
    return type_handlers.NumpyHandler(deepcopy_host_arrays=False)
  except TypeError:  # pragma: no cover - orbax releases before the option
    return type_handlers.NumpyHandler()


def save_arrays(directory: Path, arrays: dict[str, np.ndarray]) -> None:
  """One synchronous orbax save of ``arrays`` (DeepSpec keys) as a nested tree.

  Orbax deep-copies numpy leaves by default (a guard for asynchronous saves); this save
  is synchronous and the arrays are ours, so that second copy of the item is turned
  off. The result is a standard PyTree checkpoint
  (``ocp.StandardCheckpointer().restore`` reads it).
  """
  import jax
  import orbax.checkpoint as ocp
  from orbax.checkpoint import type_handlers
  registry = type_handlers.create_type_handler_registry(
      (np.ndarray, _numpy_handler_without_copy()),
      (jax.Array, type_handlers.ArrayHandler()))
  checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(
      type_handler_registry=registry))
  directory.parent.mkdir(parents=True, exist_ok=True)
  try:
    checkpointer.save(directory.absolute(), args=ocp.args.PyTreeSave(nest(arrays)))
  finally:
    checkpointer.close()


def write_json(path: Path, content: dict[str, Any]) -> None:
  path.write_text(json.dumps(content, indent=2) + "\n")
