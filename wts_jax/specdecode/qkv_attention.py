"""A layer's attention from its q/k/v product: head norms, rotation, cache write and
attention in one kernel (plus the split merge where the keys are split).

The unfused layer (``qwen3.project_qkv``, ``numerics.write_rows``,
``attention.attend_written``) runs, around the attention kernel, a reduction for the
query and key heads' norms, a kernel writing the keys, one writing the values and one
laying out the queries: four small kernels a layer whose time is mostly their launch.
Here program (row, kv head, split) of ``cache_attention``'s split kernel reads its
queries, its new key and its new value straight from the product ``[B, T, (H + 2·Kv)·h]``
(the target's layers) or from a query and a key/value product (the drafter's block),
norms and rotates them in registers, attends over the cache's context ``[0, start)`` of
its split and — the first split — over the T new keys from registers (causal among
themselves, or all visible), and the first split writes the new keys and values into the
cache in place. No program reads a position it writes, so the splits need no order.

``reference`` is the unfused composition in XLA (the CPU path and the oracle).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from wts_jax.specdecode import attention, cache_attention
from wts_jax.specdecode.numerics import linear, rms_norm, rotate, write_rows
from wts_jax.specdecode.cache_attention import MASKED, query_blocks, query_rows

KERNEL_NAME = "wts_qkv_attention"


def _partners(ref, rows_mask):
  """``ref``'s rows [..., h] with the columns permuted to their rotation partners
  (column j holds column (j + h/2) mod h), read from memory: a register tensor cannot be
  sliced in the kernel, and a second read of lines just read costs no product."""
  head_dim = ref.shape[-1]
  def along(axis, values):
    # One index array per axis, each of the ref's rank (Triton broadcasts no rank up).
    return values.reshape(tuple(values.shape[0] if a == axis else 1
                                for a in range(ref.ndim)))

  index = [along(axis, jnp.arange(n)) for axis, n in enumerate(ref.shape[:-1])]
  partner = along(ref.ndim - 1, (jnp.arange(head_dim) + head_dim // 2) % head_dim)
  mask = None if rows_mask is None else rows_mask[..., None]
  return pl_triton.load(ref.at[(*index, partner)], mask=mask,
                        other=None if mask is None else 0)


def _sources(products, num_heads: int, kv_heads: int, head_dim: int):
  """(query source, its first query head, key/value source, its first key head), each
  source [B, T, heads, h]: one product [B, T, (H + 2·Kv)·h] serves both, or a pair of
  products q [B, T, H·h] and k/v [B, T, 2·Kv·h]."""
  if isinstance(products, (tuple, list)):
    q, kv = products
    widths = ((q.shape[-1], num_heads * head_dim, "the query product"),
              (kv.shape[-1], 2 * kv_heads * head_dim, "the key/value product"))
  else:
    q = kv = products
    widths = ((q.shape[-1], (num_heads + 2 * kv_heads) * head_dim, "the q/k/v product"),)
  for width, want, what in widths:
    if width != want:
      raise ValueError(f"{what}'s width {width} must be {want} ({num_heads} query heads, "
                       f"{kv_heads} kv heads of {head_dim})")
  q_src = q.reshape(*q.shape[:2], -1, head_dim)
  kv_src = kv.reshape(*kv.shape[:2], -1, head_dim)
  return q_src, 0, kv_src, (num_heads if kv is q else 0)


def heads_of(products, cos: jax.Array, sin: jax.Array, q_norm: jax.Array,
             k_norm: jax.Array, *, num_heads: int, kv_heads: int, eps: float
             ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The new tokens' queries [B, T, H, h], keys and values [B, T, Kv, h] from
  ``products`` (one q/k/v product [B, T, (H + 2·Kv)·h], or the pair q [B, T, H·h],
  k/v [B, T, 2·Kv·h]) in XLA: each query and key head RMS-normed with its weight
  (``numerics.rms_norm``) and rotated by ``cos``/``sin`` (``numerics.rotation_tables``),
  the values as they are."""
  head_dim = q_norm.shape[-1]
  q_src, q_first, kv_src, kv_first = _sources(products, num_heads, kv_heads, head_dim)
  q = rotate(rms_norm(q_src[:, :, q_first:q_first + num_heads], q_norm, eps), cos, sin)
  k = rotate(rms_norm(kv_src[:, :, kv_first:kv_first + kv_heads], k_norm, eps), cos, sin)
  return q, k, kv_src[:, :, kv_first + kv_heads:kv_first + 2 * kv_heads]


