"""Attention of a few new tokens over a row's KV cache: decode, verify, the drafter's block.

Every forward of the decode loop attends T new queries (1 for a decode step, k + 1 for a
verify pass, the block for the drafter) over the row's cached keys and the T new keys
(causal among themselves for the target, all-visible for the drafter's block). The new
keys and values are written into the cache first (``attend_written``), so the cache is
all there is to attend: query step t of row b sees ``[0, cache_len[b] + t + 1)`` (causal)
or ``[0, cache_len[b] + T)``. The cache layout is ``[B, Kv, S, h]``: a (row, kv-head)
pair's keys are one contiguous ``[S, h]`` matrix, read in place, with no transpose.

Two implementations, one contract (``IMPLS``), both in ``cache_attention``:

- ``"xla"``: one masked softmax in fp32 over the whole allocated cache; the CPU path and
  the oracle.
- ``"pallas"``: the split-K kernel, which stops each query row at its own length (a row
  reads its own keys only) and serves a kv head's ``G·T`` queries in one pass over its
  keys.

A prefill has no cache: ``attend`` runs its T × T causal softmax in XLA. The cache length
must suit the kernel's split (``padded_cache_len``); the caches of
``wts_jax.specdecode`` are allocated that way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wts_jax.specdecode import cache_attention
from wts_jax.specdecode.cache_attention import padded_cache_len  # noqa: F401 (the API)
from wts_jax.specdecode.cache_attention import grouped, scores, ungrouped, weighted

IMPLS = ("auto", "xla", "pallas")


def resolve(impl: str) -> str:
  """``"auto"`` → ``"pallas"`` on a GPU, else ``"xla"``."""
  if impl not in IMPLS:
    raise ValueError(f"attention_impl={impl!r} must be one of {IMPLS}")
  if impl != "auto":
    return impl
  return "pallas" if jax.default_backend() == "gpu" else "xla"


def _new_token_mask(steps: int, causal: bool, rows: int) -> jax.Array:
  """[R, T] visibility of the new keys to the grouped query rows (``grouped``: row r is
  step r // G)."""
  if not causal:
    return jnp.ones((rows, steps), bool)
  query_step = jnp.arange(rows) // (rows // steps)
  return query_step[:, None] >= jnp.arange(steps)[None, :]


def attend(q: jax.Array, keys: jax.Array, values: jax.Array, *, causal: bool) -> jax.Array:
  """Grouped-query attention of q [B, T, H, h] over its own T keys/values [B, Kv, T, h]
  (a prefill: no cache). causal: step t sees the keys up to its own. Returns [B, T, H·h]
  in q's dtype."""
  batch, steps, heads, head_dim = q.shape
  kv_heads = keys.shape[1]
  rows = grouped(q, kv_heads)
  visible = _new_token_mask(steps, causal, rows.shape[2])[None, None]
  out = weighted(jax.nn.softmax(
      jnp.where(visible, scores(rows, keys, head_dim ** -0.5), -jnp.inf), axis=-1), values)
  return ungrouped(out, steps).reshape(batch, steps, heads * head_dim).astype(q.dtype)


def attend_written(q: jax.Array, cache_keys: jax.Array, cache_values: jax.Array,
                   cache_len: jax.Array, *, causal: bool, impl: str = "xla",
                   splits: int | None = None,
                   launch_as: cache_attention.Launch | None = None,
                   interpret: bool = False) -> jax.Array:
  """Attention of T new tokens per row, q [B, T, H, h], whose keys and values the cache
  [B, Kv, S, h] already holds at ``cache_len[b] + t``: over the cache alone, step t up to
  ``cache_len[b] + t + 1`` (causal) or ``cache_len[b] + T``. Returns [B, T, H·h] in q's
  dtype. ``splits``, ``launch_as``: the kernel's split count and launch (None: its own
  rules); ``interpret``: the kernel in Pallas interpret mode."""
  batch, steps, heads, head_dim = q.shape
  lengths = cache_attention.causal_lengths(cache_len, steps, causal=causal)
  scale = head_dim ** -0.5
  if resolve(impl) == "xla":
    out = cache_attention.reference(q, cache_keys, cache_values, lengths, scale)
  else:
    out = cache_attention.split_k(q, cache_keys, cache_values, lengths, scale,
                                  splits=splits, launch_as=launch_as,
                                  interpret=interpret)
  return out.reshape(batch, steps, heads * head_dim).astype(q.dtype)

