"""The Qwen3 dense decoder (the target model) in Flax NNX, with a static-shape KV cache.

One forward serves prefill and verification: ``Qwen3.forward(tokens [B, T], start [B],
cache)`` runs T new tokens per row at positions ``start[b] + t`` over the row's cached
keys ``[0, start[b])`` plus the new ones (causal among them), so rows of different
lengths share one batch. It returns the new keys and values instead of writing them:
the decode loop writes them with ``KVCache.write`` once it knows what was committed,
and a rejected draft token's entry is simply overwritten later (``start`` masks it).

Weights keep the Hugging Face layout (Linear ``[out, in]``), so the checkpoint loads
without transposes. Each layer is a module of its own and the forward is a Python loop
over them: every matmul reads its weight where it lies. (A ``lax.scan`` over weights
stacked on a layer axis slices each layer's weights into a fresh buffer before its
matmuls read them, three times the bytes a decode step must move; ``docs/decisions.md``,
"Per-layer weights".) ``hidden_size`` and ``num_heads * head_dim`` may differ
(Qwen3-4B: 2560 and 4096).
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wts_jax.specdecode import attention, qkv_attention
from wts_jax.specdecode.cache_attention import precision
from wts_jax.specdecode.numerics import (linear, rms_norm, rotary, rotation_tables,
                                        write_rows)

QWEN3_VOCAB = 151_936


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
  """Shapes and constants of a Qwen3 dense model (Hugging Face names in comments).

  num_layers: ``num_hidden_layers``; num_heads / num_kv_heads:
  ``num_attention_heads`` / ``num_key_value_heads``; tie_word_embeddings: the output
  projection is the embedding (Qwen3-4B) rather than its own ``lm_head`` (Qwen3-8B).
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1_000_000.0
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 40_960

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a positive int")
    for name in ("rms_norm_eps", "rope_theta"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
          math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} must be a real number > 0")
    if not isinstance(self.tie_word_embeddings, bool):
      raise ValueError(f"tie_word_embeddings={self.tie_word_embeddings!r} must be a bool")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even (rotary halves)")

  @classmethod
  def qwen3_4b(cls) -> "Qwen3Config":
    return cls(vocab_size=QWEN3_VOCAB, hidden_size=2560, intermediate_size=9728,
               num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
               tie_word_embeddings=True)

  @classmethod
  def qwen3_8b(cls) -> "Qwen3Config":
    return cls(vocab_size=QWEN3_VOCAB, hidden_size=4096, intermediate_size=12288,
               num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
               tie_word_embeddings=False)

  @classmethod
  def tiny(cls, vocab_size: int = 96, num_layers: int = 4, **changes) -> "Qwen3Config":
    """CPU-test sizes with the real structure: GQA, ``num_heads * head_dim != hidden``."""
    fields = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                  num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=16,
                  rope_theta=10_000.0, max_position_embeddings=4096)
    fields.update(changes)
    return cls(**fields)

  @classmethod
  def from_hf(cls, config: dict[str, Any], where: str = "config.json") -> "Qwen3Config":
    """From a Hugging Face Qwen3 ``config.json`` dict (transformers 4.x or 5.x).

    Every field is read with its JSON type and range checked (``ConfigFields``), and a
    field that would change the numbers in a way this model does not implement (RoPE
    scaling, sliding-window attention, another activation, q/k/v/o biases) is refused:
    each error is one ``ValueError`` line naming ``where`` and the field.
    """
    from wts_jax.convert.config_fields import ConfigFields
    fields = ConfigFields(config, where)
    missing = [name for name in ("vocab_size", "hidden_size", "intermediate_size",
                                 "num_hidden_layers", "num_attention_heads")
               if name not in fields]
    if missing:
      raise fields.error(f"lacks {missing}, which every Qwen3 config has")
    # transformers 5 keeps RoPE under rope_parameters, 4.x under rope_theta/rope_scaling.
    theta = fields.number("rope_theta", None, above=0)
    for name in ("rope_parameters", "rope_scaling"):
      rope = fields.section(name)
      if rope is None:
        continue
      rope_type = rope.text("rope_type", rope.text("type", "default"))
      if rope_type != "default":
        raise fields.error(f"{name}.rope_type={rope_type!r} is not supported: wts_jax "
                           "runs plain RoPE only (rope_scaling / rope_parameters of "
                           "rope_type 'default')")
      if theta is None:
        theta = rope.number("rope_theta", None, above=0)
    if fields.flag("attention_bias", False):
      raise fields.error("attention_bias=True is not supported: Qwen3 has no q/k/v/o "
                         "biases")
    fields.choice("hidden_act", ("silu",), "silu")
    if fields.flag("use_sliding_window", False):
      raise fields.error("use_sliding_window=True is not supported: wts_jax's Qwen3 "
                         "attends over the whole context")
    hidden = fields.positive_int("hidden_size")
    heads = fields.positive_int("num_attention_heads")
    kv_heads = fields.positive_int("num_key_value_heads", heads)
    if heads % kv_heads:
      raise fields.error(f"num_attention_heads={heads} must be a multiple of "
                         f"num_key_value_heads={kv_heads}")
    head_dim = fields.positive_int("head_dim", hidden // heads)
    if head_dim % 2:
      raise fields.error(f"head_dim={head_dim} must be even (RoPE rotates halves)")
    values = dict(vocab_size=fields.positive_int("vocab_size"), hidden_size=hidden,
                  intermediate_size=fields.positive_int("intermediate_size"),
                  num_layers=fields.positive_int("num_hidden_layers"), num_heads=heads,
                  num_kv_heads=kv_heads, head_dim=head_dim,
                  rms_norm_eps=fields.number("rms_norm_eps", 1e-6, above=0),
                  rope_theta=1_000_000.0 if theta is None else theta,
                  tie_word_embeddings=fields.flag("tie_word_embeddings", False),
                  max_position_embeddings=fields.positive_int("max_position_embeddings",
                                                              40_960))
    try:
      return cls(**values)
    except ValueError as err:   # a default derived from other fields (head_dim)
      raise fields.error(str(err)) from None


# ----------------------------------------------------------------------------- numerics

def projections(x: jax.Array, layer: dict[str, jax.Array], wanted: tuple[str, ...],
                c: "Qwen3Config") -> dict[str, jax.Array]:
  """``x``'s products with the ``wanted`` weights (``LAYER_WEIGHTS`` names), one product
  a stored matrix: a fused weight's (``FUSED``) output is split by its parts' rows."""
  rows = {name: shape[0] for name, shape in layer_weight_shapes(c).items()}
  out = {}
  for name, weight in layer.items():
    parts = FUSED.get(name, (name,))
    if not any(part in wanted for part in parts):
      continue
    y = linear(x, weight)
    bounds = np.cumsum([rows[part] for part in parts])[:-1].tolist()
    out.update(zip(parts, jnp.split(y, bounds, axis=-1)))
  return out


def mlp(x: jax.Array, layer: dict[str, jax.Array], c: "Qwen3Config") -> jax.Array:
  """SwiGLU: ``down(silu(gate(x)) * up(x))``."""
  p = projections(x, layer, ("gate_proj", "up_proj"), c)
  return linear(jax.nn.silu(p["gate_proj"]) * p["up_proj"], layer["down_proj"])


# From this many rows (batch × steps) the query/key norm's scale is kept apart: XLA
# otherwise writes the normed heads in fp32 for the key write and the queries to read
# (docs/decisions.md); below it, the fused norm is one kernel fewer a layer.
QK_SCALE_APART_ROWS = 256


def project_qkv(h: jax.Array, layer: dict[str, jax.Array], c: "Qwen3Config",
                positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A layer's queries [B, T, H, h], keys and values [B, Kv, T, h] (normed, rotated;
  the keys and values in the cache's layout)."""
  batch, steps, _ = h.shape
  x = rms_norm(h, layer["input_layernorm"], c.rms_norm_eps)
  p = projections(x, layer, ("q_proj", "k_proj", "v_proj"), c)
  # The query and key heads normed and rotated as one array: their per-head norms are
  # then one reduction (one kernel), not one each.
  heads = c.num_heads + c.num_kv_heads
  qk = jnp.concatenate([p["q_proj"], p["k_proj"]], axis=-1).reshape(
      batch, steps, heads, c.head_dim)
  norm = jnp.concatenate([jnp.broadcast_to(layer["q_norm"], (c.num_heads, c.head_dim)),
                          jnp.broadcast_to(layer["k_norm"], (c.num_kv_heads, c.head_dim))])
  qk = rotary(rms_norm(qk, norm, c.rms_norm_eps,
                      scale_apart=batch * steps >= QK_SCALE_APART_ROWS),
              positions, c.rope_theta)
  q, k = qk[:, :, :c.num_heads], qk[:, :, c.num_heads:]
  v = p["v_proj"].reshape(batch, steps, c.num_kv_heads, c.head_dim)
  return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)


def finish_layer(h: jax.Array, attended: jax.Array, layer: dict[str, jax.Array],
                 c: "Qwen3Config") -> jax.Array:
  """The rest of a pre-norm layer after attention: o_proj, residual, MLP, residual."""
  h = h + linear(attended, layer["o_proj"])
  return h + mlp(rms_norm(h, layer["post_attention_layernorm"], c.rms_norm_eps), layer, c)


# ----------------------------------------------------------------------------- modules

# The per-layer weights and the Hugging Face key part each one loads from.
LAYER_WEIGHTS = {
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "o_proj": "self_attn.o_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "gate_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
}

# Weights a module stores as one matrix, rows in this order: the products that read the
# same input run as one GEMM over a weight laid out at load time. Left apart, XLA merges
# them at every call, which cuBLAS reads from a concatenated copy (docs/decisions.md).
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
         "kv_proj": ("k_proj", "v_proj"),
         "gate_up_proj": ("gate_proj", "up_proj")}
