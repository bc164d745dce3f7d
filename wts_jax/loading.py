"""Loading converted drafters: ``load`` (the head), ``load_drafter`` (head + backbone),
and ``from_torch_state_dict`` (tensors already in memory).

The head is built without initialising any weights: ``nnx.eval_shape`` gives the
module's abstract parameters, the arrays are restored (or converted) into them, and
``nnx.merge`` assembles the module — a 14B head is never allocated twice on the device.
Restored arrays pass through host memory one at a time, where the stored bytes are
checked against the manifest (shape, dtype, CRC-32) before they are cast and placed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from wts_jax.convert.drafter_config import DrafterConfig, canonical_dtype
from wts_jax.convert.errors import CheckpointError, ConversionError
from wts_jax.convert.formats import NUMPY_DTYPES, state_dict_source
from wts_jax.convert.manifest import (HEAD_ITEM, MANIFEST_FILE, array_checksum, flatten,
                                      is_backbone_item, nest, read_manifest)
from wts_jax.convert.orbax_errors import innermost_reason, quiet_abandoned_coroutines
from wts_jax.convert.plan import plan_conversion
from wts_jax.heads.config import HeadConfig
from wts_jax.heads.draft_head import DraftHead


@dataclasses.dataclass(frozen=True)
class DrafterWeights:
  """Everything ``wts-convert --full`` wrote.

  config: the drafter's config (sizes, target_layer_ids, head flags);
  head: the ``DraftHead`` for ``wts_jax.walk``, or None for a DFlash drafter
  (markov_rank 0);
  backbone: the backbone's arrays by DeepSpec key (``"layers.0.self_attn.q_proj.weight"``,
  PyTorch layout ``[out, in]``), or None when converted without ``--full``. A DFlash
  drafter's confidence head, which has no serial head to join, is here too.
  """

  config: DrafterConfig
  head: DraftHead | None
  backbone: dict[str, jax.Array] | None


def _abstract_head(config: HeadConfig, dtype) -> tuple[Any, Any, dict]:
  """(graphdef, abstract state, {DeepSpec key: ShapeDtypeStruct}) without any weights."""
  abstract = nnx.eval_shape(lambda: DraftHead(config, rngs=nnx.Rngs(0), param_dtype=dtype))
  graphdef, state = nnx.split(abstract)
  return graphdef, state, flatten(nnx.to_pure_dict(state))


def _assemble_head(graphdef, state, arrays: dict[str, jax.Array]) -> DraftHead:
  nnx.replace_by_pure_dict(state, nest(arrays))
  return nnx.merge(graphdef, state)


def _head_config(manifest: dict, directory: Path) -> HeadConfig:
  try:
    return HeadConfig(**manifest["head"])
  except (TypeError, ValueError) as err:
    raise CheckpointError(f"{directory / MANIFEST_FILE}: head {manifest['head']} is not a "
                          f"head config ({err}); the manifest was edited or damaged") from None


def _check_head_keys(config: HeadConfig, expected: dict[str, Any], stored: dict[str, list],
                     directory: Path) -> None:
  """The manifest's head config against the tensors it lists, in the manifest's order
  (W1 first: an edited rank or vocabulary shows there, not in a later tensor)."""
  manifest = directory / MANIFEST_FILE
  for key, shape in stored.items():
    if key not in expected:
      raise CheckpointError(f"{manifest}: lists {key!r} under {HEAD_ITEM}/, which the head "
                            f"config ({_describe(config)}) does not have")
    if tuple(shape) != tuple(expected[key].shape):
      raise CheckpointError(
          f"{manifest}: the head config ({_describe(config)}) requires {key!r} of shape "
          f"{list(expected[key].shape)}, but {HEAD_ITEM}/ holds {list(shape)}; the manifest "
          "was edited or damaged")
  for key in expected:
    if key not in stored:
      raise CheckpointError(f"{manifest}: {HEAD_ITEM}/ lacks {key!r}, which the head "
                            f"config ({_describe(config)}) requires")


def _describe(config: HeadConfig) -> str:
  return (f"{config.head_type}, vocab_size={config.vocab_size}, rank={config.rank}, "
          f"hidden_size={config.hidden_size}")


def _stored_dtype(manifest: dict, directory: Path) -> np.dtype:
  try:
    return NUMPY_DTYPES[canonical_dtype(manifest["dtype"], str(directory / MANIFEST_FILE),
                                        "dtype")]
  except ConversionError as err:
    raise CheckpointError(f"{err}; the manifest was edited or damaged") from None


def _load_dtype(dtype, stored: np.dtype, directory: Path) -> np.dtype:
  if dtype is None:
    return stored
  return NUMPY_DTYPES[canonical_dtype(np.dtype(dtype).name, str(directory), "dtype")]


def _restore(directory: Path, item: str, shapes: dict[str, list], manifest: dict,
             dtype: np.dtype) -> dict[str, jax.Array]:
  """The arrays of one item, checked against the manifest, cast and on the default
  device. Read to host memory first: the stored bytes are checked (shape, dtype, CRC-32,
  finiteness) before anything is cast or placed."""
  import orbax.checkpoint as ocp
  path = directory / item
  if not path.is_dir():
    raise CheckpointError(f"{path}: missing; the converted directory is incomplete")
  stored_dtype = _stored_dtype(manifest, directory)
  restore_args = nest({key: ocp.RestoreArgs(restore_type=np.ndarray) for key in shapes})
  checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler())
  try:
    _check_stored_keys(checkpointer, path, shapes)
    with quiet_abandoned_coroutines():
      restored = flatten(checkpointer.restore(
          path.absolute(), args=ocp.args.PyTreeRestore(restore_args=restore_args)))
  except CheckpointError:
    raise
  except Exception as err:  # noqa: BLE001 - TensorStore raises a bare Exception
    raise CheckpointError(f"{path}: cannot read the orbax checkpoint, a file of it is "
                          f"damaged or missing ({innermost_reason(err)})") from None
  finally:
    checkpointer.close()
  checksums = manifest.get("checksums", {}).get(item, {})
  arrays = {}
  for key, shape in shapes.items():
    array = restored.get(key)
    if not isinstance(array, np.ndarray):
      raise CheckpointError(f"{path}: lacks {key!r}, which {MANIFEST_FILE} lists")
    check_stored_array(path, key, array, tuple(shape), stored_dtype, checksums.get(key))
    arrays[key] = jax.device_put(array.astype(dtype, copy=False))
    del restored[key]   # one host copy at a time
  return arrays


def _metadata_keys(tree, prefix: str = "") -> set[str]:
  keys = set()
  for name, value in tree.items():
    if isinstance(value, Mapping):
      keys |= _metadata_keys(value, f"{prefix}{name}.")
    else:
      keys.add(f"{prefix}{name}")
  return keys


def _check_stored_keys(checkpointer, path: Path, shapes: dict[str, list]) -> None:
  """The item's arrays (from orbax's metadata, without reading any) against the
  manifest, so a missing or extra array is named as such."""
  try:
    metadata = checkpointer.metadata(path.absolute())
  except Exception:  # noqa: BLE001 - the restore that follows reports what is wrong
    return
  tree = getattr(metadata, "item_metadata", metadata)   # orbax >= 0.11: StepMetadata
  tree = getattr(tree, "tree", tree)
  if not isinstance(tree, Mapping):
    return
  stored = _metadata_keys(tree)
  for key in shapes:
    if key not in stored:
      raise CheckpointError(f"{path}: lacks {key!r}, which {MANIFEST_FILE} lists")
  for key in sorted(stored - set(shapes)):
    raise CheckpointError(f"{path}: holds {key!r}, which {MANIFEST_FILE} does not list")


def check_stored_array(path: Path, key: str, array: np.ndarray, shape: tuple[int, ...],
                       dtype: np.dtype, checksum: str | None) -> None:
  """Refuse an array that is not what the converter wrote (it refused non-finite values,
  so NaN/Inf here means the file was damaged since)."""
  if array.shape != shape or array.dtype != dtype:
    raise CheckpointError(
        f"{path}: {key!r} is stored as {list(array.shape)} {array.dtype}, "
        f"{MANIFEST_FILE} says {list(shape)} {dtype}; the directory was edited or damaged")
  if checksum is not None and array_checksum(array) != checksum:
    raise CheckpointError(
        f"{path}: {key!r} does not match its checksum (CRC-32 {array_checksum(array)}, "
        f"written as {checksum}): an array file is damaged (bit flip or overwrite)")
  non_finite = array.size - int(np.count_nonzero(np.isfinite(array)))
  if non_finite:
    raise CheckpointError(
        f"{path}: {key!r} holds {non_finite} non-finite values (NaN/Inf): an array file "
        "is damaged")


def load_drafter(path: str | Path, *, dtype=None) -> DrafterWeights:
  """Load everything a ``wts-convert`` directory holds (see ``DrafterWeights``).

  ``dtype`` casts on restore (e.g. ``jnp.float32``); by default the stored dtype is
  kept. Arrays land on the default device. Raises ``CheckpointError`` for a directory
  that is not a complete, undamaged wts-convert output.
  """
  directory = Path(path)
  manifest = read_manifest(directory)
  dtype = _load_dtype(dtype, _stored_dtype(manifest, directory), directory)
  stored = manifest["tensors"]
  head = None
  if manifest["head"] is not None:
    head = _load_head(directory, manifest, dtype)
  backbone = None
  for item, shapes in stored.items():
    if is_backbone_item(item):
      backbone = {**(backbone or {}), **_restore(directory, item, shapes, manifest, dtype)}
  try:
    config = DrafterConfig.from_json(manifest["drafter"], str(directory / MANIFEST_FILE))
  except ConversionError as err:
    raise CheckpointError(f"{err}; the manifest was edited or damaged") from None
  return DrafterWeights(config, head, backbone)


def _load_head(directory: Path, manifest: dict, dtype: np.dtype) -> DraftHead:
  config = _head_config(manifest, directory)
  graphdef, state, abstract = _abstract_head(config, dtype)
  stored = manifest["tensors"].get(HEAD_ITEM, {})
  _check_head_keys(config, abstract, stored, directory)
  return _assemble_head(graphdef, state,
                        _restore(directory, HEAD_ITEM, stored, manifest, dtype))


def load(path: str | Path, *, dtype=None) -> DraftHead:
  """The ``DraftHead`` (serial head + confidence head) of a ``wts-convert`` directory.

  Pass it straight to ``wts_jax.walk``. Reads only ``head/``, even after ``--full``
  (``load_drafter`` returns the backbone too). A DFlash drafter (markov_rank 0) has no
  serial head: ``load`` raises ``CheckpointError`` pointing to ``load_drafter``.
  ``dtype`` casts on restore; by default the stored dtype (bf16) is kept. Every problem
  with the directory — missing or edited files, a truncated, zeroed or bit-flipped
  array file — raises ``CheckpointError`` with one line naming the file.
  """
  directory = Path(path)
  manifest = read_manifest(directory)
  if manifest["head"] is None:
    raise CheckpointError(
        f"{directory}: markov_rank=0 (a DFlash drafter) has no serial head for "
        "wts_jax.walk; use wts_jax.load_drafter(path) for its backbone")
  dtype = _load_dtype(dtype, _stored_dtype(manifest, directory), directory)
  return _load_head(directory, manifest, dtype)


def from_torch_state_dict(state_dict: Mapping[str, Any], config: Mapping[str, Any], *,
                          dtype=None) -> DraftHead:
  """The ``DraftHead`` from tensors in memory: a DeepSpec drafter's ``state_dict()``.

  ``state_dict`` maps DeepSpec keys (wrapper prefixes ``_orig_mod.``, ``module.``,
  ``model.`` are stripped) to torch tensors, numpy or JAX arrays; ``config`` is the
  drafter's ``config.json`` as a dict (``model.config.to_dict()``). The same strict
  checks as ``wts-convert`` apply: exactly the keys the config implies — the whole
  drafter's, or the head's alone — with the implied shapes and one dtype, kept unless
  ``dtype`` is given. The backbone's tensors are checked, then left out.
  """
  source = state_dict_source(state_dict, dict(config))
  plan = plan_conversion(source, allow_head_only=True)
  head_config = plan.config.head_config
  if head_config is None:
    raise ConversionError(
        "config: markov_rank=0 (a DFlash drafter) has no serial head to build")
  out_dtype = plan.source_dtype if dtype is None else canonical_dtype(
      np.dtype(dtype).name, "from_torch_state_dict", "dtype")
  graphdef, state, _ = _abstract_head(head_config, NUMPY_DTYPES[out_dtype])
  arrays = {tensor.key: jax.device_put(source.read(tensor.key, out_dtype))
            for tensor in plan.head}
  return _assemble_head(graphdef, state, arrays)


__all__ = ["CheckpointError", "DrafterWeights", "from_torch_state_dict", "load",
           "load_drafter"]
