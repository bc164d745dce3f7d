"""``convert(src, dst)``: a DeepSpec checkpoint to an orbax directory wts_jax loads.

Tensors are read one at a time, in row chunks, straight into the output dtype, and
each item (the head, then each backbone module) is saved as soon as it is read and
then dropped: peak memory is about the largest item (the 14B embedding, 1.5 GB) plus
orbax's compressed write buffers — never the checkpoint, let alone twice.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from wts_jax.convert.drafter_config import canonical_dtype
from wts_jax.convert.errors import ConversionError
from wts_jax.convert.formats import CheckpointSource, open_checkpoint
from wts_jax.convert.interrupts import (Interrupted, deferred_interrupts,
                                        interrupts_as_exceptions)
from wts_jax.convert.manifest import (FORMAT_NAME, FORMAT_VERSION, HEAD_ITEM,
                                      MANIFEST_FILE, array_checksum, backbone_item)
from wts_jax.convert.plan import ConversionPlan, plan_conversion
from wts_jax.convert.progress import Progress, format_bytes
from wts_jax.convert.staging import (StagingDirectory, check_destination,
                                     remove_dead_leftovers)
from wts_jax.convert.writer import save_arrays, write_json


def output_dtype(plan: ConversionPlan, dtype: str | None) -> str:
  """``dtype`` checked, or the checkpoint's own dtype when None (bf16 stays bf16)."""
  if dtype is None or dtype == "keep":
    return plan.source_dtype
  return canonical_dtype(dtype, "--dtype", "dtype")


def items_to_write(plan: ConversionPlan, full: bool) -> dict[str, tuple]:
  """The orbax items a conversion writes (``"head"``, ``"backbone/<module>"``, …), in
  order, each with its tensors."""
  if not full and not plan.config.has_serial_head:
    raise ConversionError(
        "markov_rank=0: this is a DFlash drafter, with no serial head to convert; pass "
        "--full to convert its backbone")
  items: dict[str, list] = {HEAD_ITEM: list(plan.head)} if plan.head else {}
  if full:
    for tensor in plan.backbone:
      items.setdefault(backbone_item(tensor.key), []).append(tensor)
  return {name: tuple(tensors) for name, tensors in items.items()}


def build_manifest(source: CheckpointSource, plan: ConversionPlan, items: dict[str, tuple],
                   dtype: str, checksums: dict[str, dict[str, str]]) -> dict:
  head_config = plan.config.head_config
  return {
      "format": FORMAT_NAME,
      "format_version": FORMAT_VERSION,
      "head": None if head_config is None else dataclasses.asdict(head_config),
      "dtype": dtype,
      "tensors": {name: {tensor.key: list(tensor.shape) for tensor in tensors}
                  for name, tensors in items.items()},
      "checksums": checksums,
      "drafter": plan.config.to_json(),
      "source": {"path": str(Path(source.location).absolute()), "format": source.format,
                 "dtype": plan.source_dtype},
      "source_config": source.config,
  }


def _source_paths(source: CheckpointSource) -> list[Path]:
  return [Path(source.location), Path(source.config_file).parent]


def convert(src: str | Path, dst: str | Path, *, full: bool = False,
            dtype: str | None = None, force: bool = False,
            progress: bool = False) -> Path:
  """Convert the DeepSpec checkpoint ``src`` into the directory ``dst``.

  Args:
    src: a checkpoint directory (``config.json`` + ``model.safetensors``, or a sharded
      ``model.safetensors.index.json``, or ``pytorch_model*.bin``) or one weights file.
    dst: the output directory (must not exist, unless ``force``).
    full: also convert the drafter backbone (embed_tokens, fc, hidden_norm, layers.*,
      norm, lm_head); by default only the serial head and the confidence head.
    dtype: ``"bfloat16"``, ``"float16"`` or ``"float32"`` to cast; None keeps the
      checkpoint's dtype.
    force: replace an existing ``dst`` that is an earlier wts-convert output.
    progress: draw a progress bar on stderr.

  Returns the path of ``dst``. Raises ``ConversionError`` (and writes nothing) for any
  checkpoint it refuses, and ``Interrupted`` (a ``KeyboardInterrupt``) on Ctrl-C or
  SIGTERM, after removing what it had staged. Staging directories that killed runs for
  the same ``dst`` left behind are removed first.
  """
  dst = Path(dst)
  with interrupts_as_exceptions(), open_checkpoint(src) as source:
    plan = plan_conversion(source)
    out_dtype = output_dtype(plan, dtype)
    items = items_to_write(plan, full)
    total = sum(tensor.nbytes for tensors in items.values() for tensor in tensors)
    bar = Progress(total, enabled=progress)
    for note in remove_dead_leftovers(dst):
      bar.stage(note)
    check_destination(dst, force, _source_paths(source))
    bar.stage(f"converting {source.location} ({source.format}, {format_bytes(total)}) "
              f"to {dst} as {out_dtype}")
    checksums: dict[str, dict[str, str]] = {}
    try:
      with StagingDirectory(dst, force=force) as staging:
        for name, tensors in items.items():
          arrays = {}
          for tensor in tensors:
            bar.start_tensor(tensor.key)
            arrays[tensor.key] = source.read(tensor.key, out_dtype, bar.advance)
            checksums.setdefault(name, {})[tensor.key] = array_checksum(arrays[tensor.key])
          bar.stage(f"writing {name}/ ({len(arrays)} tensors)")
          with deferred_interrupts():   # orbax's writer threads finish first
            save_arrays(staging.path / name, arrays)
          del arrays   # before the next item is read: one item in memory at a time
        write_json(staging.path / MANIFEST_FILE,
                   build_manifest(source, plan, items, out_dtype, checksums))
        try:
          with deferred_interrupts():
            staging.commit()
        except Interrupted as interrupt:
          interrupt.wrote = dst   # the swap finished: say so, rather than "nothing"
          raise
    except OSError as err:   # a full disk or an unwritable parent: still nothing left
      raise ConversionError(f"converting to {dst} failed ({err}); nothing was written") from None
    finally:
      bar.finish()
  return dst
