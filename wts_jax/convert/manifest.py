"""The layout of a converted directory and its small JSON, shared by writer and loader.

A converted directory ``DST`` holds:

- ``wts_config.json``: this manifest — the head config (``HeadConfig`` fields, or null
  for a DFlash drafter), the drafter config, the stored dtype, the key and shape of
  every converted tensor per item, the source's format, and a copy of the source
  ``config.json`` (RoPE and norm settings, for later end-to-end use);
- ``head/``: an orbax checkpoint of the serial head and the confidence head, a nested
  dict whose paths are the DeepSpec keys (= ``DraftHead`` attribute paths);
- ``backbone/<module>/`` (with ``--full``): one orbax checkpoint per top-level module
  of the drafter backbone (``embed_tokens``, ``fc``, ``hidden_norm``, ``layers.0`` …,
  ``norm``, ``lm_head``), nested the same way (``layers → "0" → self_attn → q_proj →
  weight``), PyTorch layout. One checkpoint per module lets the converter write and drop
  each module before reading the next: a 14B backbone (≈ 6.6 GB) never sits in memory
  at once, only its largest module (the 1.5 GB embedding) and orbax's write buffers.

The manifest's ``tensors`` maps each item's path (``"head"``, ``"backbone/layers.0"``)
to ``{DeepSpec key: shape}``, and ``checksums`` the same paths to ``{DeepSpec key:
CRC-32 of the stored bytes}`` (hex; absent in directories written before it was
recorded), so a bit flipped in an array file is found on load.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from wts_jax.convert.errors import CheckpointError

MANIFEST_FILE = "wts_config.json"
FORMAT_NAME = "wts_jax.drafter"
FORMAT_VERSION = 1
HEAD_ITEM = "head"
BACKBONE_ITEM = "backbone"
# The fields load reads, each with its JSON type (the head is null for a DFlash drafter).
REQUIRED_FIELDS = {"head": (dict, type(None)), "dtype": (str,), "tensors": (dict,),
                   "drafter": (dict,)}
_JSON_TYPE_NAMES = {dict: "object", str: "string", type(None): "null"}


def array_checksum(array: np.ndarray) -> str:
  """CRC-32 of an array's bytes in C order, as 8 hex digits (about 1.7 GB/s: a check
  against damage, not against tampering)."""
  return f"{zlib.crc32(np.ascontiguousarray(array).reshape(-1).view(np.uint8)):08x}"


def backbone_item(key: str) -> str:
  """The item a backbone tensor is stored in: ``backbone/`` + its top-level module."""
  parts = key.split(".")
  module = ".".join(parts[:2]) if parts[0] == "layers" else parts[0]
  return f"{BACKBONE_ITEM}/{module}"


def is_backbone_item(item: str) -> bool:
  return item.startswith(BACKBONE_ITEM + "/")


def read_manifest(directory: str | Path) -> dict[str, Any]:
  """The manifest of a converted directory; refuses anything wts-convert did not write."""
  directory = Path(directory)
  path = directory / MANIFEST_FILE
  if not path.is_file():
    raise CheckpointError(
        f"{directory}: no {MANIFEST_FILE}; not a wts-convert output (convert a PyTorch "
        "checkpoint first: wts-convert SRC DST)")
  try:
    manifest = json.loads(path.read_text())
  except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
    raise CheckpointError(f"{path}: unreadable ({err})") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
    raise CheckpointError(f"{path}: format is not {FORMAT_NAME!r}")
  if manifest.get("format_version") != FORMAT_VERSION:
    raise CheckpointError(
        f"{path}: format_version={manifest.get('format_version')!r}; this wts_jax reads "
        f"version {FORMAT_VERSION}")
  for field, types in REQUIRED_FIELDS.items():
    if field not in manifest:
      raise CheckpointError(f"{path}: lacks {field!r}; the manifest was edited or damaged")
    if not isinstance(manifest[field], types):
      raise CheckpointError(
          f"{path}: {field}={manifest[field]!r} is not a JSON "
          f"{' or '.join(_JSON_TYPE_NAMES[kind] for kind in types)}; the manifest was "
          "edited or damaged")
  return manifest


def nest(flat: dict[str, Any]) -> dict[str, Any]:
  """``{"a.b.c": x}`` → ``{"a": {"b": {"c": x}}}`` (orbax trees follow the key paths)."""
  tree: dict[str, Any] = {}
  for key, value in flat.items():
    node = tree
    *parents, leaf = key.split(".")
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """The inverse of ``nest``."""
  flat: dict[str, Any] = {}
  for name, value in tree.items():
    key = f"{prefix}{name}"
    if isinstance(value, dict):
      flat.update(flatten(value, key + "."))
    else:
      flat[key] = value
  return flat
