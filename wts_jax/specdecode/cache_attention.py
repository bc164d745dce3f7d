"""New tokens' queries over each row's KV cache, every step stopping at its own length.

The decode loop writes a forward's new keys and values into the cache before it attends
(written first), so the whole attention of a forward is over the cache: step ``t`` of
batch row ``b`` sees keys ``[0, lengths[b, t])``. A verify pass's step ``t`` sees the
context and the new keys up to its own (``cache_len + t + 1``), the drafter's block sees
all of its keys (``cache_len + T``), a decode step is ``T = 1``.

Two implementations, one contract (queries [B, T, H, h] in, [B, T, H, h] out; head i
reads kv head i // G):

- ``reference``: one masked softmax in XLA over the whole allocated cache, fp32 scores;
  the CPU path and the oracle.
- ``split_k``: flash decoding in Pallas (Triton lowering). Program
  (row, kv head, split) streams its split's keys block by block up to the longest of its
  steps, masks each step at its own length, and keeps a running max and sum; with one
  split it writes the attention itself, with several a second kernel merges the splits
  by the log-sum-exp rule. Both read the queries and write the result in the forward's
  own layout, so the attention of a layer is one or two kernels with nothing around
  them. One pass over a (row, kv head)'s keys serves all of its ``G·T`` queries, and a
  row reads no key block past its longest step (the keys past a length in a block it
  reads are masked out of both products, whatever they hold, if finite). JAX's own
  decode kernel takes one length per (row, kv head), which cannot express a causal
  block of new tokens.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

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
# Programs to aim for: about one wave of an H200's 132 SMs. Fewer splits leave SMs idle
# at small batches; more add partial outputs to write and merge, which cost more than
# the idle SMs (measured: docs/decisions.md).
_TARGET_PROGRAMS = 128
# Splits the automatic choice stops at: past eight, shorter splits gain nothing (their
# programs are mostly launch and merge), measured likewise.
_MERGED_SPLITS = 8
# Values a merge program holds: its rows' partials of every split over a slice of the
# head dimension (64 a thread at four warps: registers, no spill).
_MERGE_VALUES = 8192
# Finite, so that a query row with no visible key in a block or a split keeps exp(0)
# arithmetic NaN-free; its weight in the merge is exp(MASKED - max) = 0.
MASKED = -1e30
KERNEL_NAME = "wts_cache_attention"
MERGE_KERNEL_NAME = "wts_cache_attention_merge"


def padded_cache_len(length: int) -> int:
  """The smallest cache length ≥ ``length`` the kernel can split."""
  unit = MAX_SPLITS * SPLIT_MULTIPLE
  return -(-max(length, 1) // unit) * unit


def num_splits(batch: int, kv_heads: int) -> int:
  """Parts each (row, kv head)'s keys are split into: a power of two ≤
  ``_MERGED_SPLITS``, enough for ``_TARGET_PROGRAMS`` programs in all."""
  splits = 1
  while splits < _MERGED_SPLITS and batch * kv_heads * splits < _TARGET_PROGRAMS:
    splits *= 2
  return splits


def key_block(split_len: int) -> int:
  """Keys a program reads per step of its loop: the largest of 64, 32, 16 that divides
  ``split_len``. Not 128: a 128-key block's stages fill an SM's shared memory, so one
  program runs an SM where 64-key blocks run several (measured: docs/decisions.md)."""
  return next(b for b in (64, 32, 16) if split_len % b == 0)


# Keys a step of the split kernel's loop may read (a launch's ``block_k``).
KEY_BLOCKS = (16, 32, 64, 128, 256)


class Launch(NamedTuple):
  """How the split kernel runs: keys a step of its loop reads (a power of two ≥ 16 that
  divides a split), warps a program, stages of its load pipeline."""
  block_k: int
  num_warps: int = 4
  # Three stages keep two blocks' loads in flight behind the products (measured faster
  # than two at every batch from 16 rows: docs/decisions.md).
  num_stages: int = 3


def launch(split_len: int) -> Launch:
  """The kernel's own launch for splits of ``split_len`` keys."""
  return Launch(key_block(split_len))


def causal_lengths(cache_len: jax.Array, steps: int, *, causal: bool) -> jax.Array:
  """[B, T] keys each new step sees once ``steps`` new tokens are written at
  ``cache_len[b]``: causal, step t sees ``cache_len + t + 1``, else all
  ``cache_len + T``."""
  step = jnp.arange(steps, dtype=jnp.int32)
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