TARGET_FUSIONS = ("qkv_proj", "gate_up_proj")


def layer_weight_shapes(config: Qwen3Config) -> dict[str, tuple[int, ...]]:
  """The shape of one layer's weight, by ``LAYER_WEIGHTS`` name."""
  d, heads, kv = config.hidden_size, config.num_heads, config.num_kv_heads
  h, inter = config.head_dim, config.intermediate_size
  return {"input_layernorm": (d,), "post_attention_layernorm": (d,),
          "q_proj": (heads * h, d), "k_proj": (kv * h, d), "v_proj": (kv * h, d),
          "o_proj": (d, heads * h), "q_norm": (h,), "k_norm": (h,),
          "gate_proj": (inter, d), "up_proj": (inter, d), "down_proj": (d, inter)}


def _init(rngs: nnx.Rngs, shape, dtype, *, norm: bool | None = None) -> jax.Array:
  """Random weights: a norm weight (1-D, or ``norm``) around one, so tests exercise it;
  a matrix with rows of unit scale."""
  if norm if norm is not None else len(shape) == 1:
    return (1.0 + 0.1 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  scale = shape[-1] ** -0.5
  return (jax.random.normal(rngs.params(), shape, jnp.float32) * scale).astype(dtype)


class DecoderLayer(nnx.Module):
  """One Qwen3 decoder layer's weights, by ``LAYER_WEIGHTS`` or ``FUSED`` name."""

  def __init__(self, weights: dict[str, jax.Array]):
    self.names = tuple(weights)
    for name, value in weights.items():
      setattr(self, name, nnx.Param(value))

  def weights(self) -> dict[str, jax.Array]:
    return {name: getattr(self, name)[...] for name in self.names}


def _fused(weights: dict, fusions: tuple[str, ...]) -> dict:
  """Stacked layer weights [L, …] (``LAYER_WEIGHTS`` names) with each of ``fusions``
  made of its parts, their rows concatenated."""
  out = dict(weights)
  for name in fusions:
    out[name] = jnp.concatenate([out.pop(part) for part in FUSED[name]], axis=1)
  return out


def decoder_layers(config: Qwen3Config, num_layers: int, *, rngs: nnx.Rngs,
                   param_dtype=jnp.bfloat16, fusions: tuple[str, ...] = ()) -> nnx.List:
  """``num_layers`` random layers; attribute path ``layers.<i>.<name>``, as the
  checkpoint's ``layers.<i>.<...>.weight`` keys, but for the ``fusions`` (``FUSED``
  names), each stored in place of its parts. Each weight is drawn for all layers at once
  (one random draw per name keeps the drawing program small), then split."""
  drawn = _fused({name: _init(rngs, (num_layers, *shape), param_dtype, norm=len(shape) == 1)
                  for name, shape in layer_weight_shapes(config).items()}, fusions)
  # Materialise each draw before it is split: fused into the slices, the generator's
  # whole computation would be compiled into every layer's slice (minutes of GPU
  # compilation at the Qwen3-4B shapes).
  drawn = jax.lax.optimization_barrier(drawn)
  return nnx.List([DecoderLayer({name: weight[i] for name, weight in drawn.items()})
                   for i in range(num_layers)])


class Embedding(nnx.Module):
  def __init__(self, vocab: int, dim: int, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16):
    self.weight = nnx.Param((jax.random.normal(rngs.params(), (vocab, dim), jnp.float32)
                             ).astype(param_dtype))


class Weight(nnx.Module):
  """A single weight under the Hugging Face name ``<module>.weight``."""

  def __init__(self, value: jax.Array):
    self.weight = nnx.Param(value)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
  """Keys and values, one array a layer: ``keys[l]`` [B, Kv, S, h], post-RoPE, in the
  compute dtype (``wts_jax.specdecode.attention``'s layout).

  A row's valid entries are positions ``[0, length)``, with ``length`` kept by the
  caller; what lies beyond is never read. ``S`` is rounded up so that the decode
  kernel can split it (``attention.padded_cache_len``).
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]

  @property
  def max_len(self) -> int:
    return self.keys[0].shape[2]

  @classmethod
  def empty(cls, num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int,
            dtype) -> "KVCache":
    shape = (batch, kv_heads, attention.padded_cache_len(max_len), head_dim)
    return cls(tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)),
               tuple(jnp.zeros(shape, dtype) for _ in range(num_layers)))

  def write(self, new_keys: jax.Array, new_values: jax.Array, start: jax.Array) -> "KVCache":
    """Store ``new_*`` [L, B, Kv, T, h] at positions ``start[b] + t`` of each row, in
    place when the cache is a donated or loop-carried buffer."""
    return KVCache(tuple(write_rows(old, new, start) for old, new in zip(self.keys, new_keys)),
                   tuple(write_rows(old, new, start)
                         for old, new in zip(self.values, new_values)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ForwardOutput:
  """logits [B, T', V] in the compute dtype (T' = T, or the chosen positions);
  keys/values [L, B, Kv, T, h] of the new tokens; features [B, T, n·d] (the requested
  layers' outputs, concatenated) or None; cache: the cache given, with the new tokens'
  keys and values written at ``start[b] + t`` (None without one)."""

  logits: jax.Array
  keys: jax.Array
  values: jax.Array
  features: jax.Array | None
  cache: KVCache | None


def output_logits(h: jax.Array, weight: jax.Array) -> jax.Array:
  """``h Wᵀ`` over the vocabulary, accumulated in fp32 and returned in ``h``'s dtype (as
  ``linear``): a bf16 run writes (and its argmax reads) half the bytes of fp32 logits."""
  return jnp.einsum("btd,vd->btv", h, weight.astype(h.dtype),
                    preferred_element_type=h.dtype, precision=precision(h.dtype))


class Qwen3(nnx.Module):
  """Qwen3 dense decoder. Attribute paths are the Hugging Face keys without ``model.``
  (``layers.<i>.<name>`` holds ``layers.<i>.<...>.weight``), but for the fused weights
  (``TARGET_FUSIONS``), each made of its parts' keys."""

  def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16,
               dtype=jnp.bfloat16):
    self.config = config
    self.dtype = dtype
    self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, rngs=rngs,
                                  param_dtype=param_dtype)
    self.layers = decoder_layers(config, config.num_layers, rngs=rngs,
                                 param_dtype=param_dtype, fusions=TARGET_FUSIONS)
    self.norm = Weight(jnp.ones((config.hidden_size,), param_dtype))
    self.lm_head = (None if config.tie_word_embeddings else Weight(_init(
        rngs, (config.vocab_size, config.hidden_size), param_dtype)))

  def output_weight(self) -> jax.Array:
    head = self.embed_tokens if self.lm_head is None else self.lm_head
    return head.weight[...]

  def empty_cache(self, batch: int, max_len: int) -> KVCache:
    c = self.config
    return KVCache.empty(c.num_layers, batch, max_len, c.num_kv_heads, c.head_dim,
                         self.dtype)

  def forward(self, tokens: jax.Array, start: jax.Array, cache: KVCache | None, *,
              feature_layers: tuple[int, ...] = (),
              logit_positions: jax.Array | None = None,
              attention_impl: str = "xla") -> ForwardOutput:
    """Run ``tokens`` [B, T] at positions ``start[b] + t`` over the cache.

    feature_layers: layer ids whose outputs to return concatenated (-1 = the
    embedding output), the drafter's ``target_layer_ids``. logit_positions: [B, n]
    indices into T for which to compute logits (None: all T; prefill wants one).
    attention_impl: ``wts_jax.specdecode.attention``'s implementation.
    """
    c = self.config
    steps = tokens.shape[1]
    positions = start[:, None] + jnp.arange(steps, dtype=jnp.int32)[None]
    h = jnp.take(self.embed_tokens.weight[...], tokens, axis=0).astype(self.dtype)
    features = {-1: h}
    new_keys, new_values, cache_keys, cache_values = [], [], [], []
    in_kernel = (cache is not None and qkv_attention.attends_in_kernel(
        c, self.layers[0].names, attention_impl))
    if in_kernel:
      cos, sin = rotation_tables(positions, c.head_dim, c.rope_theta)
    for index, layer in enumerate(self.layers):
      weights = layer.weights()
      if in_kernel:
        attended, keys, values, products = qkv_attention.attend_in_kernel(
            h, weights, c, cos, sin, cache.keys[index], cache.values[index], start,
            causal=True)
        # The new keys and values as ``ForwardOutput`` returns them (XLA drops them
        # where no one reads them, as the decode loop does not).
        _, k, v = qkv_attention.heads_of(products, cos, sin, weights["q_norm"],
                                         weights["k_norm"], num_heads=c.num_heads,
                                         kv_heads=c.num_kv_heads, eps=c.rms_norm_eps)
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
      else:
        q, k, v = project_qkv(h, weights, c, positions)
        if cache is None:
          attended = attention.attend(q, k, v, causal=True)
        else:
          # Written first: the cache alone is attended, in one kernel.
          keys = write_rows(cache.keys[index], k, start)
          values = write_rows(cache.values[index], v, start)
          attended = attention.attend_written(q, keys, values, start, causal=True,
                                              impl=attention_impl)
      if cache is not None:
        cache_keys.append(keys)
        cache_values.append(values)
      h = finish_layer(h, attended, weights, c)
      features[index] = h
      new_keys.append(k)
      new_values.append(v)
    if logit_positions is not None:
      h = jnp.take_along_axis(h, logit_positions[..., None], axis=1)
    h = rms_norm(h, self.norm.weight[...], c.rms_norm_eps)
    logits = output_logits(h, self.output_weight())
    out_features = None
    if feature_layers:
      out_features = jnp.concatenate([features[layer] for layer in feature_layers], axis=-1)
    written = None if cache is None else KVCache(tuple(cache_keys), tuple(cache_values))
    return ForwardOutput(logits, jnp.stack(new_keys), jnp.stack(new_values), out_features,
                         written)


