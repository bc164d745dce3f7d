"""Tiny DeepSpec drafter checkpoints written as real files, for the converter tests.

The key names are written out here from the DeepSpec layout (CHECKPOINT_FORMAT.md), and
the head's come from the PyTorch peer module's own ``state_dict`` — neither is taken
from the converter's key table, so the tests check the table rather than echo it.
Sizes are tiny but keep the real structure: V not a multiple of 128, ``H·head_dim ≠ d``
as in Qwen3-4B, two draft layers, two target layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import save_file  # noqa: E402

from wts_jax.peers.deepspec_torch import DeepSpecHead

VOCAB = 300
RANK = 16
HIDDEN = 32
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16          # HEADS * HEAD_DIM = 64 != HIDDEN, as in Qwen3-4B
INTERMEDIATE = 48
DRAFT_LAYERS = 2
TARGET_LAYER_IDS = [1, 3]
TARGET_LAYERS = 6
TRAINING_FILES = ("training_state.rank0.pt", "train_config.py")


def drafter_config(head_type: str | None = "vanilla", *, rank: int = RANK,
                   confidence: bool = False, with_markov: bool = True,
                   dtype_field: str = "torch_dtype") -> dict:
  """A DeepSpec ``config.json``: the target's Qwen3 config plus the drafter fields."""
  config = {
      "architectures": ["Qwen3DSparkModel"],
      "attention_bias": False,
      "attention_dropout": 0.0,
      "bos_token_id": 0,
      "eos_token_id": 1,
      "head_dim": HEAD_DIM,
      "hidden_act": "silu",
      "hidden_size": HIDDEN,
      "initializer_range": 0.02,
      "intermediate_size": INTERMEDIATE,
      "max_position_embeddings": 4096,
      "max_window_layers": DRAFT_LAYERS,
      "model_type": "qwen3",
      "num_attention_heads": HEADS,
      "num_hidden_layers": DRAFT_LAYERS,
      "num_key_value_heads": KV_HEADS,
      "rms_norm_eps": 1e-6,
      "rope_scaling": None,
      "rope_theta": 1000000,
      "sliding_window": None,
      "tie_word_embeddings": False,
      dtype_field: "bfloat16",
      "transformers_version": "4.57.1",
      "use_cache": True,
      "use_sliding_window": False,
      "vocab_size": VOCAB,
      "layer_types": ["full_attention"] * DRAFT_LAYERS,
      "num_target_layers": TARGET_LAYERS,
      "block_size": 7,
      "mask_token_id": VOCAB - 1,
      "target_layer_ids": list(TARGET_LAYER_IDS),
      "num_anchors": 512,
      "enable_confidence_head": confidence,
      "markov_rank": rank,
  }
  if confidence:
    config["confidence_head_with_markov"] = with_markov
  if rank > 0:
    config["markov_head_type"] = head_type
  return config


def backbone_keys() -> dict[str, tuple[int, ...]]:
  """The backbone tensors of a DeepSpec Qwen3DSparkModel at the tiny sizes."""
  shapes = {
      "embed_tokens.weight": (VOCAB, HIDDEN),
      "fc.weight": (HIDDEN, len(TARGET_LAYER_IDS) * HIDDEN),
      "hidden_norm.weight": (HIDDEN,),
  }
  for layer in range(DRAFT_LAYERS):
    prefix = f"layers.{layer}."
    shapes.update({
        prefix + "input_layernorm.weight": (HIDDEN,),
        prefix + "post_attention_layernorm.weight": (HIDDEN,),
        prefix + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
        prefix + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        prefix + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        prefix + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        prefix + "self_attn.q_norm.weight": (HEAD_DIM,),
        prefix + "self_attn.k_norm.weight": (HEAD_DIM,),
        prefix + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        prefix + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        prefix + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    })
  shapes["norm.weight"] = (HIDDEN,)
  shapes["lm_head.weight"] = (VOCAB, HIDDEN)
  return shapes


def oracle_head(config: dict) -> DeepSpecHead:
  """The PyTorch DeepSpec-semantics head module for a config (random weights)."""
  return DeepSpecHead(config["vocab_size"], config["markov_rank"], config["hidden_size"],
                      config["markov_head_type"], config["enable_confidence_head"],
                      config.get("confidence_head_with_markov", False))


