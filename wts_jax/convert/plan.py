"""Matching a checkpoint against its key table: what will be converted, or why not.

``plan_conversion`` reads the config, builds the key table it implies and checks the
stored tensors against it — the exact key set, every shape, one floating dtype — before
a byte of tensor data is read. ``wts-convert inspect`` prints the plan; conversion
follows it.
"""

from __future__ import annotations

import dataclasses

from wts_jax.convert.drafter_config import FLOAT_DTYPES, DrafterConfig, parse_config
from wts_jax.convert.errors import ConversionError
from wts_jax.convert.formats import CheckpointSource, StoredTensor
from wts_jax.convert.keys import (BACKBONE_PART, HEAD_PART, ExpectedTensor,
                                  expected_tensors, is_speculators_key)

# How many offending keys a message lists before it summarises the rest.
LISTED_KEYS = 5


@dataclasses.dataclass(frozen=True)
class ConversionPlan:
  """A checked checkpoint: its config, dtype, and tensors split into head and backbone."""

  config: DrafterConfig
  source_dtype: str
  head: tuple[StoredTensor, ...]       # converted by default (what the walk runs)
  backbone: tuple[StoredTensor, ...]   # converted with --full

  def tensors(self, full: bool) -> tuple[StoredTensor, ...]:
    return self.head + self.backbone if full else self.head


def describe_flags(config: DrafterConfig) -> str:
  """The config fields that decide the key set, as written in config.json."""
  flags = [f"markov_rank={config.markov_rank}"]
  if config.has_serial_head:
    flags.append(f"markov_head_type={config.markov_head_type!r}")
  flags.append(f"enable_confidence_head={str(config.confidence).lower()}")
  if config.confidence:
    flags.append(f"confidence_head_with_markov={str(config.confidence_with_markov).lower()}")
  flags.append(f"num_hidden_layers={config.num_draft_layers}")
  return ", ".join(flags)


def _listed(items: list[str]) -> str:
  shown = ", ".join(items[:LISTED_KEYS])
  more = len(items) - LISTED_KEYS
  return shown + (f" and {more} more" if more > 0 else "")


def _refuse_reduced_vocabulary(tensors: dict[str, StoredTensor], location: str) -> None:
  for rows_key, reference_key in (("markov_head.markov_w2.weight",
                                   "markov_head.markov_w1.weight"),
                                  ("lm_head.weight", "embed_tokens.weight")):
    rows, reference = tensors.get(rows_key), tensors.get(reference_key)
    if rows is None or reference is None or not rows.shape or not reference.shape:
      continue
    if rows.shape[0] != reference.shape[0]:
      raise ConversionError(
          f"{location}: {rows.where()} has {rows.shape[0]} rows but {reference_key!r} has "
          f"{reference.shape[0]}: a reduced draft vocabulary is not supported (the walk "
          "drafts over the target's whole vocabulary)")


def _check_key_set(tensors: dict[str, StoredTensor],
                   expected: dict[str, ExpectedTensor], config: DrafterConfig,
                   location: str) -> None:
  missing = [key for key in expected if key not in tensors]
  if missing:
    listed = _listed([f"{key!r} (implied by {expected[key].because})" for key in missing])
    raise ConversionError(
        f"{location}: missing {len(missing)} tensor(s) the config requires: {listed}")
  unexpected = [tensors[key].where() for key in tensors if key not in expected]
  if unexpected:
    raise ConversionError(
        f"{location}: unexpected tensor(s) {_listed(unexpected)}: the config "
        f"({describe_flags(config)}) implies no such key, and wts-convert refuses "
        "rather than drops what it cannot explain")


def _check_shapes(tensors: dict[str, StoredTensor],
                  expected: dict[str, ExpectedTensor]) -> None:
  for key, want in expected.items():
    have = tensors[key]
    if have.shape != want.shape:
      raise ConversionError(
          f"{have.where()} has shape {list(have.shape)}, expected "
          f"{want.describe_shape()} from the config")


def _check_dtypes(tensors: dict[str, StoredTensor], config: DrafterConfig,
                  config_file: str) -> str:
  """The one dtype every tensor has (the config's, when it declares one)."""
  for tensor in tensors.values():
    if tensor.dtype not in FLOAT_DTYPES:
      raise ConversionError(
          f"{tensor.where()} has dtype {tensor.dtype}, not one of {FLOAT_DTYPES}")
  if config.dtype is not None:
    declared, declared_by = config.dtype, f"{config_file} declares dtype {config.dtype}"
  else:
    first = next(iter(tensors.values()))
    declared, declared_by = first.dtype, f"{first.where()} is {first.dtype}"
  for tensor in tensors.values():
    if tensor.dtype != declared:
      raise ConversionError(
          f"{tensor.where()} has dtype {tensor.dtype} but {declared_by}; a checkpoint "
          "of mixed dtypes is refused")
  return declared


def plan_conversion(source: CheckpointSource, *,
                    allow_head_only: bool = False) -> ConversionPlan:
  """Check ``source`` against the key table of its config; raise ``ConversionError``.

  With ``allow_head_only``, tensors holding the head's keys and none of the backbone's
  are accepted too (a state dict taken from the head alone); any other partial set is
  still refused.
  """
  config = parse_config(source.config, source.config_file)
  tensors = source.tensors
  if not tensors:
    raise ConversionError(f"{source.location}: holds no tensors")
  foreign = [tensors[key].where() for key in tensors if is_speculators_key(key)]
  if foreign:
    raise ConversionError(
        f"{source.location}: {_listed(foreign)} belong(s) to the speculators format "
        "(vocabulary maps d2t/t2d, verifier_* weights), which wts-convert does not "
        "convert")
  _refuse_reduced_vocabulary(tensors, source.location)
  expected = expected_tensors(config)
  if allow_head_only and not any(want.part == BACKBONE_PART and key in tensors
                                 for key, want in expected.items()):
    expected = {key: want for key, want in expected.items() if want.part == HEAD_PART}
  _check_key_set(tensors, expected, config, source.location)
  _check_shapes(tensors, expected)
  source_dtype = _check_dtypes(tensors, config, source.config_file)
  return ConversionPlan(
      config=config, source_dtype=source_dtype,
      head=tuple(tensors[key] for key, want in expected.items() if want.part == HEAD_PART),
      backbone=tuple(tensors[key] for key, want in expected.items()
                     if want.part == BACKBONE_PART))