def make_qwen3(config: Qwen3Config, *, seed: int = 0, param_dtype=jnp.bfloat16,
               dtype=jnp.bfloat16) -> Qwen3:
  """A random-weight Qwen3 (tests, benchmarks), drawn on the device in one program."""
  return nnx.jit(lambda: Qwen3(config, rngs=nnx.Rngs(seed), param_dtype=param_dtype,
                               dtype=dtype))()


# ----------------------------------------------------------------------------- loading

_LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)$")
_LAYER_PART = {part: name for name, part in LAYER_WEIGHTS.items()}


def layer_key_target(key: str) -> tuple[str, int] | None:
  """``"layers.3.self_attn.q_proj.weight"`` → ``("q_proj", 3)``; None for other keys."""
  match = _LAYER_KEY.match(key)
  if match is None or match.group(2) not in _LAYER_PART:
    return None
  return _LAYER_PART[match.group(2)], int(match.group(1))


def expected_keys(config: Qwen3Config) -> dict[str, tuple[int, ...]]:
  """Every tensor a Qwen3 checkpoint holds (keys without ``model.``) and its shape."""
  keys = {"embed_tokens.weight": (config.vocab_size, config.hidden_size),
          "norm.weight": (config.hidden_size,)}
  for layer in range(config.num_layers):
    for name, shape in layer_weight_shapes(config).items():
      keys[f"layers.{layer}.{LAYER_WEIGHTS[name]}"] = shape
  if not config.tie_word_embeddings:
    keys["lm_head.weight"] = (config.vocab_size, config.hidden_size)
  return keys


