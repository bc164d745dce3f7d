"""Attention of a few new tokens over a row's KV cache: decode, verify, the drafter's block.

Every forward of the decode loop attends T new queries (1 for a decode step, k + 1 for a
verify pass, the block for the drafter) over two parts: the row's cached keys
``[0, cache_len[b])`` and the T new keys (causal among themselves for the target,
all-visible for the drafter's block). The cache layout is ``[B, Kv, S, h]``: a
(row, kv-head) pair's keys are one contiguous ``[S, h]`` matrix, so a batched product
reads it in place, with no transpose.

Two implementations, one contract (``IMPLS``):

- ``"xla"``: one softmax over both parts in fp32. It reads the whole allocated cache
  (masked past each row's length); it is the CPU path and the oracle.
- ``"pallas"``: the cache part through JAX's Pallas GPU decode-attention kernel
  (``jax.experimental.pallas.ops.gpu.decode_attention``, split-K flash decoding), which
  stops each (row, kv-head) at ``cache_len[b]``: a row reads its own keys only, in
  place. It returns the part's unnormalised output with its running max and sum, and
  the new tokens' part (T × T scores, small) is merged in by the log-sum-exp rule. The
  T·G queries of one kv head share one pass over its keys.

A single new token (a decode step) is written into the cache first and attended over
the cache alone (``attend_written``): with the pallas implementation the decode kernel
is then the whole attention, without the new part's scores, softmax pieces and merge.

The cache length must suit the kernel's split (``padded_cache_len``); the caches of
``wts_jax.specdecode`` are allocated that way.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

IMPLS = ("auto", "xla", "pallas")
# The kernel splits each row's keys into up to this many parts, one program each, ...
MAX_KV_SPLITS = 16
# ... and each part must hold a multiple of 16 keys.
_SPLIT_MULTIPLE = 16
# Programs to aim for: two waves of an H200's 132 SMs. Fewer splits than that leave SMs
# idle at small batches; more only add partial outputs to write and reduce.
_TARGET_PROGRAMS = 264


def padded_cache_len(length: int) -> int:
  """The smallest cache length ≥ ``length`` the Pallas kernel can split."""
  unit = MAX_KV_SPLITS * _SPLIT_MULTIPLE
  return -(-max(length, 1) // unit) * unit


def kv_splits(batch: int, kv_heads: int) -> int:
  """Parts each (row, kv head)'s keys are split into: a power of two ≤ MAX_KV_SPLITS,
  enough for ``_TARGET_PROGRAMS`` programs in all."""
  splits = 1
  while splits < MAX_KV_SPLITS and batch * kv_heads * splits < _TARGET_PROGRAMS:
    splits *= 2
  return splits


def resolve(impl: str) -> str:
  """``"auto"`` → ``"pallas"`` on a GPU whose JAX ships the kernel, else ``"xla"``."""
  if impl not in IMPLS:
    raise ValueError(f"attention_impl={impl!r} must be one of {IMPLS}")
  if impl != "auto":
    return impl
  return "pallas" if jax.default_backend() == "gpu" and _kernel() is not None else "xla"


@functools.cache
def _kernel():
  try:
    import warnings
    with warnings.catch_warnings():
      # JAX marks its Triton-lowered ops deprecated; the kernel is still the one it ships.
      warnings.simplefilter("ignore", DeprecationWarning)
      from jax.experimental.pallas.ops.gpu import decode_attention
    return decode_attention.decode_attn_unbatched
  except ImportError:
    return None


def _grouped(q: jax.Array, kv_heads: int) -> jax.Array:
  """q [B, T, H, h] → [B, Kv, G·T, h], the queries each kv head serves (g major)."""
  batch, steps, heads, head_dim = q.shape
  group = heads // kv_heads
  return (q.reshape(batch, steps, kv_heads, group, head_dim)
          .transpose(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * steps, head_dim))


def _ungrouped(out: jax.Array, steps: int) -> jax.Array:
  """[B, Kv, G·T, h] → [B, T, H·h]."""
  batch, kv_heads, rows, head_dim = out.shape
  group = rows // steps
  return (out.reshape(batch, kv_heads, group, steps, head_dim)
          .transpose(0, 3, 1, 2, 4).reshape(batch, steps, kv_heads * group * head_dim))


def _scores(q: jax.Array, keys: jax.Array, scale: float) -> jax.Array:
  """[B, Kv, R, S] fp32 scores of grouped queries [B, Kv, R, h] over keys [B, Kv, S, h]."""
  return jnp.einsum("bkrh,bksh->bkrs", q, keys.astype(q.dtype),
                    preferred_element_type=jnp.float32,
                    precision=precision(q.dtype)) * scale


def _cache_scores(grouped: jax.Array, cache_keys: jax.Array, cache_len: jax.Array,
                  scale: float) -> jax.Array:
  """``_scores`` over the cache, -inf at and past each row's ``cache_len[b]``."""
  visible = jnp.arange(cache_keys.shape[2])[None, :] < cache_len[:, None]   # [B, S]
  return jnp.where(visible[:, None, None], _scores(grouped, cache_keys, scale), -jnp.inf)


