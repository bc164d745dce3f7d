"""``config.json`` of a DeepSpec Qwen3 DSpark/DFlash drafter, read strictly.

A DeepSpec drafter config is a copy of the target Qwen3 config plus the drafter fields
(``architectures: ["Qwen3DSparkModel"]``, ``target_layer_ids``, ``markov_rank``, …).
``parse_config`` refuses, naming the field and its value, every format wts_jax does not
convert: the z-lab DFlash format, the speculators format, a reduced draft vocabulary,
and any other architecture.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from wts_jax.convert.config_fields import ConfigFields
from wts_jax.convert.errors import ConversionError
from wts_jax.heads.config import HEAD_TYPES, HeadConfig

DEEPSPEC_ARCHITECTURE = "Qwen3DSparkModel"
ZLAB_DFLASH_ARCHITECTURE = "DFlashDraftModel"
SPECULATORS_FIELDS = ("speculators_model_type", "speculators_config", "speculators_version")
# Tensor dtypes a released or trained drafter can hold; anything else is refused.
FLOAT_DTYPES = ("bfloat16", "float16", "float32")

# Fields Qwen3DSparkModel.__init__ asserts (DeepSpec), plus the Qwen3 shapes we need.
REQUIRED_FIELDS = (
    "vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "num_hidden_layers", "target_layer_ids", "mask_token_id",
    "num_anchors", "block_size", "enable_confidence_head", "markov_rank",
)


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
  """The drafter facts the key table and the loader need (DeepSpec names in comments).

  num_draft_layers: ``num_hidden_layers`` (the drafter's own layers, N);
  num_target_layers: ``num_target_layers`` (None when the config omits it);
  markov_head_type: None when ``markov_rank`` is 0 (a DFlash drafter: no serial head);
  confidence: ``enable_confidence_head``; confidence_with_markov:
  ``confidence_head_with_markov`` (False when the confidence head is off);
  dtype: ``dtype`` or ``torch_dtype`` (None when neither is given).
  """

  vocab_size: int
  hidden_size: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  intermediate_size: int
  num_draft_layers: int
  target_layer_ids: tuple[int, ...]
  num_target_layers: int | None
  block_size: int
  mask_token_id: int
  markov_rank: int
  markov_head_type: str | None
  confidence: bool
  confidence_with_markov: bool
  dtype: str | None

  @property
  def has_serial_head(self) -> bool:
    return self.markov_rank > 0

  @property
  def head_config(self) -> HeadConfig | None:
    """The ``HeadConfig`` of the serial head (None for a DFlash drafter, rank 0)."""
    if not self.has_serial_head:
      return None
    return HeadConfig(vocab_size=self.vocab_size, rank=self.markov_rank,
                      hidden_size=self.hidden_size, head_type=self.markov_head_type,
                      confidence=self.confidence,
                      confidence_with_markov=self.confidence_with_markov)

  def describe_head(self) -> str:
    if not self.has_serial_head:
      head = "none (markov_rank 0: a DFlash drafter)"
    else:
      head = f"{self.markov_head_type}, markov_rank {self.markov_rank}"
    if self.confidence:
      inputs = "[h | e]" if self.confidence_with_markov else "[h]"
      return f"{head}; confidence head on, reading {inputs}"
    return f"{head}; confidence head off"

  def to_json(self) -> dict[str, Any]:
    fields = dataclasses.asdict(self)
    fields["target_layer_ids"] = list(self.target_layer_ids)
    return fields

  @classmethod
  def from_json(cls, fields: dict[str, Any], where: str = "wts_config.json") -> "DrafterConfig":
    """The config ``to_json`` wrote (a converted directory's manifest, ``where``), every
    field read with its type and range checked: an edited manifest is named, not run."""
    read = ConfigFields(fields, where, prefix="drafter.")
    unknown = sorted(set(fields) - {field.name for field in dataclasses.fields(cls)})
    if unknown:
      raise read.error(f"drafter holds {unknown[0]!r}, which is not a drafter config field")
    vocab_size = read.positive_int("vocab_size")
    markov_rank = read.integer("markov_rank", minimum=0)
    return cls(
        vocab_size=vocab_size, hidden_size=read.positive_int("hidden_size"),
        num_attention_heads=read.positive_int("num_attention_heads"),
        num_key_value_heads=read.positive_int("num_key_value_heads"),
        head_dim=read.positive_int("head_dim"),
        intermediate_size=read.positive_int("intermediate_size"),
        num_draft_layers=read.positive_int("num_draft_layers"),
        target_layer_ids=tuple(read.int_list("target_layer_ids", minimum=-1)),
        num_target_layers=read.positive_int("num_target_layers", None),
        block_size=read.positive_int("block_size"),
        mask_token_id=read.integer("mask_token_id", minimum=0, maximum=vocab_size - 1),
        markov_rank=markov_rank,
        markov_head_type=(read.choice("markov_head_type", HEAD_TYPES) if markov_rank
                          else read.choice("markov_head_type", HEAD_TYPES, None)),
        confidence=read.flag("confidence"),
        confidence_with_markov=read.flag("confidence_with_markov"),
        dtype=read.choice("dtype", FLOAT_DTYPES, None))


def canonical_dtype(name, where: str, field: str) -> str:
  """``"bfloat16"`` from ``"bfloat16"`` / ``"torch.bfloat16"``; refuses other dtypes."""
  text = str(name).removeprefix("torch.")
  if text not in FLOAT_DTYPES:
    raise ConversionError(f"{where}: {field}={name!r} is not one of {FLOAT_DTYPES}")
  return text


def refuse_unsupported_format(config: dict, where: str) -> None:
  """Raise for a config that is not a DeepSpec Qwen3 drafter, saying what it is."""
  architectures = config.get("architectures")
  if "dflash_config" in config or (isinstance(architectures, list)
                                   and ZLAB_DFLASH_ARCHITECTURE in architectures):
    raise ConversionError(
        f"{where}: architectures={architectures!r}"
        f"{' with dflash_config' if 'dflash_config' in config else ''} is a z-lab DFlash "
        "checkpoint, which wts-convert does not convert: it has no serial head (nothing "
        "for wts_jax.walk), no embed_tokens/lm_head of its own (it shares the "
        "target's) and uses the anchor-drop block layout. wts-convert reads DeepSpec "
        f"checkpoints ({DEEPSPEC_ARCHITECTURE}); a DeepSpec DFlash checkpoint "
        "(markov_rank 0) converts with --full.")
  speculators = [name for name in SPECULATORS_FIELDS if name in config]
  if speculators:
    raise ConversionError(
        f"{where}: {speculators[0]}={config[speculators[0]]!r} marks a speculators-format "
        "checkpoint (verifier_* weights, d2t/t2d vocabulary maps), which wts-convert "
        f"does not convert; it reads DeepSpec {DEEPSPEC_ARCHITECTURE} checkpoints")
  if architectures != [DEEPSPEC_ARCHITECTURE]:
    raise ConversionError(
        f"{where}: architectures={architectures!r} is not supported; wts-convert reads "
        f"DeepSpec Qwen3 DSpark/DFlash drafters (architectures="
        f"[{DEEPSPEC_ARCHITECTURE!r}])")
  draft_vocab = config.get("draft_vocab_size")
  if draft_vocab is not None and draft_vocab != config.get("vocab_size"):
    raise ConversionError(
        f"{where}: draft_vocab_size={draft_vocab!r} != vocab_size="
        f"{config.get('vocab_size')!r}: a reduced draft vocabulary is not supported "
        "(the walk drafts over the target's whole vocabulary)")


def parse_config(config: dict, where: str = "config.json") -> DrafterConfig:
  """A ``DrafterConfig`` from a DeepSpec ``config.json`` dict; ``where`` names it in errors.

  The draft layers' fields are read by the Qwen3 target's own reader
  (``Qwen3Config.from_hf``), so every config this accepts, ``load_dspark`` runs.
  """
  fields = ConfigFields(config, where)
  refuse_unsupported_format(config, where)
  missing = [name for name in REQUIRED_FIELDS if name not in config]
  if missing:
    raise ConversionError(
        f"{where}: lacks {', '.join(repr(name) for name in missing)}, which every DeepSpec "
        f"{DEEPSPEC_ARCHITECTURE} config has")
  if fields.flag("tie_word_embeddings", False):
    raise fields.error("tie_word_embeddings=True; DeepSpec drafters save embed_tokens and "
                       "lm_head separately (tie_word_embeddings=false)")
  from wts_jax.specdecode.qwen3 import Qwen3Config   # the draft layers are Qwen3 layers
  layers = Qwen3Config.from_hf(config, where)
  block_size = fields.positive_int("block_size")

  num_target_layers = fields.positive_int("num_target_layers", None)
  layer_ids = fields.int_list("target_layer_ids")
  for previous, layer in zip(layer_ids, layer_ids[1:]):
    if layer <= previous:
      raise fields.error(f"target_layer_ids={layer_ids!r} must be strictly increasing")
  last_layer = None if num_target_layers is None else num_target_layers - 1
  for layer in layer_ids:
    if layer < -1 or (last_layer is not None and layer > last_layer):
      raise fields.error(
          f"target_layer_ids entry {layer} is outside {{-1}} ∪ [0, "
          f"{last_layer if last_layer is not None else '…'}] (-1 = the embedding output)")

  mask_token_id = fields.integer("mask_token_id", minimum=0, maximum=layers.vocab_size - 1)
  markov_rank = fields.integer("markov_rank", minimum=0)
  head_type = None
  if markov_rank > 0:
    if "markov_head_type" not in fields:
      raise fields.error(f"markov_rank={markov_rank} but no markov_head_type (one of "
                         f"{HEAD_TYPES}) is given")
    head_type = fields.choice("markov_head_type", HEAD_TYPES)

  confidence = fields.flag("enable_confidence_head")
  with_markov = False
  if confidence:
    if "confidence_head_with_markov" not in fields:
      raise fields.error("enable_confidence_head=true but confidence_head_with_markov is "
                         "not given")
    with_markov = fields.flag("confidence_head_with_markov")
    if with_markov and markov_rank == 0:
      raise fields.error("confidence_head_with_markov=true needs a Markov head, but "
                         "markov_rank=0")

  dtype_field = "dtype" if "dtype" in fields else "torch_dtype"
  dtype = config.get(dtype_field)
  if dtype is not None:
    dtype = canonical_dtype(dtype, where, dtype_field)

  return DrafterConfig(
      vocab_size=layers.vocab_size, hidden_size=layers.hidden_size,
      num_attention_heads=layers.num_heads, num_key_value_heads=layers.num_kv_heads,
      head_dim=layers.head_dim, intermediate_size=layers.intermediate_size,
      num_draft_layers=layers.num_layers, target_layer_ids=tuple(layer_ids),
      num_target_layers=num_target_layers, block_size=block_size,
      mask_token_id=mask_token_id, markov_rank=markov_rank, markov_head_type=head_type,
      confidence=confidence, confidence_with_markov=with_markov, dtype=dtype)