def assemble(module_factory, expected: dict[str, tuple[int, ...]], read, where: str):
  """Build a module from checkpoint tensors through the strict key table.

  ``read(key)`` returns a numpy array; ``expected`` the table (key → shape). Every
  expected key is read and its shape checked (``check_keys`` refuses unexpected keys
  first); a layer key lands in ``layers.<i>.<name>``, a fused weight (``FUSED``) is
  its parts' rows concatenated, and a module weight that no key fills is an error.
  """
  abstract = nnx.eval_shape(module_factory)
  graphdef, state = nnx.split(abstract)
  arrays: dict[str, Any] = {}
  for key, shape in expected.items():
    value = read(key)
    if tuple(value.shape) != tuple(shape):
      raise ValueError(f"{where}: {key!r} has shape {list(value.shape)}, the config "
                       f"implies {list(shape)}")
    target = layer_key_target(key)
    arrays[key if target is None else f"layers.{target[1]}.{target[0]}"] = value
  nested: dict = {}
  for path, leaf in nnx.to_flat_state(state):
    name = ".".join(str(part) for part in path)
    prefix, _, last = name.rpartition(".")
    parts = [f"{prefix}.{part}" for part in FUSED.get(last, ())]
    if name not in arrays and parts and all(part in arrays for part in parts):
      arrays[name] = np.concatenate([np.asarray(arrays[part]) for part in parts])
    if name not in arrays:
      raise ValueError(f"{where}: nothing loads {name!r}")
    node = nested
    for part in path[:-1]:
      node = node.setdefault(part, {})
    node[path[-1]] = jnp.asarray(arrays[name], leaf.get_value().dtype)
  nnx.replace_by_pure_dict(state, nested)
  return nnx.merge(graphdef, state)