def precision(dtype) -> jax.lax.Precision:
  """Full fp32 products for fp32 runs (exactness checks); bf16 runs need no request, and
  asking HIGHEST of bf16 operands could make a backend upcast them."""
  return (jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32
          else jax.lax.Precision.DEFAULT)


def _new_token_mask(steps: int, causal: bool, rows: int) -> jax.Array:
  """[R, T] visibility of the new keys to the grouped query rows (row r is step r % T)."""
  if not causal:
    return jnp.ones((rows, steps), bool)
  query_step = jnp.arange(rows) % steps
  return query_step[:, None] >= jnp.arange(steps)[None, :]


def attend(q: jax.Array, new_keys: jax.Array, new_values: jax.Array, *, causal: bool,
           cache_keys: jax.Array | None = None, cache_values: jax.Array | None = None,
           cache_len: jax.Array | None = None, impl: str = "xla") -> jax.Array:
  """Grouped-query attention of q [B, T, H, h] over a cache and the new tokens.

  new_keys / new_values [B, Kv, T, h]; cache_keys / cache_values [B, Kv, S, h] with
  ``cache_len`` [B] valid entries per row (None: no cache, as in a prefill). causal: the
  new tokens see the new keys up to their own position (else all of them). Returns
  [B, T, H·h] in q's dtype.
  """
  batch, steps, heads, head_dim = q.shape
  kv_heads = new_keys.shape[1]
  scale = head_dim ** -0.5
  grouped = _grouped(q, kv_heads)
  rows = grouped.shape[2]
  new_scores = jnp.where(_new_token_mask(steps, causal, rows)[None, None],
                         _scores(grouped, new_keys, scale), -jnp.inf)
  if cache_keys is None:
    weights = jax.nn.softmax(new_scores, axis=-1)
    out = _weighted(weights, new_values)
  elif resolve(impl) == "xla":
    cache_scores = _cache_scores(grouped, cache_keys, cache_len, scale)
    weights = jax.nn.softmax(jnp.concatenate([cache_scores, new_scores], axis=-1), axis=-1)
    width = cache_keys.shape[2]
    out = (_weighted(weights[..., :width], cache_values)
           + _weighted(weights[..., width:], new_values))
  else:
    out = _pallas_merged(grouped, new_scores, new_values, cache_keys, cache_values,
                         cache_len, scale)
  return _ungrouped(out, steps).astype(q.dtype)


