"""Grouped queries over each row's KV cache, every query row stopping at its own length.

The decode loop writes a forward's new keys and values into the cache before it attends
(written first), so the whole attention of a forward is over the cache: query row ``r``
of batch row ``b`` sees keys ``[0, lengths[b, r])``. A verify pass's step ``t`` sees the
context and the new keys up to its own (``cache_len + t + 1``), the drafter's block sees
all of its keys (``cache_len + T``), a decode step is ``T = 1``.

Two implementations, one contract (fp32 output [B, Kv, R, h]):

- ``reference``: one masked softmax in XLA over the whole allocated cache, fp32 scores;
  the CPU path and the oracle.
- ``split_k``: flash decoding in one Pallas kernel (Triton lowering). Program
  (row, kv head, split) streams its split's keys block by block up to the longest of its
  query rows, masks each query row at its own length, and writes its unnormalised output
  with its running max and sum; XLA merges the splits by the log-sum-exp rule. One pass
  over a (row, kv head)'s keys serves all of its ``G·T`` queries, and a row reads no key
  block past its longest query row (the keys past a length in a block it reads are
  masked out of both products, whatever they hold, if finite). JAX's own decode kernel
  takes one length per (row, kv head), which cannot express a causal block of new
  tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

# The kernel splits each row's keys into up to this many parts, one program each, ...
MAX_SPLITS = 16
# ... and each part must hold a multiple of 16 keys (the smallest key block of a
# tensor-core product).
SPLIT_MULTIPLE = 16
# Programs to aim for: two waves of an H200's 132 SMs. Fewer splits than that leave SMs
# idle at small batches; more only add partial outputs to write and merge.
_TARGET_PROGRAMS = 264
# Finite, so that a query row with no visible key in a block or a split keeps exp(0)
# arithmetic NaN-free; its weight in the merge is exp(_MASKED - max) = 0.
_MASKED = -1e30
KERNEL_NAME = "wts_cache_attention"


def padded_cache_len(length: int) -> int:
  """The smallest cache length ≥ ``length`` the kernel can split."""
  unit = MAX_SPLITS * SPLIT_MULTIPLE
  return -(-max(length, 1) // unit) * unit


def num_splits(batch: int, kv_heads: int) -> int:
  """Parts each (row, kv head)'s keys are split into: a power of two ≤ ``MAX_SPLITS``,
  enough for ``_TARGET_PROGRAMS`` programs in all."""
  splits = 1
  while splits < MAX_SPLITS and batch * kv_heads * splits < _TARGET_PROGRAMS:
    splits *= 2
  return splits


def key_block(split_len: int) -> int:
  """Keys a program reads per step of its loop: the largest of 128, 64, 32, 16 that
  divides ``split_len``."""
  return next(b for b in (128, 64, 32, 16) if split_len % b == 0)


def causal_lengths(cache_len: jax.Array, steps: int, group: int, *,
                   causal: bool) -> jax.Array:
  """[B, G·T] keys each grouped query row sees once ``steps`` new tokens are written at
  ``cache_len[b]``: row ``r`` is step ``r % T`` (g major); causal, step t sees
  ``cache_len + t + 1`` keys, else all ``cache_len + T``."""
  step = jnp.tile(jnp.arange(steps, dtype=jnp.int32), group)
  seen = step + 1 if causal else jnp.full_like(step, steps)
  return cache_len.astype(jnp.int32)[:, None] + seen[None, :]


def precision(dtype) -> lax.Precision:
  """Full fp32 products for fp32 runs (exactness checks); bf16 runs need no request, and
  asking HIGHEST of bf16 operands could make a backend upcast them."""
  return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT


def scores(q: jax.Array, keys: jax.Array, scale: float) -> jax.Array:
  """[B, Kv, R, S] fp32 scores of grouped queries [B, Kv, R, h] over keys [B, Kv, S, h]."""
  return jnp.einsum("bkrh,bksh->bkrs", q, keys.astype(q.dtype),
                    preferred_element_type=jnp.float32,
                    precision=precision(q.dtype)) * scale


def weighted(weights: jax.Array, values: jax.Array) -> jax.Array:
  """fp32 [B, Kv, R, h]: weights [B, Kv, R, S] (fp32) times values [B, Kv, S, h]. The
  weights take the values' dtype: casting the values instead would copy the cache."""
  return jnp.einsum("bkrs,bksh->bkrh", weights.astype(values.dtype), values,
                    preferred_element_type=jnp.float32, precision=precision(values.dtype))


def reference(grouped: jax.Array, keys: jax.Array, values: jax.Array,
              lengths: jax.Array, scale: float) -> jax.Array:
  """fp32 [B, Kv, R, h]: grouped queries [B, Kv, R, h] over keys/values [B, Kv, S, h],
  query row r of row b over ``[0, lengths[b, r])``."""
  visible = jnp.arange(keys.shape[2])[None, None, :] < lengths[:, :, None]   # [B, R, S]
  masked = jnp.where(visible[:, None], scores(grouped, keys, scale), -jnp.inf)
  return weighted(jax.nn.softmax(masked, axis=-1), values)


