"""The DSpark drafter: a parallel backbone that drafts a block, then the serial head walk.

Per decode iteration (DeepSpec's inference path):

- context: the target's hidden states at ``target_layer_ids`` (layer ``l``'s output;
  -1 = the embeddings) of every committed position, concatenated in that order, through
  ``fc`` and ``hidden_norm``. Each draft layer projects the context to keys and values
  once (no input norm on the context), so they live in a KV cache like the target's,
  written for the positions the target just verified (``context_kv``);
- block: embeddings of ``[last committed token, mask × (block_size − 1)]`` at positions
  ``start … start + block_size − 1``;
- each draft layer is a pre-norm Qwen3 layer whose attention is non-causal over the
  context keys plus the whole block, with per-head q/k RMSNorm and RoPE at absolute
  positions; ``hidden = norm(h)``, ``base = lm_head(hidden)``; block position k drafts
  the token at ``start + k + 1``;
- the serial head (``wts_jax.walk``) turns ``base`` [B, k, V] and ``hidden`` into the
  draft tokens, the corrected logits (the draft distribution q) and the confidence.

The block always has ``block_size`` positions (the attention is non-causal, so its
length changes every position's output; training used ``block_size``); a walk of
``k < block_size`` steps reads the first k.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.heads.config import HeadConfig
from wts_jax.heads.draft_head import DraftHead
from wts_jax.specdecode import attention
from wts_jax.specdecode.numerics import linear, rms_norm, rotary, rotation_tables, write_rows
from wts_jax.specdecode.qkv_attention import attend_in_kernel, attends_in_kernel
from wts_jax.specdecode.qwen3 import (Embedding, KVCache, Qwen3Config, Weight, assemble,
                                check_keys, decoder_layers, expected_keys, finish_layer,
                                output_logits, project_qkv, projections)

# Walks the decode loop can run: the walk's implementations, or "none" (no serial
# head: the backbone's own tokens, as a DFlash drafter drafts).
WALKS = ("auto", "pallas", "xla", "none")
# Weights stored fused (``qwen3.FUSED``): q stays apart, as the context's keys and values
# are products of k and v alone.
DRAFTER_FUSIONS = ("kv_proj", "gate_up_proj")
DSPARK_MASK_TOKEN = 151_669
DSPARK_BLOCK = 7
DSPARK_TARGET_LAYERS = (1, 9, 17, 25, 33)


@dataclasses.dataclass(frozen=True)
class DSparkConfig:
  """A DSpark drafter: its layers' shapes and the drafter fields.

  layers: the draft layers' Qwen3 shapes (``num_layers`` = the draft layers, N; the
  vocabulary is the target's); head: the serial head (None: a DFlash drafter, no
  serial head); num_target_layers: the target's depth when the config states it.
  """

  layers: Qwen3Config
  target_layer_ids: tuple[int, ...]
  block_size: int
  mask_token_id: int
  head: HeadConfig | None
  num_target_layers: int | None = None

  def __post_init__(self):
    if self.layers.tie_word_embeddings:
      raise ValueError("layers.tie_word_embeddings=True; DSpark drafters keep their own "
                       "lm_head")
    if not self.target_layer_ids or any(
        b <= a for a, b in zip(self.target_layer_ids, self.target_layer_ids[1:])) or (
            self.target_layer_ids[0] < -1):
      raise ValueError(f"target_layer_ids={self.target_layer_ids!r} must be strictly "
                       "increasing ids in {-1} ∪ [0, target layers)")
    if self.block_size < 1:
      raise ValueError(f"block_size={self.block_size!r} must be >= 1")
    if not 0 <= self.mask_token_id < self.layers.vocab_size:
      raise ValueError(f"mask_token_id={self.mask_token_id!r} must be in [0, "
                       f"vocab_size={self.layers.vocab_size})")
    if self.head is not None and (self.head.vocab_size, self.head.hidden_size) != (
        self.layers.vocab_size, self.layers.hidden_size):
      raise ValueError(f"head vocab/hidden ({self.head.vocab_size}, "
                       f"{self.head.hidden_size}) differ from the drafter's "
                       f"({self.layers.vocab_size}, {self.layers.hidden_size})")

  @property
  def vocab_size(self) -> int:
    return self.layers.vocab_size

  @classmethod
  def for_target(cls, target: Qwen3Config, *, num_layers: int = 5,
                 target_layer_ids: tuple[int, ...] = DSPARK_TARGET_LAYERS,
                 block_size: int = DSPARK_BLOCK, mask_token_id: int | None = None,
                 head_type: str | None = "vanilla", rank: int = 256,
                 confidence: bool = True) -> "DSparkConfig":
    """A drafter shaped like the released DSpark drafters of ``target``."""
    layers = dataclasses.replace(target, num_layers=num_layers, tie_word_embeddings=False)
    head = None if head_type is None else HeadConfig(
        vocab_size=target.vocab_size, rank=rank, hidden_size=target.hidden_size,
        head_type=head_type, confidence=confidence)
    if mask_token_id is None:
      mask_token_id = min(DSPARK_MASK_TOKEN, target.vocab_size - 1)
    return cls(layers, tuple(target_layer_ids), block_size, mask_token_id, head,
               target.num_layers)

  @classmethod
  def qwen3_4b(cls, head_type: str | None = "vanilla") -> "DSparkConfig":
    return cls.for_target(Qwen3Config.qwen3_4b(), head_type=head_type)

  @classmethod
  def qwen3_8b(cls, head_type: str | None = "vanilla") -> "DSparkConfig":
    return cls.for_target(Qwen3Config.qwen3_8b(), head_type=head_type)

  @classmethod
  def tiny(cls, target: Qwen3Config, *, head_type: str | None = "vanilla",
           block_size: int = 4, target_layer_ids: tuple[int, ...] = (0, 2),
           rank: int = 8, confidence: bool = True) -> "DSparkConfig":
    return cls.for_target(target, num_layers=2, target_layer_ids=target_layer_ids,
                          block_size=block_size, head_type=head_type, rank=rank,
                          confidence=confidence, mask_token_id=target.vocab_size - 1)


def backbone_keys(config: DSparkConfig) -> dict[str, tuple[int, ...]]:
  """Every backbone tensor of a DeepSpec drafter checkpoint (DeepSpec keys) and its shape."""
  d = config.layers.hidden_size
  keys = expected_keys(config.layers)
  keys["fc.weight"] = (d, len(config.target_layer_ids) * d)
  keys["hidden_norm.weight"] = (d,)
  return keys


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Draft:
  """One iteration's draft: tokens [B, k]; q_logits [B, k, V] fp32 (the logits the
  tokens were drawn from, None for greedy); confidence [B, k] raw logits or None;
  status: the walk's status word (``wts_jax.WalkOutput.status``; 0 without a walk)."""

  tokens: jax.Array
  q_logits: jax.Array | None
  confidence: jax.Array | None
  status: jax.Array


