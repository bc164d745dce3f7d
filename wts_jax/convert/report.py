"""``wts-convert inspect SRC``: what a checkpoint is, what would be converted, and why not.

The report is built in the order the converter works (find the files, read the
config, match the keys), so a refused checkpoint still shows everything that could be
read before the refusal.
"""

from __future__ import annotations

from wts_jax.convert.drafter_config import DEEPSPEC_ARCHITECTURE, DrafterConfig
from wts_jax.convert.errors import ConversionError
from wts_jax.convert.formats import StoredTensor, open_checkpoint
from wts_jax.convert.plan import plan_conversion
from wts_jax.convert.progress import format_bytes

LABEL_WIDTH = 9


def _line(label: str, text: str) -> str:
  return f"{label:<{LABEL_WIDTH}} {text}"


def _describe_drafter(config: DrafterConfig) -> str:
  return (f"{DEEPSPEC_ARCHITECTURE}: vocab_size {config.vocab_size}, hidden_size "
          f"{config.hidden_size}, {config.num_draft_layers} draft layers "
          f"({config.num_attention_heads} heads / {config.num_key_value_heads} kv heads × "
          f"head_dim {config.head_dim}, intermediate_size {config.intermediate_size}), "
          f"target_layer_ids {list(config.target_layer_ids)}, block_size "
          f"{config.block_size}")


def _tensor_table(tensors: tuple[StoredTensor, ...]) -> list[str]:
  width = max(len(tensor.key) for tensor in tensors)
  return [f"  {tensor.key:<{width}}  {str(list(tensor.shape)):<16} {tensor.dtype}"
          for tensor in tensors]


def _section(title: str, tensors: tuple[StoredTensor, ...]) -> list[str]:
  size = format_bytes(sum(tensor.nbytes for tensor in tensors))
  return [f"{title} ({len(tensors)} tensors, {size}):", *_tensor_table(tensors)]


def inspect_checkpoint(src) -> tuple[str, ConversionError | None]:
  """The report on ``src``, and the reason it would be refused (None if it would not)."""
  lines: list[str] = []
  try:
    with open_checkpoint(src) as source:
      lines.append(_line("source", f"{source.location} ({source.format})"))
      lines.append(_line("config", source.config_file))
      try:
        plan = plan_conversion(source)
      except ConversionError as refusal:
        lines.extend(_ignored_lines(source.ignored))
        return "\n".join(lines + ["", f"REFUSED: {refusal}"]), refusal
  except ConversionError as refusal:
    return "\n".join(lines + ["", f"REFUSED: {refusal}"]), refusal

  config = plan.config
  lines.append(_line("drafter", _describe_drafter(config)))
  lines.append(_line("head", config.describe_head()))
  declared = "not declared" if config.dtype is None else config.dtype
  lines.append(_line("dtype", f"{plan.source_dtype} (config dtype: {declared}); kept "
                     "unless --dtype is given"))
  lines.append("")
  if plan.head:
    lines.extend(_section("head, converted by default", plan.head))
  else:
    lines.append("converted by default: nothing (markov_rank 0: no serial head); this "
                 "checkpoint converts with --full only")
  lines.extend(_section("backbone, converted with --full", plan.backbone))
  lines.extend(_ignored_lines(source.ignored))
  lines.append("")
  lines.append("refused: no" if plan.head else
               "refused: without --full (no serial head); converts with --full")
  return "\n".join(lines), None


def _ignored_lines(ignored: list[tuple[str, str]]) -> list[str]:
  if not ignored:
    return ["ignored: nothing"]
  width = max(len(name) for name, _ in ignored)
  return ["ignored:", *(f"  {name:<{width}}  {reason}" for name, reason in ignored)]
