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
  def from_json(cls, fields: dict[str, Any]) -> "DrafterConfig":
    fields = dict(fields)
    fields["target_layer_ids"] = tuple(fields["target_layer_ids"])
    return cls(**fields)


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(config: dict, name: str, where: str) -> int:
  value = config[name]
  if not _is_int(value) or value <= 0:
    raise ConversionError(f"{where}: {name}={value!r} must be a positive integer")
  return value


def _flag(config: dict, name: str, where: str) -> bool:
  value = config[name]
  if not isinstance(value, bool):
    raise ConversionError(f"{where}: {name}={value!r} must be true or false")
  return value


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
  """A ``DrafterConfig`` from a DeepSpec ``config.json`` dict; ``where`` names it in errors."""
  if not isinstance(config, dict):
    raise ConversionError(f"{where}: expected a JSON object, got {type(config).__name__}")
  refuse_unsupported_format(config, where)
  missing = [name for name in REQUIRED_FIELDS if name not in config]
  if missing:
    raise ConversionError(
        f"{where}: lacks {', '.join(repr(name) for name in missing)}, which every DeepSpec "
        f"{DEEPSPEC_ARCHITECTURE} config has")

  sizes = {name: _positive_int(config, name, where) for name in (
      "vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
      "intermediate_size", "num_hidden_layers", "block_size")}
  head_dim = config.get("head_dim")
  if head_dim is None:
    head_dim = sizes["hidden_size"] // sizes["num_attention_heads"]
  elif not _is_int(head_dim) or head_dim <= 0:
    raise ConversionError(f"{where}: head_dim={head_dim!r} must be a positive integer")
  if sizes["num_attention_heads"] % sizes["num_key_value_heads"]:
    raise ConversionError(
        f"{where}: num_attention_heads={sizes['num_attention_heads']} is not a multiple "
        f"of num_key_value_heads={sizes['num_key_value_heads']}")
  if config.get("tie_word_embeddings", False) is not False:
    raise ConversionError(
        f"{where}: tie_word_embeddings={config['tie_word_embeddings']!r}; DeepSpec "
        "drafters save embed_tokens and lm_head separately (tie_word_embeddings=false)")
  if config.get("attention_bias", False) is not False:
    raise ConversionError(
        f"{where}: attention_bias={config['attention_bias']!r}; Qwen3 drafters have no "
        "q/k/v/o biases")

  num_target_layers = config.get("num_target_layers")
  if num_target_layers is not None and (not _is_int(num_target_layers)
                                        or num_target_layers <= 0):
    raise ConversionError(
        f"{where}: num_target_layers={num_target_layers!r} must be a positive integer")
  layer_ids = config["target_layer_ids"]
  if (not isinstance(layer_ids, list) or not layer_ids
      or not all(_is_int(layer) for layer in layer_ids)):
    raise ConversionError(
        f"{where}: target_layer_ids={layer_ids!r} must be a non-empty list of integers")
  for previous, layer in zip(layer_ids, layer_ids[1:]):
    if layer <= previous:
      raise ConversionError(
          f"{where}: target_layer_ids={layer_ids!r} must be strictly increasing")
  last_layer = None if num_target_layers is None else num_target_layers - 1
  for layer in layer_ids:
    if layer < -1 or (last_layer is not None and layer > last_layer):
      raise ConversionError(
          f"{where}: target_layer_ids entry {layer} is outside {{-1}} ∪ [0, "
          f"{last_layer if last_layer is not None else '…'}] (-1 = the embedding output)")

  mask_token_id = config["mask_token_id"]
  if not _is_int(mask_token_id) or not 0 <= mask_token_id < sizes["vocab_size"]:
    raise ConversionError(
        f"{where}: mask_token_id={mask_token_id!r} must be an id in [0, "
        f"vocab_size={sizes['vocab_size']})")

  markov_rank = config["markov_rank"]
  if not _is_int(markov_rank) or markov_rank < 0:
    raise ConversionError(f"{where}: markov_rank={markov_rank!r} must be an integer >= 0")
  head_type = None
  if markov_rank > 0:
    if "markov_head_type" not in config:
      raise ConversionError(
          f"{where}: markov_rank={markov_rank} but no markov_head_type (one of "
          f"{HEAD_TYPES}) is given")
    head_type = config["markov_head_type"]
    if head_type not in HEAD_TYPES:
      raise ConversionError(
          f"{where}: markov_head_type={head_type!r} must be one of {HEAD_TYPES}")

  confidence = _flag(config, "enable_confidence_head", where)
  with_markov = False
  if confidence:
    if "confidence_head_with_markov" not in config:
      raise ConversionError(
          f"{where}: enable_confidence_head=true but confidence_head_with_markov is not "
          "given")
    with_markov = _flag(config, "confidence_head_with_markov", where)
    if with_markov and markov_rank == 0:
      raise ConversionError(
          f"{where}: confidence_head_with_markov=true needs a Markov head, but "
          "markov_rank=0")

  dtype_field = "dtype" if config.get("dtype") is not None else "torch_dtype"
  dtype = config.get(dtype_field)
  if dtype is not None:
    dtype = canonical_dtype(dtype, where, dtype_field)

  return DrafterConfig(
      vocab_size=sizes["vocab_size"], hidden_size=sizes["hidden_size"],
      num_attention_heads=sizes["num_attention_heads"],
      num_key_value_heads=sizes["num_key_value_heads"], head_dim=head_dim,
      intermediate_size=sizes["intermediate_size"],
      num_draft_layers=sizes["num_hidden_layers"], target_layer_ids=tuple(layer_ids),
      num_target_layers=num_target_layers, block_size=sizes["block_size"],
      mask_token_id=mask_token_id, markov_rank=markov_rank, markov_head_type=head_type,
      confidence=confidence, confidence_with_markov=with_markov, dtype=dtype)
