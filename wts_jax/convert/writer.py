"""Writing a converted directory's items (orbax checkpoints) and its manifest.

Where they are written — a staging directory swapped in at the end — is ``staging.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from wts_jax.convert.manifest import nest


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