class DSparkDrafter(nnx.Module):
  """The DSpark drafter. Backbone attribute paths are DeepSpec's keys, but for the fused
  weights (``DRAFTER_FUSIONS``); ``head`` is the ``DraftHead`` (``markov_head.*``,
  ``confidence_head.*``) or None."""

  def __init__(self, config: DSparkConfig, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16,
               dtype=jnp.bfloat16):
    c = config.layers
    self.config = config
    self.dtype = dtype
    self.embed_tokens = Embedding(c.vocab_size, c.hidden_size, rngs=rngs,
                                  param_dtype=param_dtype)
    features = len(config.target_layer_ids) * c.hidden_size
    self.fc = Weight((jax.random.normal(rngs.params(), (c.hidden_size, features))
                      * features ** -0.5).astype(param_dtype))
    self.hidden_norm = Weight(jnp.ones((c.hidden_size,), param_dtype))
    self.layers = decoder_layers(c, c.num_layers, rngs=rngs, param_dtype=param_dtype,
                                 fusions=DRAFTER_FUSIONS)
    self.norm = Weight(jnp.ones((c.hidden_size,), param_dtype))
    self.lm_head = Weight((jax.random.normal(rngs.params(), (c.vocab_size, c.hidden_size))
                           * c.hidden_size ** -0.5).astype(param_dtype))
    self.head = (None if config.head is None
                 else DraftHead(config.head, rngs=rngs, param_dtype=param_dtype))

  def empty_cache(self, batch: int, max_len: int) -> KVCache:
    """A context cache for ``max_len`` positions and one block past them: ``block``
    writes its keys and values after the context before it attends."""
    c = self.config.layers
    return KVCache.empty(c.num_layers, batch, max_len + self.config.block_size,
                         c.num_kv_heads, c.head_dim, self.dtype)

  def context_kv(self, features: jax.Array, start: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys and values [N, B, Kv, T, h] of target features [B, T, n·d] at ``start + t``."""
    c = self.config.layers
    batch, steps, _ = features.shape
    context = rms_norm(linear(features.astype(self.dtype), self.fc.weight[...]),
                       self.hidden_norm.weight[...], c.rms_norm_eps)
    positions = start[:, None] + jnp.arange(steps, dtype=jnp.int32)[None]
    keys, values = [], []
    for layer in self.layers:
      w = layer.weights()
      p = projections(context, w, ("k_proj", "v_proj"), c)
      k = p["k_proj"].reshape(batch, steps, c.num_kv_heads, c.head_dim)
      v = p["v_proj"].reshape(batch, steps, c.num_kv_heads, c.head_dim)
      k = rotary(rms_norm(k, w["k_norm"], c.rms_norm_eps), positions, c.rope_theta)
      keys.append(k.transpose(0, 2, 1, 3))
      values.append(v.transpose(0, 2, 1, 3))
    return jnp.stack(keys), jnp.stack(values)

  def block(self, last_tokens: jax.Array, start: jax.Array, context: KVCache, *,
            attention_impl: str = "xla") -> tuple[jax.Array, jax.Array, KVCache]:
    """The backbone over one block: (base logits [B, bs, V], hidden [B, bs, d], context).
    Logits and hidden are in the compute dtype (as DeepSpec's lm_head returns them: a
    bf16 run hands the walk half the bytes; the walk adds its bias and selects in fp32).

    ``last_tokens`` [B] sits at position ``start[b]``; ``context`` holds the context
    keys of positions ``[0, start[b])``. The block's keys and values are written into it
    at ``start[b] + t`` first, so each layer attends over the cache alone; the context
    returned holds them there, past every row's context, where the next context write
    or block overwrites them. attention_impl: ``wts_jax.specdecode.attention``'s.
    """
    cfg = self.config
    c = cfg.layers
    batch, steps = last_tokens.shape[0], cfg.block_size
    block_ids = jnp.full((batch, steps), cfg.mask_token_id, jnp.int32)
    block_ids = block_ids.at[:, 0].set(last_tokens.astype(jnp.int32))
    h = jnp.take(self.embed_tokens.weight[...], block_ids, axis=0).astype(self.dtype)
    positions = start[:, None] + jnp.arange(steps, dtype=jnp.int32)[None]
    written_keys, written_values = [], []
    in_kernel = attends_in_kernel(c, self.layers[0].names, attention_impl)
    if in_kernel:
      cos, sin = rotation_tables(positions, c.head_dim, c.rope_theta)
    for index, layer in enumerate(self.layers):
      weights = layer.weights()
      if in_kernel:
        attended, keys, values, _ = attend_in_kernel(
            h, weights, c, cos, sin, context.keys[index], context.values[index], start,
            causal=False)
      else:
        q, k, v = project_qkv(h, weights, c, positions)
        keys = write_rows(context.keys[index], k, start)
        values = write_rows(context.values[index], v, start)
        attended = attention.attend_written(q, keys, values, start, causal=False,
                                            impl=attention_impl)
      h = finish_layer(h, attended, weights, c)
      written_keys.append(keys)
      written_values.append(values)
    hidden = rms_norm(h, self.norm.weight[...], c.rms_norm_eps)
    return (output_logits(hidden, self.lm_head.weight[...]), hidden,
            KVCache(tuple(written_keys), tuple(written_values)))

  def draft(self, base: jax.Array, hidden: jax.Array, last_tokens: jax.Array, *,
            temperature: float, key: jax.Array | None, walk_impl: str = "auto",
            walk_config=None) -> Draft:
    """Draft ``k = base.shape[1]`` tokens from the block's first k positions.

    walk_impl: ``"auto"`` / ``"pallas"`` / ``"xla"`` (``wts_jax.walk``'s ``impl``), or
    ``"none"`` (draft from the base logits alone, also what a drafter without a serial
    head does). walk_config: the walk's kernel config (``wts_jax.walk``'s ``config``).
    """
    from wts_jax.api import walk   # the package's public entry point
    sampling = temperature > 0
    if walk_impl == "none" or self.head is None:
      if sampling:   # in fp32: verification's q must be the very distribution drawn from
        base = base.astype(jnp.float32)
        tokens = jax.random.categorical(key, base / temperature, axis=-1).astype(jnp.int32)
        return Draft(tokens, base, None, jnp.int32(0))
      return Draft(jnp.argmax(base, axis=-1).astype(jnp.int32), None, None, jnp.int32(0))
    hidden = hidden if self.head.config.needs_hidden else None
    out = walk(self.head, base, last_tokens, hidden, temperature=temperature,
               key=key if sampling else None, return_logits=sampling, impl=walk_impl,
               config=walk_config)
    return Draft(out.tokens, out.logits, out.confidence, out.status)


def make_dspark(config: DSparkConfig, *, seed: int = 0, param_dtype=jnp.bfloat16,
                dtype=jnp.bfloat16) -> DSparkDrafter:
  """A random-weight drafter (tests, benchmarks), drawn on the device in one program."""
  return nnx.jit(lambda: DSparkDrafter(config, rngs=nnx.Rngs(seed), param_dtype=param_dtype,
                                       dtype=dtype))()


def config_from_converted(manifest: dict[str, Any], where: str) -> DSparkConfig:
  """The ``DSparkConfig`` of a ``wts-convert`` directory's manifest."""
  from wts_jax.convert.drafter_config import DrafterConfig
  drafter = DrafterConfig.from_json(manifest["drafter"], f"{where}/wts_config.json")
  layers = Qwen3Config.from_hf(manifest["source_config"], where)
  head = None if manifest["head"] is None else HeadConfig(**manifest["head"])
  return DSparkConfig(layers, drafter.target_layer_ids, drafter.block_size,
                      drafter.mask_token_id, head, drafter.num_target_layers)


def load_dspark(path: str | Path, *, dtype=jnp.bfloat16, param_dtype=None) -> DSparkDrafter:
  """The whole drafter from a ``wts-convert --full`` directory.

  The backbone is checked against the strict key table of the drafter's config (a
  missing, extra or misshapen tensor is an error); the serial head comes from
  ``wts_jax.load_drafter``. ``dtype`` is the compute dtype, ``param_dtype`` (default
  ``dtype``) the stored one. A directory converted without ``--full`` is refused.
  """
  from wts_jax.convert.manifest import read_manifest
  from wts_jax.loading import load_drafter
  directory = Path(path)
  param_dtype = dtype if param_dtype is None else param_dtype
  config = config_from_converted(read_manifest(directory), str(directory))
  weights = load_drafter(directory, dtype=param_dtype)
  if weights.backbone is None:
    raise ValueError(f"{directory}: holds no drafter backbone; convert with "
                     "`wts-convert SRC DST --full`")
  expected = backbone_keys(config)
  present = {key: tuple(value.shape) for key, value in weights.backbone.items()}
  check_keys(present, expected, str(directory),
             optional=("confidence_head.proj.weight", "confidence_head.proj.bias"))
  backbone_only = dataclasses.replace(config, head=None)
  drafter = assemble(
      lambda: DSparkDrafter(backbone_only, rngs=nnx.Rngs(0), param_dtype=param_dtype,
                            dtype=dtype),
      expected, lambda key: weights.backbone[key], str(directory))
  drafter.config = config
  drafter.head = nnx.data(weights.head)
  return drafter