def _split_kernel(q_ref, lengths_ref, k_ref, v_ref, o_ref, sum_ref, max_ref, *,
                  rows: int, block_k: int, scale: float, exact: bool):
  block_r, _ = q_ref.shape
  split_len = k_ref.shape[0]
  row_valid = jnp.arange(block_r) < rows
  q = pl_triton.load(q_ref, mask=row_valid[:, None], other=0)
  lengths = pl_triton.load(lengths_ref, mask=row_valid, other=0)
  first = pl.program_id(2) * split_len
  stop = jnp.minimum(jnp.max(lengths), first + split_len)
  blocks = jnp.maximum((stop - first + block_k - 1) // block_k, 0)
  precision = lax.Precision.HIGHEST if exact else None

  def block(i, carry):
    out, top, total = carry
    at = pl.multiple_of(i * block_k, block_k)
    keys = k_ref[pl.ds(at, block_k), :]
    scores = pl_triton.dot(q, keys, trans_b=True, precision=precision) * scale
    visible = (first + at + jnp.arange(block_k))[None, :] < lengths[:, None]
    scores = jnp.where(visible, scores, _MASKED)
    new_top = jnp.maximum(top, scores.max(axis=-1))
    correction = jnp.exp(top - new_top)
    weights = jnp.where(visible, jnp.exp(scores - new_top[:, None]), 0.0)
    values = v_ref[pl.ds(at, block_k), :]
    out = correction[:, None] * out + pl_triton.dot(weights.astype(values.dtype), values,
                                                    precision=precision)
    return out, new_top, correction * total + weights.sum(axis=-1)

  init = (jnp.zeros(q_ref.shape, jnp.float32), jnp.full((block_r,), _MASKED, jnp.float32),
          jnp.zeros((block_r,), jnp.float32))
  out, top, total = lax.fori_loop(0, blocks, block, init)
  pl_triton.store(o_ref, out.astype(o_ref.dtype), mask=row_valid[:, None])
  pl_triton.store(sum_ref, total, mask=row_valid)
  pl_triton.store(max_ref, top, mask=row_valid)


def split_k_partials(grouped: jax.Array, keys: jax.Array, values: jax.Array,
                     lengths: jax.Array, scale: float, *, splits: int | None = None,
                     interpret: bool = False):
  """The kernel's per-split (unnormalised out [B, Kv, P, R, h] in q's dtype, sum and max
  [B, Kv, P, R] fp32). splits: P, a power of two ≤ ``MAX_SPLITS`` (None:
  ``num_splits``)."""
  batch, kv_heads, rows, head_dim = grouped.shape
  width = keys.shape[2]
  if width != padded_cache_len(width):
    raise ValueError(f"a cache of {width} positions cannot be split by the attention "
                     f"kernel; allocate padded_cache_len({width}) = "
                     f"{padded_cache_len(width)}")
  if lengths.shape != (batch, rows):
    raise ValueError(f"lengths {lengths.shape} must be [batch, query rows] = "
                     f"{(batch, rows)}")
  if splits is None:
    splits = num_splits(batch, kv_heads)
  elif splits not in [1 << i for i in range(MAX_SPLITS.bit_length())]:
    raise ValueError(f"splits={splits!r} must be a power of two <= {MAX_SPLITS}")
  split_len = width // splits
  block_k = key_block(split_len)
  # A tensor-core product needs ≥ 16 rows; the loads and stores mask the padding.
  block_r = max(16, pl.next_power_of_2(rows))
  kernel = functools.partial(_split_kernel, rows=rows, block_k=block_k, scale=scale,
                             exact=jnp.dtype(grouped.dtype) == jnp.float32)
  partial_shape = (batch, kv_heads, splits, rows)
  return pl.pallas_call(
      kernel,
      grid=(batch, kv_heads, splits),
      in_specs=[
          pl.BlockSpec((None, None, block_r, head_dim), lambda b, k, j: (b, k, 0, 0)),
          pl.BlockSpec((None, block_r), lambda b, k, j: (b, 0)),
          pl.BlockSpec((None, None, split_len, head_dim), lambda b, k, j: (b, k, j, 0)),
          pl.BlockSpec((None, None, split_len, head_dim), lambda b, k, j: (b, k, j, 0)),
      ],
      out_specs=[
          pl.BlockSpec((None, None, None, block_r, head_dim),
                       lambda b, k, j: (b, k, j, 0, 0)),
          pl.BlockSpec((None, None, None, block_r), lambda b, k, j: (b, k, j, 0)),
          pl.BlockSpec((None, None, None, block_r), lambda b, k, j: (b, k, j, 0)),
      ],
      out_shape=[jax.ShapeDtypeStruct((*partial_shape, head_dim), grouped.dtype),
                 jax.ShapeDtypeStruct(partial_shape, jnp.float32),
                 jax.ShapeDtypeStruct(partial_shape, jnp.float32)],
      compiler_params=pl_triton.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name=KERNEL_NAME,
  )(grouped, lengths.astype(jnp.int32), keys, values)


def split_k(grouped: jax.Array, keys: jax.Array, values: jax.Array, lengths: jax.Array,
            scale: float, *, splits: int | None = None,
            interpret: bool = False) -> jax.Array:
  """``reference``'s contract by the kernel and a log-sum-exp merge of its splits
  (``split_k_partials``' ``splits``)."""
  out, total, top = split_k_partials(grouped, keys, values, lengths, scale,
                                     splits=splits, interpret=interpret)
  if out.shape[2] == 1:   # one split: nothing to merge, one division
    return out[:, :, 0].astype(jnp.float32) / total[:, :, 0, :, None]
  weight = jnp.exp(top - top.max(axis=2, keepdims=True))     # [B, Kv, P, R]
  merged = jnp.sum(out.astype(jnp.float32) * weight[..., None], axis=2)
  return merged / jnp.sum(total * weight, axis=2)[..., None]