def attend_written(q: jax.Array, cache_keys: jax.Array, cache_values: jax.Array,
                   cache_len: jax.Array, *, impl: str = "xla",
                   interpret: bool = False) -> jax.Array:
  """Attention of one new token per row, q [B, 1, H, h], whose key and value the cache
  already holds at ``cache_len[b]``: over ``[0, cache_len[b] + 1)`` of the cache alone,
  so that the decode kernel is the whole attention (no new-token part to merge in).
  Returns [B, 1, H·h] in q's dtype. ``interpret``: the kernel in Pallas interpret mode."""
  if q.shape[1] != 1:
    raise ValueError(f"attend_written takes one new token per row, not {q.shape[1]}")
  head_dim = q.shape[-1]
  scale = head_dim ** -0.5
  grouped = _grouped(q, cache_keys.shape[1])
  length = cache_len + 1
  if resolve(impl) == "xla":
    scores = _cache_scores(grouped, cache_keys, length, scale)
    out = _weighted(jax.nn.softmax(scores, axis=-1), cache_values)
  else:
    out, total, _ = cache_part(grouped, cache_keys, cache_values, length, scale,
                               interpret=interpret)
    out = out.astype(jnp.float32) / total[..., None]
  return _ungrouped(out, 1).astype(q.dtype)


def _weighted(weights: jax.Array, values: jax.Array) -> jax.Array:
  """fp32 [B, Kv, R, h]: weights [B, Kv, R, S] (fp32) times values [B, Kv, S, h]. The
  weights take the values' dtype: casting the values instead would copy the cache."""
  return jnp.einsum("bkrs,bksh->bkrh", weights.astype(values.dtype), values,
                    preferred_element_type=jnp.float32, precision=precision(values.dtype))


def _pallas_merged(grouped, new_scores, new_values, cache_keys, cache_values, cache_len,
                   scale, *, interpret: bool = False):
  """The cache part by the decode kernel, the new part in XLA, merged by log-sum-exp."""
  cache_out, cache_sum, cache_max = cache_part(grouped, cache_keys, cache_values,
                                               cache_len, scale, interpret=interpret)
  new_max = jnp.max(new_scores, axis=-1)                           # finite: a key is visible
  new_exp = jnp.exp(new_scores - new_max[..., None])
  new_sum = jnp.sum(new_exp, axis=-1)
  new_out = _weighted(new_exp, new_values)
  top = jnp.maximum(cache_max, new_max)
  cache_weight = jnp.exp(cache_max - top)
  new_weight = jnp.exp(new_max - top)
  total = cache_sum * cache_weight + new_sum * new_weight
  out = (cache_out.astype(jnp.float32) * cache_weight[..., None]
         + new_out * new_weight[..., None])
  return out / total[..., None]


def cache_part(grouped, cache_keys, cache_values, cache_len, scale, *,
               interpret: bool = False):
  """(unnormalised out [B, Kv, R, h], sum [B, Kv, R], max [B, Kv, R]) of the grouped
  queries over each row's cached keys ``[0, cache_len[b])``, by JAX's decode kernel."""
  kernel = _kernel()
  if kernel is None:
    raise ValueError("attention='pallas' needs jax.experimental.pallas.ops.gpu."
                     "decode_attention, which this JAX lacks; use attention='xla'")
  width = cache_keys.shape[2]
  if width != padded_cache_len(width):
    raise ValueError(f"a cache of {width} positions cannot be split by the decode "
                     f"kernel; allocate padded_cache_len({width}) = "
                     f"{padded_cache_len(width)}")
  batch, kv_heads, rows, _ = grouped.shape
  splits = kv_splits(batch, kv_heads)
  split = width // splits
  block_k = next(b for b in (128, 64, 32, 16) if split % b == 0)
  one = functools.partial(
      kernel, start_idx=None, sm_scale=scale, block_h=max(16, 1 << (rows - 1).bit_length()),
      block_k=block_k, k_splits=splits, num_warps=None, num_stages=2, grid=None,
      interpret=interpret, debug=False, return_residuals=True, normalize_output=False)
  per_head = jax.vmap(lambda q, k, v, n: one(q, k, v, kv_seq_len=n), in_axes=(0, 0, 0, None))
  out, (total, top) = jax.vmap(per_head)(grouped, cache_keys, cache_values, cache_len)
  return out, total, top
