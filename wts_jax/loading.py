"""Loading converted drafters: ``load`` (the head), ``load_drafter`` (head + backbone),
and ``from_torch_state_dict`` (tensors already in memory).

The head is built without initialising any weights: ``nnx.eval_shape`` gives the
module's abstract parameters, the arrays are restored (or converted) straight into
them, and ``nnx.merge`` assembles the module — a 14B head is never allocated twice.
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
from wts_jax.convert.errors import ConversionError
from wts_jax.convert.formats import NUMPY_DTYPES, state_dict_source
from wts_jax.convert.manifest import (HEAD_ITEM, flatten, is_backbone_item, nest,
                                      read_manifest)
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


def _check_item_keys(expected: dict[str, Any], stored: dict[str, list], item: Path):
  for key, abstract in expected.items():
    if key not in stored:
      raise ConversionError(f"{item}: lacks {key!r}, which the head config requires")
    if tuple(stored[key]) != tuple(abstract.shape):
      raise ConversionError(
          f"{item}: {key!r} has shape {stored[key]}, the head config requires "
          f"{list(abstract.shape)}")
  for key in stored:
    if key not in expected:
      raise ConversionError(f"{item}: holds {key!r}, which the head config does not have")


def _restore(item: Path, targets: dict[str, jax.ShapeDtypeStruct]) -> dict[str, jax.Array]:
  import orbax.checkpoint as ocp
  if not item.is_dir():
    raise ConversionError(f"{item}: missing; the converted directory is incomplete")
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target_tree = nest({key: jax.ShapeDtypeStruct(abstract.shape, abstract.dtype,
                                                sharding=sharding)
                      for key, abstract in targets.items()})
  checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
  try:
    restored = checkpointer.restore(item.absolute(),
                                    args=ocp.args.StandardRestore(target_tree))
  except (ValueError, FileNotFoundError, OSError) as err:
    raise ConversionError(f"{item}: cannot restore the orbax checkpoint ({err})") from None
  finally:
    checkpointer.close()
  return flatten(restored)


def _stored_dtype(manifest: dict, dtype, directory: Path):
  name = manifest["dtype"] if dtype is None else np.dtype(dtype).name
  return NUMPY_DTYPES[canonical_dtype(name, str(directory), "dtype")]


def load_drafter(path: str | Path, *, dtype=None) -> DrafterWeights:
  """Load everything a ``wts-convert`` directory holds (see ``DrafterWeights``).

  ``dtype`` casts on restore (e.g. ``jnp.float32``); by default the stored dtype is
  kept. Arrays land on the default device. Raises ``ConversionError`` for a directory
  that is not a complete wts-convert output.
  """
  directory = Path(path)
  manifest = read_manifest(directory)
  dtype = _stored_dtype(manifest, dtype, directory)
  stored = manifest["tensors"]
  head = None
  if manifest["head"] is not None:
    graphdef, state, abstract = _abstract_head(HeadConfig(**manifest["head"]), dtype)
    _check_item_keys(abstract, stored.get(HEAD_ITEM, {}), directory / HEAD_ITEM)
    head = _assemble_head(graphdef, state, _restore(directory / HEAD_ITEM, abstract))
  backbone = None
  for item, shapes in stored.items():
    if is_backbone_item(item):
      targets = {key: jax.ShapeDtypeStruct(tuple(shape), dtype)
                 for key, shape in shapes.items()}
      backbone = {**(backbone or {}), **_restore(directory / item, targets)}
  return DrafterWeights(DrafterConfig.from_json(manifest["drafter"]), head, backbone)


def load(path: str | Path, *, dtype=None) -> DraftHead:
  """The ``DraftHead`` (serial head + confidence head) of a ``wts-convert`` directory.

  Pass it straight to ``wts_jax.walk``. Reads only ``head/``, even after ``--full``
  (``load_drafter`` returns the backbone too). A DFlash drafter (markov_rank 0) has no
  serial head: ``load`` raises ``ConversionError`` pointing to ``load_drafter``.
  ``dtype`` casts on restore; by default the stored dtype (bf16) is kept.
  """
  directory = Path(path)
  manifest = read_manifest(directory)
  if manifest["head"] is None:
    raise ConversionError(
        f"{directory}: markov_rank=0 (a DFlash drafter) has no serial head for "
        "wts_jax.walk; use wts_jax.load_drafter(path) for its backbone")
  dtype = _stored_dtype(manifest, dtype, directory)
  graphdef, state, abstract = _abstract_head(HeadConfig(**manifest["head"]), dtype)
  _check_item_keys(abstract, manifest["tensors"].get(HEAD_ITEM, {}), directory / HEAD_ITEM)
  return _assemble_head(graphdef, state, _restore(directory / HEAD_ITEM, abstract))


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


__all__ = ["DrafterWeights", "from_torch_state_dict", "load", "load_drafter"]