def check_keys(present: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]],
               where: str, optional: tuple[str, ...] = ()) -> None:
  """Refuse a checkpoint that lacks an expected key or holds an unexpected one."""
  missing = [key for key in expected if key not in present]
  if missing:
    raise ValueError(f"{where}: lacks {missing[:4]}{' …' if len(missing) > 4 else ''}, "
                     "which the config implies")
  extra = [key for key in present if key not in expected and key not in optional]
  if extra:
    raise ValueError(f"{where}: holds {extra[:4]}{' …' if len(extra) > 4 else ''}, which "
                     "the config does not imply (not a Qwen3 dense checkpoint?)")


def load_qwen3(path: str | Path, *, dtype=jnp.bfloat16, param_dtype=None) -> Qwen3:
  """A ``Qwen3`` from a Hugging Face checkpoint directory (config.json + safetensors).

  Keys are the released ones (``model.embed_tokens.weight``,
  ``model.layers.N.self_attn.q_proj.weight``, …, ``lm_head.weight``), checked against
  the config strictly: a missing key, an unexpected key or a wrong shape is an error.
  With tied embeddings a stored ``lm_head.weight`` is ignored. ``dtype`` is the
  compute dtype; ``param_dtype`` (default: ``dtype``) the stored one.
  """
  from wts_jax.convert.formats import NUMPY_DTYPES, open_checkpoint
  param_dtype = dtype if param_dtype is None else param_dtype
  out_dtype = np.dtype(param_dtype).name
  with open_checkpoint(path) as source:
    config = Qwen3Config.from_hf(source.config, source.config_file)
    expected = expected_keys(config)
    optional = ("lm_head.weight",) if config.tie_word_embeddings else ()
    check_keys({key: tensor.shape for key, tensor in source.tensors.items()}, expected,
               source.location, optional)
    if out_dtype not in NUMPY_DTYPES:
      raise ValueError(f"param_dtype={param_dtype!r} must be one of {sorted(NUMPY_DTYPES)}")
    return assemble(
        lambda: Qwen3(config, rngs=nnx.Rngs(0), param_dtype=param_dtype, dtype=dtype),
        expected, lambda key: source.read(key, out_dtype), source.location)


def num_params(config: Qwen3Config) -> int:
  """Parameter count (the bytes a decode step reads, per dtype byte)."""
  per_layer = sum(math.prod(shape) for shape in layer_weight_shapes(config).values())
  out = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
  return (config.vocab_size * config.hidden_size + config.num_layers * per_layer
          + config.hidden_size + out)