def reference(products, cos: jax.Array, sin: jax.Array, q_norm: jax.Array,
              k_norm: jax.Array, keys: jax.Array, values: jax.Array, start: jax.Array,
              *, num_heads: int, eps: float, causal: bool
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(attention [B, T, H, h] in the products' dtype, keys, values): the new tokens'
  queries, keys and values from ``products`` (``heads_of``: each head RMS-normed with its
  weight and rotated; values as they are), the keys and values written into the cache
  [B, Kv, S, h] at ``start[b] + t``, then ``attention.attend_written``'s XLA path."""
  q, k, v = heads_of(products, cos, sin, q_norm, k_norm, num_heads=num_heads,
                     kv_heads=keys.shape[1], eps=eps)
  keys = write_rows(keys, k.transpose(0, 2, 1, 3), start)
  values = write_rows(values, v.transpose(0, 2, 1, 3), start)
  out = attention.attend_written(q, keys, values, start, causal=causal, impl="xla")
  return out.reshape(q.shape), keys, values


def _normed_rotated(x, x_partners, weight, weight_partners, cos, sin, eps: float, dtype):
  """Rows [r, h]: RMS-normed with ``weight`` and rounded to ``dtype``
  (``numerics.rms_norm``), then rotated in fp32 and rounded again (``numerics.rotary``).
  The rotation's partner of column j is −normed[j + h/2] below h/2 and normed[j − h/2]
  from it: ``x_partners`` and ``weight_partners`` hold those columns (``_partners``) and
  are normed with x's own scale, so each partner is the normed value itself, exactly."""
  x = x.astype(jnp.float32)
  scale = lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
  normed = (weight[None, :].astype(jnp.float32) * (x * scale)).astype(dtype)
  partner = (weight_partners[None, :].astype(jnp.float32)
             * (x_partners.astype(jnp.float32) * scale)).astype(dtype)
  half = x.shape[-1] // 2
  sign = jnp.where(jnp.arange(x.shape[-1]) < half, -1.0, 1.0)[None, :]
  return (normed.astype(jnp.float32) * cos
          + sign * partner.astype(jnp.float32) * sin).astype(dtype)


def _kernel(q_ref, k_new_ref, v_new_ref, q_cos_ref, q_sin_ref, k_cos_ref, k_sin_ref,
            q_norm_ref, k_norm_ref, start_ref, k_ref, v_ref,
            keys_out, values_out, *out_refs, steps: int, group: int, block_k: int,
            scale: float, eps: float, causal: bool, exact: bool):
  block_t, block_g, head_dim = q_ref.shape
  block_n = k_new_ref.shape[0]
  block_r = block_t * block_g
  dtype = k_ref.dtype
  precision = lax.Precision.HIGHEST if exact else None
  valid = query_rows(q_ref, steps, group)                               # [block_t, block_g]
  new_rows = jnp.arange(block_n) < steps
  # The queries, rows r = t·block_g + g, each with its step's rotation.
  q = pl_triton.load(q_ref, mask=valid[:, :, None], other=0).reshape(block_r, head_dim)
  step_rows = jnp.arange(block_t) < steps
  q_cos = jnp.broadcast_to(pl_triton.load(q_cos_ref, mask=step_rows[:, None], other=0)[:, None],
                           (block_t, block_g, head_dim)).reshape(block_r, head_dim)
  q_sin = jnp.broadcast_to(pl_triton.load(q_sin_ref, mask=step_rows[:, None], other=0)[:, None],
                           (block_t, block_g, head_dim)).reshape(block_r, head_dim)
  q = _normed_rotated(q, _partners(q_ref, valid).reshape(block_r, head_dim),
                      q_norm_ref[...], _partners(q_norm_ref, None), q_cos, q_sin, eps, dtype)
  # The new keys and values, rows n = step (padding rows zero).
  k_new = pl_triton.load(k_new_ref, mask=new_rows[:, None], other=0)
  k_new = _normed_rotated(k_new, _partners(k_new_ref, new_rows),
                          k_norm_ref[...], _partners(k_norm_ref, None),
                          pl_triton.load(k_cos_ref, mask=new_rows[:, None], other=0),
                          pl_triton.load(k_sin_ref, mask=new_rows[:, None], other=0),
                          eps, dtype)
  v_new = pl_triton.load(v_new_ref, mask=new_rows[:, None], other=0).astype(dtype)
  start = start_ref[0]
  split = pl.program_id(2)

  # The new tokens first, in the first split only: row r's step t sees new key n ≤ t
  # (causal) or every n < T.
  step_of_row = jnp.broadcast_to(jnp.arange(block_t)[:, None], (block_t, block_g)
                                 ).reshape(block_r)
  new_scores = pl_triton.dot(q, k_new, trans_b=True, precision=precision) * scale
  seen = new_rows[None, :] & (split == 0)
  if causal:
    seen = seen & (jnp.arange(block_n)[None, :] <= step_of_row[:, None])
  new_scores = jnp.where(seen, new_scores, MASKED)
  top = new_scores.max(axis=-1)
  weights = jnp.where(seen, jnp.exp(new_scores - top[:, None]), 0.0)
  out = pl_triton.dot(weights.astype(dtype), v_new, precision=precision)
  total = weights.sum(axis=-1)

  # Then the split's part of the context [0, start), read from the cache.
  out, top, total = cache_attention.attend_split(
      q, k_ref, v_ref, jnp.full((block_r,), start), (out, top, total), block_k=block_k,
      scale=scale, precision=precision)

  @pl.when(split == 0)
  def _write():
    pl_triton.store(keys_out.at[pl.ds(start, block_n), :], k_new, mask=new_rows[:, None])
    pl_triton.store(values_out.at[pl.ds(start, block_n), :], v_new, mask=new_rows[:, None])

  cache_attention.store_split(out_refs, out, top, total, valid)


def supported(num_heads: int, kv_heads: int, head_dim: int) -> bool:
  """Whether the kernel serves these heads: a power-of-two group (a program's query
  block is its kv head's heads, read in place) and an even head dimension ≥ 16."""
  group = num_heads // kv_heads
  return group & (group - 1) == 0 and head_dim % 2 == 0 and head_dim >= 16


def fused(products, cos: jax.Array, sin: jax.Array, q_norm: jax.Array,
          k_norm: jax.Array, keys: jax.Array, values: jax.Array, start: jax.Array, *,
          num_heads: int, eps: float, causal: bool, splits: int | None = None,
          launch_as: cache_attention.Launch | None = None, interpret: bool = False
          ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``reference``'s contract in one kernel over (row, kv head, split) — ``products``:
  one q/k/v product [B, T, (H + 2·Kv)·h] or the pair (q [B, T, H·h], k/v
  [B, T, 2·Kv·h]) — with the split merge of ``cache_attention`` where the keys are
  split; the caches are updated in place when donated or loop-carried. ``splits``,
  ``launch_as``: as ``cache_attention.split_k``. The caller keeps ``start[b] + T`` within
  the cache."""
  kv_heads, cache_len, head_dim = keys.shape[1], keys.shape[2], keys.shape[3]
  q_src, q_first, kv_src, kv_first = _sources(products, num_heads, kv_heads, head_dim)
  batch, steps = q_src.shape[:2]
  dtype = q_src.dtype
  group = num_heads // kv_heads
  if not supported(num_heads, kv_heads, head_dim):
    raise ValueError(f"{num_heads} heads over {kv_heads} kv heads of {head_dim} need a "
                     "power-of-two group and an even head dimension >= 16")
  splits, split_len, launch_as = cache_attention.split_plan(batch, kv_heads, cache_len,
                                                           splits, launch_as)
  block_k = launch_as.block_k
  block_t, block_g = query_blocks(steps, group)
  block_n = max(pl.next_power_of_2(steps), 16)
  block_r = block_t * block_g
  kernel = functools.partial(
      _kernel, steps=steps, group=group, block_k=block_k, scale=head_dim ** -0.5,
      eps=float(eps), causal=causal, exact=jnp.dtype(keys.dtype) == jnp.float32)
  row_block = lambda rows: pl.BlockSpec((None, rows, head_dim), lambda b, k, j: (b, 0, 0))
  vector = pl.BlockSpec((head_dim,), lambda b, k, j: (0,))
  cache_split = pl.BlockSpec((None, None, split_len, head_dim), lambda b, k, j: (b, k, j, 0))
  cache_whole = pl.BlockSpec((None, None, cache_len, head_dim), lambda b, k, j: (b, k, 0, 0))
  in_specs = [
      # a query block is its kv head's G heads (whole blocks: G is a power of two)
      pl.BlockSpec((None, block_t, block_g, head_dim),
                   lambda b, k, j: (b, 0, q_first // block_g + k, 0)),
      pl.BlockSpec((None, block_n, None, head_dim), lambda b, k, j: (b, 0, kv_first + k, 0)),
      pl.BlockSpec((None, block_n, None, head_dim),
                   lambda b, k, j: (b, 0, kv_first + kv_heads + k, 0)),
      row_block(block_t), row_block(block_t), row_block(block_n), row_block(block_n),
      vector, vector,
      pl.BlockSpec((1,), lambda b, k, j: (b,)),
      cache_split, cache_split,
  ]
  cos, sin = cos.astype(jnp.float32), sin.astype(jnp.float32)
  args = (q_src, kv_src, kv_src, cos, sin, cos, sin, q_norm, k_norm,
          start.astype(jnp.int32), keys, values)
  cache_shapes = [jax.ShapeDtypeStruct(keys.shape, keys.dtype),
                  jax.ShapeDtypeStruct(values.shape, values.dtype)]
  queries = pl.BlockSpec((None, block_t, None, block_g, head_dim),
                         lambda b, k, j: (b, 0, k, 0, 0))
  by_head = (batch, steps, kv_heads, group, head_dim)
  params = pl_triton.CompilerParams(num_warps=launch_as.num_warps,
                                    num_stages=launch_as.num_stages)
  aliases = {len(args) - 2: 0, len(args) - 1: 1}
  if splits == 1:
    keys, values, out = pl.pallas_call(
        kernel, grid=(batch, kv_heads, 1), in_specs=in_specs,
        out_specs=[cache_whole, cache_whole, queries],
        out_shape=[*cache_shapes, jax.ShapeDtypeStruct(by_head, dtype)],
        input_output_aliases=aliases, compiler_params=params, interpret=interpret,
        name=KERNEL_NAME)(*args)
    return out.reshape(batch, steps, num_heads, head_dim), keys, values
  partial_shape = (batch, kv_heads, splits, block_r)
  keys, values, parts, total, top = pl.pallas_call(
      kernel, grid=(batch, kv_heads, splits), in_specs=in_specs,
      out_specs=[
          cache_whole, cache_whole,
          pl.BlockSpec((None, None, None, block_r, head_dim),
                       lambda b, k, j: (b, k, j, 0, 0)),
          pl.BlockSpec((None, None, None, block_r), lambda b, k, j: (b, k, j, 0)),
          pl.BlockSpec((None, None, None, block_r), lambda b, k, j: (b, k, j, 0)),
      ],
      out_shape=[*cache_shapes,
                 jax.ShapeDtypeStruct((*partial_shape, head_dim), dtype),
                 jax.ShapeDtypeStruct(partial_shape, jnp.float32),
                 jax.ShapeDtypeStruct(partial_shape, jnp.float32)],
      input_output_aliases=aliases, compiler_params=params, interpret=interpret,
      name=KERNEL_NAME)(*args)
  out = cache_attention.merge(parts, total, top, steps=steps, group=group,
                              shape=by_head, dtype=dtype, interpret=interpret)
  return out.reshape(batch, steps, num_heads, head_dim), keys, values


def attends_in_kernel(c: "Qwen3Config", names: tuple[str, ...], impl: str) -> bool:
  """Whether a layer with weights ``names`` attends over a cache through
  ``fused`` (its head norms, rotation and cache write inside the attention
  kernel: four kernels a layer fewer than ``project_qkv``, ``write_rows`` and
  ``attend_written``): on the kernel path (``impl`` resolving to "pallas"), heads the
  kernel serves, and the queries, keys and values from one product or from a query and
  a key/value product."""
  return (attention.resolve(impl) == "pallas"
          and supported(c.num_heads, c.num_kv_heads, c.head_dim)
          and ("qkv_proj" in names or {"q_proj", "kv_proj"} <= set(names)))


def attend_in_kernel(h: jax.Array, layer: dict[str, jax.Array], c: "Qwen3Config",
                     cos: jax.Array, sin: jax.Array, keys: jax.Array, values: jax.Array,
                     start: jax.Array, *, causal: bool):
  """A layer's attention where ``attends_in_kernel``: (attention [B, T, H·h], the cache's
  keys and values with the new tokens written at ``start[b] + t``, the products it
  read). ``cos``/``sin``: ``numerics.rotation_tables`` at the tokens' positions."""
  x = rms_norm(h, layer["input_layernorm"], c.rms_norm_eps)
  products = (linear(x, layer["qkv_proj"]) if "qkv_proj" in layer
              else (linear(x, layer["q_proj"]), linear(x, layer["kv_proj"])))
  attended, keys, values = fused(
      products, cos, sin, layer["q_norm"], layer["k_norm"], keys, values, start,
      num_heads=c.num_heads, eps=c.rms_norm_eps, causal=causal)
  return attended.reshape(*h.shape[:2], -1), keys, values, products