def grouped(q: jax.Array, kv_heads: int) -> jax.Array:
  """q [B, T, H, h] → [B, Kv, T·G, h], the queries each kv head serves; row r is step
  r // G (head i reads kv head i // G)."""
  batch, steps, heads, head_dim = q.shape
  group = heads // kv_heads
  return (q.reshape(batch, steps, kv_heads, group, head_dim).transpose(0, 2, 1, 3, 4)
          .reshape(batch, kv_heads, steps * group, head_dim))


def ungrouped(out: jax.Array, steps: int) -> jax.Array:
  """``grouped``'s inverse: [B, Kv, T·G, h] → [B, T, H, h]."""
  batch, kv_heads, rows, head_dim = out.shape
  group = rows // steps
  return (out.reshape(batch, kv_heads, steps, group, head_dim).transpose(0, 2, 1, 3, 4)
          .reshape(batch, steps, kv_heads * group, head_dim))


def reference(q: jax.Array, keys: jax.Array, values: jax.Array, lengths: jax.Array,
              scale: float) -> jax.Array:
  """fp32 [B, T, H, h]: queries q [B, T, H, h] over keys/values [B, Kv, S, h] (head i
  reads kv head i // G), step t of row b over ``[0, lengths[b, t])``."""
  group = q.shape[2] // keys.shape[1]
  row_lengths = jnp.repeat(lengths, group, axis=1)                        # [B, T·G]
  visible = jnp.arange(keys.shape[2])[None, None, :] < row_lengths[:, :, None]
  masked = jnp.where(visible[:, None], scores(grouped(q, keys.shape[1]), keys, scale),
                     -jnp.inf)
  return ungrouped(weighted(jax.nn.softmax(masked, axis=-1), values), q.shape[1])


