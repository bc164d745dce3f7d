"""The strict key table: exactly the tensors a DeepSpec drafter config implies.

Keys are DeepSpec's ``state_dict`` names (no ``model.`` prefix; PyTorch layout, Linear
weights ``[out, in]``). The serial head's keys equal the attribute paths of
``wts_jax.heads.DraftHead``, so they load with no transposes. Every expected tensor
records the config fields that imply it, so a missing key or a wrong shape can be
explained in terms of the config.
"""

from __future__ import annotations

import dataclasses

from wts_jax.convert.drafter_config import DrafterConfig

HEAD_PART = "head"            # converted by default: what wts_jax.walk runs
BACKBONE_PART = "backbone"    # converted with --full: the drafter's layers, for later use

# Keys that only the speculators format has (vocabulary maps, verifier weights).
SPECULATORS_KEYS = ("d2t", "t2d")
SPECULATORS_PREFIX = "verifier"


@dataclasses.dataclass(frozen=True)
class ExpectedTensor:
  """One tensor the config implies: its key, shape, part, and why it is expected."""

  key: str
  shape: tuple[int, ...]
  dim_names: tuple[str, ...]   # config names of the dims, e.g. ("vocab_size", "markov_rank")
  part: str
  because: str                 # the config fields that imply the key

  def describe_shape(self) -> str:
    dims = ", ".join(f"{name}={size}" for name, size in zip(self.dim_names, self.shape))
    return f"{list(self.shape)} ([{dims}])"


def is_speculators_key(key: str) -> bool:
  return key in SPECULATORS_KEYS or key.startswith(SPECULATORS_PREFIX)


def expected_tensors(config: DrafterConfig) -> dict[str, ExpectedTensor]:
  """Every tensor of the checkpoint, keyed by DeepSpec name, in a stable order."""
  table: dict[str, ExpectedTensor] = {}
  sizes = {
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "markov_rank": config.markov_rank, "head_dim": config.head_dim,
      "intermediate_size": config.intermediate_size, "1": 1,
      "num_attention_heads*head_dim": config.num_attention_heads * config.head_dim,
      "num_key_value_heads*head_dim": config.num_key_value_heads * config.head_dim,
      "len(target_layer_ids)*hidden_size":
          len(config.target_layer_ids) * config.hidden_size,
      "hidden_size+markov_rank": config.hidden_size + config.markov_rank,
      "3*markov_rank": 3 * config.markov_rank,
      "2*markov_rank+hidden_size": 2 * config.markov_rank + config.hidden_size,
  }

  def add(key: str, dim_names: tuple[str, ...], part: str, because: str) -> None:
    table[key] = ExpectedTensor(key, tuple(sizes[name] for name in dim_names), dim_names,
                                part, because)

  backbone = "every DeepSpec drafter"
  add("embed_tokens.weight", ("vocab_size", "hidden_size"), BACKBONE_PART, backbone)
  add("fc.weight", ("hidden_size", "len(target_layer_ids)*hidden_size"), BACKBONE_PART,
      backbone)
  add("hidden_norm.weight", ("hidden_size",), BACKBONE_PART, backbone)
  for layer in range(config.num_draft_layers):
    because = f"num_hidden_layers={config.num_draft_layers}"
    prefix = f"layers.{layer}."
    add(prefix + "input_layernorm.weight", ("hidden_size",), BACKBONE_PART, because)
    add(prefix + "self_attn.q_proj.weight",
        ("num_attention_heads*head_dim", "hidden_size"), BACKBONE_PART, because)
    add(prefix + "self_attn.k_proj.weight",
        ("num_key_value_heads*head_dim", "hidden_size"), BACKBONE_PART, because)
    add(prefix + "self_attn.v_proj.weight",
        ("num_key_value_heads*head_dim", "hidden_size"), BACKBONE_PART, because)
    add(prefix + "self_attn.o_proj.weight",
        ("hidden_size", "num_attention_heads*head_dim"), BACKBONE_PART, because)
    add(prefix + "self_attn.q_norm.weight", ("head_dim",), BACKBONE_PART, because)
    add(prefix + "self_attn.k_norm.weight", ("head_dim",), BACKBONE_PART, because)
    add(prefix + "post_attention_layernorm.weight", ("hidden_size",), BACKBONE_PART,
        because)
    add(prefix + "mlp.gate_proj.weight", ("intermediate_size", "hidden_size"),
        BACKBONE_PART, because)
    add(prefix + "mlp.up_proj.weight", ("intermediate_size", "hidden_size"),
        BACKBONE_PART, because)
    add(prefix + "mlp.down_proj.weight", ("hidden_size", "intermediate_size"),
        BACKBONE_PART, because)
  add("norm.weight", ("hidden_size",), BACKBONE_PART, backbone)
  add("lm_head.weight", ("vocab_size", "hidden_size"), BACKBONE_PART, backbone)

  if config.has_serial_head:
    because = f"markov_rank={config.markov_rank}"
    add("markov_head.markov_w1.weight", ("vocab_size", "markov_rank"), HEAD_PART, because)
    add("markov_head.markov_w2.weight", ("vocab_size", "markov_rank"), HEAD_PART, because)
    because += f", markov_head_type={config.markov_head_type!r}"
    if config.markov_head_type == "gated":
      add("markov_head.gate_proj.weight", ("markov_rank", "hidden_size+markov_rank"),
          HEAD_PART, because)
      add("markov_head.gate_proj.bias", ("markov_rank",), HEAD_PART, because)
    elif config.markov_head_type == "rnn":
      add("markov_head.joint_proj.weight", ("3*markov_rank", "2*markov_rank+hidden_size"),
          HEAD_PART, because)
      add("markov_head.joint_proj.bias", ("3*markov_rank",), HEAD_PART, because)

  if config.confidence:
    because = ("enable_confidence_head=true, confidence_head_with_markov="
               f"{str(config.confidence_with_markov).lower()}")
    # Without a serial head there is nothing for the walk to pair the confidence head
    # with, so a DFlash drafter's confidence head travels with the backbone.
    part = HEAD_PART if config.has_serial_head else BACKBONE_PART
    in_features = ("hidden_size+markov_rank" if config.confidence_with_markov
                   else "hidden_size")
    add("confidence_head.proj.weight", ("1", in_features), part, because)
    add("confidence_head.proj.bias", ("1",), part, because)
  return table
