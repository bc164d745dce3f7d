"""Head configuration and the presets of the released Qwen3 DSpark drafters."""

from __future__ import annotations

import dataclasses

HEAD_TYPES = ("vanilla", "gated", "rnn")

QWEN3_VOCAB = 151_936
DSPARK_RANK = 256
QWEN3_HIDDEN = {"qwen3_4b": 2560, "qwen3_8b": 4096, "qwen3_14b": 5120}


@dataclasses.dataclass(frozen=True)
class HeadConfig:
  """Shapes and options of a DSpark serial head (DeepSpec config names in comments).

  vocab_size: V (``vocab_size``); rank: r (``markov_rank``); hidden_size: d
  (``hidden_size``); head_type: ``markov_head_type``; confidence: the
  ``enable_confidence_head`` flag; confidence_with_markov:
  ``confidence_head_with_markov`` (the confidence head also reads ``e_k``).
  """

  vocab_size: int
  rank: int
  hidden_size: int
  head_type: str = "vanilla"
  confidence: bool = False
  confidence_with_markov: bool = True

  def __post_init__(self):
    if self.head_type not in HEAD_TYPES:
      raise ValueError(f"head_type={self.head_type!r} must be one of {HEAD_TYPES}")
    for name in ("vocab_size", "rank", "hidden_size"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")
    for name in ("confidence", "confidence_with_markov"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")

  @property
  def needs_hidden(self) -> bool:
    """Whether a walk needs the backbone hidden states ``h_k``."""
    return self.head_type != "vanilla" or self.confidence

  def replace(self, **changes) -> "HeadConfig":
    return dataclasses.replace(self, **changes)

  @classmethod
  def qwen3_dspark(cls, model: str, head_type: str = "vanilla", *,
                   rank: int = DSPARK_RANK, confidence: bool = True,
                   confidence_with_markov: bool = True) -> "HeadConfig":
    if model not in QWEN3_HIDDEN:
      raise ValueError(f"model={model!r} must be one of {sorted(QWEN3_HIDDEN)}")
    return cls(vocab_size=QWEN3_VOCAB, rank=rank, hidden_size=QWEN3_HIDDEN[model],
               head_type=head_type, confidence=confidence,
               confidence_with_markov=confidence_with_markov)

  @classmethod
  def qwen3_4b(cls, head_type: str = "vanilla", **kwargs) -> "HeadConfig":
    return cls.qwen3_dspark("qwen3_4b", head_type, **kwargs)

  @classmethod
  def qwen3_8b(cls, head_type: str = "vanilla", **kwargs) -> "HeadConfig":
    return cls.qwen3_dspark("qwen3_8b", head_type, **kwargs)

  @classmethod
  def qwen3_14b(cls, head_type: str = "vanilla", **kwargs) -> "HeadConfig":
    return cls.qwen3_dspark("qwen3_14b", head_type, **kwargs)