def query_blocks(steps: int, group: int) -> tuple[int, int]:
  """Query steps and heads a program holds: powers of two ≥ T and ≥ G (Triton's tensors
  are), at least 16 rows in all (the smallest tensor-core product)."""
  block_g = pl.next_power_of_2(group)
  block_t = max(pl.next_power_of_2(steps), -(-16 // block_g))
  return block_t, block_g


def query_rows(ref, steps: int, group: int):
  """A [block_t, block_g, ...] block's valid (step, head) entries: step < T, head < G."""
  block_t, block_g = ref.shape[:2]
  return ((jnp.arange(block_t) < steps)[:, None] & (jnp.arange(block_g) < group)[None, :])


def _store_attention(o_ref, out, total, valid):
  """Rows [block_r, h] of unnormalised output over their sums, stored into a
  [block_t, block_g, h] block of the queries' layout at its ``valid`` entries (a row
  that saw no key, padding, has sum 0 and is not stored)."""
  block_t, block_g, head_dim = o_ref.shape
  out = out / jnp.where(total > 0, total, 1.0)[:, None]
  pl_triton.store(o_ref, out.reshape(block_t, block_g, head_dim).astype(o_ref.dtype),
                  mask=valid[:, :, None])


def _split_kernel(q_ref, lengths_ref, k_ref, v_ref, *out_refs, steps: int, group: int,
                  block_k: int, scale: float, exact: bool):
  block_t, block_g, head_dim = q_ref.shape
  block_r = block_t * block_g
  valid = query_rows(q_ref, steps, group)                                # [block_t, block_g]
  # Row r = t·block_g + g: the block's [step, head] entries as the product's rows.
  q = pl_triton.load(q_ref, mask=valid[:, :, None], other=0).reshape(block_r, head_dim)
  step_lengths = pl_triton.load(lengths_ref, mask=jnp.arange(block_t) < steps, other=0)
  lengths = jnp.where(valid, step_lengths[:, None], 0).reshape(block_r)
  precision = lax.Precision.HIGHEST if exact else None
  init = (jnp.zeros((block_r, head_dim), jnp.float32),
          jnp.full((block_r,), MASKED, jnp.float32), jnp.zeros((block_r,), jnp.float32))
  out, top, total = attend_split(q, k_ref, v_ref, lengths, init, block_k=block_k,
                                 scale=scale, precision=precision)
  store_split(out_refs, out, top, total, valid)


def attend_split(q, k_ref, v_ref, lengths, carry, *, block_k: int, scale: float,
                 precision):
  """Inside a split program: the running (unnormalised output, max, sum) of query rows
  q [R, h], carried on from ``carry``, over the keys of this program's split
  (``k_ref``/``v_ref`` [split_len, h], split ``program_id(2)``) before each row's
  ``lengths`` [R], block by block, reading no block past the longest."""
  split_len = k_ref.shape[0]
  first = pl.program_id(2) * split_len
  stop = jnp.minimum(jnp.max(lengths), first + split_len)
  blocks = jnp.maximum((stop - first + block_k - 1) // block_k, 0)

  def block(i, carry):
    out, top, total = carry
    at = pl.multiple_of(i * block_k, block_k)
    keys = k_ref[pl.ds(at, block_k), :]
    scores = pl_triton.dot(q, keys, trans_b=True, precision=precision) * scale
    visible = (first + at + jnp.arange(block_k))[None, :] < lengths[:, None]
    scores = jnp.where(visible, scores, MASKED)
    new_top = jnp.maximum(top, scores.max(axis=-1))
    correction = jnp.exp(top - new_top)
    weights = jnp.where(visible, jnp.exp(scores - new_top[:, None]), 0.0)
    values = v_ref[pl.ds(at, block_k), :]
    out = correction[:, None] * out + pl_triton.dot(weights.astype(values.dtype), values,
                                                    precision=precision)
    return out, new_top, correction * total + weights.sum(axis=-1)

  return lax.fori_loop(0, blocks, block, carry)


def store_split(out_refs, out, top, total, valid) -> None:
  """A split program's result: with one split (one output ref) the attention itself in
  the queries' layout, else its partials (output, sum, max) for the merge."""
  if len(out_refs) == 1:
    _store_attention(out_refs[0], out, total, valid)
  else:
    o_ref, sum_ref, max_ref = out_refs
    o_ref[...] = out.astype(o_ref.dtype)
    sum_ref[...] = total
    max_ref[...] = top


def _merge_kernel(part_ref, sum_ref, max_ref, o_ref, *, steps: int, group: int):
  """One (row, kv head, slice of the head dimension)'s splits merged by the
  log-sum-exp rule in one pass over all of them, written in the queries' layout."""
  tops = max_ref[...]                                                     # [P, block_r]
  top = tops.max(axis=0)
  weights = jnp.exp(tops - top[None, :])
  total = jnp.sum(sum_ref[...] * weights, axis=0)
  out = jnp.sum(part_ref[...].astype(jnp.float32) * weights[:, :, None], axis=0)
  _store_attention(o_ref, out, total, query_rows(o_ref, steps, group))


def _merge_slice(splits: int, block_r: int, head_dim: int) -> int:
  """Head-dimension columns one merge program holds: all splits' partials of its rows
  at once (at most ``_MERGE_VALUES`` values while halving leaves 16 columns or more),
  so it needs no loop over the splits and more programs share the merge at small
  batches."""
  columns = head_dim
  while columns % 32 == 0 and splits * block_r * columns > _MERGE_VALUES:
    columns //= 2
  return columns


def split_plan(batch: int, kv_heads: int, width: int, splits: int | None,
               launch_as: Launch | None) -> tuple[int, int, Launch]:
  """(splits, keys a split holds, launch) for a cache of ``width`` positions: ``splits``
  and ``launch_as`` checked, or chosen where None (``num_splits``, ``launch``)."""
  if width != padded_cache_len(width):
    raise ValueError(f"a cache of {width} positions cannot be split by the attention "
                     f"kernel; allocate padded_cache_len({width}) = "
                     f"{padded_cache_len(width)}")
  if splits is None:
    splits = num_splits(batch, kv_heads)
  elif splits not in [1 << i for i in range(MAX_SPLITS.bit_length())]:
    raise ValueError(f"splits={splits!r} must be a power of two <= {MAX_SPLITS}")
  split_len = width // splits
  launch_as = launch(split_len) if launch_as is None else launch_as
  if launch_as.block_k not in KEY_BLOCKS or split_len % launch_as.block_k:
    raise ValueError(f"launch_as.block_k={launch_as.block_k!r} must be a power of two in "
                     f"[16, 256] dividing the split's {split_len} keys")
  return splits, split_len, launch_as


def split_k(q: jax.Array, keys: jax.Array, values: jax.Array, lengths: jax.Array,
            scale: float, *, splits: int | None = None, launch_as: Launch | None = None,
            interpret: bool = False) -> jax.Array:
  """``reference``'s contract in q's dtype: one kernel over each (row, kv head, split),
  and, when the keys are split (``splits``: P, a power of two ≤ ``MAX_SPLITS``; None:
  ``num_splits``), a second that merges the splits. Both read and write the queries'
  own [B, T, H, h] layout: no grouping copy before, no transpose after. ``launch_as``:
  the split kernel's launch (None: ``launch``)."""
  batch, steps, heads, head_dim = q.shape
  kv_heads, width = keys.shape[1], keys.shape[2]
  group = heads // kv_heads
  if lengths.shape != (batch, steps):
    raise ValueError(f"lengths {lengths.shape} must be [batch, steps] = {(batch, steps)}")
  splits, split_len, launch_as = split_plan(batch, kv_heads, width, splits, launch_as)
  block_k = launch_as.block_k
  block_t, block_g = query_blocks(steps, group)
  block_r = block_t * block_g
  by_head = q.reshape(batch, steps, kv_heads, group, head_dim)
  queries = pl.BlockSpec((None, block_t, None, block_g, head_dim),
                         lambda b, k, *_: (b, 0, k, 0, 0))
  kernel = functools.partial(_split_kernel, steps=steps, group=group, block_k=block_k,
                             scale=scale, exact=jnp.dtype(q.dtype) == jnp.float32)
  params = pl_triton.CompilerParams(num_warps=launch_as.num_warps,
                                    num_stages=launch_as.num_stages)
  in_specs = [
      queries,
      pl.BlockSpec((None, block_t), lambda b, k, j: (b, 0)),
      pl.BlockSpec((None, None, split_len, head_dim), lambda b, k, j: (b, k, j, 0)),
      pl.BlockSpec((None, None, split_len, head_dim), lambda b, k, j: (b, k, j, 0)),
  ]
  args = (by_head, lengths.astype(jnp.int32), keys, values)
  if splits == 1:
    out = pl.pallas_call(
        kernel, grid=(batch, kv_heads, 1), in_specs=in_specs, out_specs=queries,
        out_shape=jax.ShapeDtypeStruct(by_head.shape, q.dtype),
        compiler_params=params, interpret=interpret, name=KERNEL_NAME)(*args)
    return out.reshape(q.shape)
  # Partials over padded rows (whole blocks: no masks); the padding rows see no key.
  partial_shape = (batch, kv_heads, splits, block_r)
  parts, total, top = pl.pallas_call(
      kernel,
      grid=(batch, kv_heads, splits),
      in_specs=in_specs,
      out_specs=[
          pl.BlockSpec((None, None, None, block_r, head_dim),
                       lambda b, k, j: (b, k, j, 0, 0)),
          pl.BlockSpec((None, None, None, block_r), lambda b, k, j: (b, k, j, 0)),
          pl.BlockSpec((None, None, None, block_r), lambda b, k, j: (b, k, j, 0)),
      ],
      out_shape=[jax.ShapeDtypeStruct((*partial_shape, head_dim), q.dtype),
                 jax.ShapeDtypeStruct(partial_shape, jnp.float32),
                 jax.ShapeDtypeStruct(partial_shape, jnp.float32)],
      compiler_params=params, interpret=interpret, name=KERNEL_NAME)(*args)
  return merge(parts, total, top, steps=steps, group=group, shape=by_head.shape,
               dtype=q.dtype, interpret=interpret).reshape(q.shape)


def merge(parts: jax.Array, total: jax.Array, top: jax.Array, *, steps: int, group: int,
          shape: tuple[int, ...], dtype, interpret: bool = False) -> jax.Array:
  """The split kernel's partials (unnormalised outputs [B, Kv, P, R, h], sums and maxima
  [B, Kv, P, R]) merged by the log-sum-exp rule into the queries' layout ``shape``
  [B, T, Kv, G, h]."""
  batch, kv_heads, splits, block_r, head_dim = parts.shape
  block_t, block_g = query_blocks(steps, group)
  columns = _merge_slice(splits, block_r, head_dim)
  return pl.pallas_call(
      functools.partial(_merge_kernel, steps=steps, group=group),
      grid=(batch, kv_heads, head_dim // columns),
      in_specs=[
          pl.BlockSpec((None, None, splits, block_r, columns),
                       lambda b, k, c: (b, k, 0, 0, c)),
          pl.BlockSpec((None, None, splits, block_r), lambda b, k, c: (b, k, 0, 0)),
          pl.BlockSpec((None, None, splits, block_r), lambda b, k, c: (b, k, 0, 0)),
      ],
      out_specs=pl.BlockSpec((None, block_t, None, block_g, columns),
                             lambda b, k, c: (b, 0, k, 0, c)),
      out_shape=jax.ShapeDtypeStruct(shape, dtype),
      compiler_params=pl_triton.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret, name=MERGE_KERNEL_NAME,
  )(parts, total, top)