def drafter_state_dict(config: dict, seed: int = 0,
                       dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
  """Every tensor a DeepSpec drafter with ``config`` saves, with random values."""
  torch.manual_seed(seed)
  state = {key: torch.randn(shape) * 0.5 for key, shape in backbone_keys().items()}
  if config["markov_rank"] > 0:
    state.update(oracle_head(config).state_dict())
  elif config["enable_confidence_head"]:
    state["confidence_head.proj.weight"] = torch.randn(1, HIDDEN) * 0.1
    state["confidence_head.proj.bias"] = torch.randn(1) * 0.1
  return {key: value.to(dtype).contiguous() for key, value in state.items()}


def _shard_names(count: int, suffix: str, stem: str) -> list[str]:
  return [f"{stem}-{i + 1:05d}-of-{count:05d}.{suffix}" for i in range(count)]


def write_checkpoint(directory: Path, config: dict, state: dict[str, torch.Tensor], *,
                     layout: str = "safetensors", training_files: bool = False) -> Path:
  """Write ``state`` as DeepSpec's ``save_pretrained`` would; returns the directory.

  layout: ``"safetensors"`` (one model.safetensors), ``"sharded"`` (two safetensors
  shards + model.safetensors.index.json), ``"bin"`` (pytorch_model.bin) or
  ``"sharded-bin"`` (two .bin shards + pytorch_model.bin.index.json).
  """
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(config, indent=2))
  keys = list(state)
  if layout in ("safetensors", "bin"):
    if layout == "safetensors":
      save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
      torch.save(state, directory / "pytorch_model.bin")
  elif layout in ("sharded", "sharded-bin"):
    suffix, stem = (("safetensors", "model") if layout == "sharded"
                    else ("bin", "pytorch_model"))
    names = _shard_names(2, suffix, stem)
    halves = [keys[:len(keys) // 2], keys[len(keys) // 2:]]
    weight_map = {}
    for name, part in zip(names, halves):
      shard = {key: state[key] for key in part}
      if layout == "sharded":
        save_file(shard, str(directory / name), metadata={"format": "pt"})
      else:
        torch.save(shard, directory / name)
      weight_map.update({key: name for key in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                            for t in state.values())},
             "weight_map": weight_map}
    (directory / f"{stem}.{suffix}.index.json").write_text(json.dumps(index, indent=2))
  else:
    raise ValueError(f"layout={layout!r}")
  if training_files:
    torch.save({"step": 3}, directory / TRAINING_FILES[0])
    (directory / TRAINING_FILES[1]).write_text("learning_rate = 1e-4\n")
  return directory


def target_config(**changes) -> dict:
  """A Hugging Face Qwen3ForCausalLM ``config.json`` at the tiny sizes (the target the
  tiny drafter was trained for: ``TARGET_LAYERS`` layers)."""
  config = {
      "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
      "attention_dropout": 0.0, "dtype": "float32", "eos_token_id": VOCAB - 2,
      "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": HIDDEN,
      "intermediate_size": INTERMEDIATE, "max_position_embeddings": 256,
      "model_type": "qwen3", "num_attention_heads": HEADS,
      "num_hidden_layers": TARGET_LAYERS, "num_key_value_heads": KV_HEADS,
      "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000.0,
                                                "rope_type": "default"},
      "sliding_window": None, "tie_word_embeddings": False, "use_sliding_window": False,
      "vocab_size": VOCAB,
  }
  config.update(changes)
  return config


def target_state_dict(num_layers: int = TARGET_LAYERS, seed: int = 0,
                      dtype=torch.float32) -> dict[str, torch.Tensor]:
  """Every tensor of a tiny Qwen3ForCausalLM checkpoint, under the released names
  (``model.layers.N.self_attn.q_proj.weight``, …), with random values."""
  torch.manual_seed(seed)
  shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,),
            "lm_head.weight": (VOCAB, HIDDEN)}
  for layer in range(num_layers):
    for key, shape in backbone_keys().items():
      if key.startswith("layers.0."):
        shapes[f"model.layers.{layer}.{key.removeprefix('layers.0.')}"] = shape
  return {key: (torch.randn(shape) * 0.5).to(dtype) for key, shape in shapes.items()}


def write_target(directory: Path, config: dict | None = None,
                 state: dict[str, torch.Tensor] | None = None) -> Path:
  """A tiny Qwen3 target checkpoint directory (config.json + model.safetensors)."""
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(
      target_config() if config is None else config, indent=2))
  save_file(target_state_dict() if state is None else state,
            str(directory / "model.safetensors"), metadata={"format": "pt"})
  return directory
