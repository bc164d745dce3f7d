"""Verification of a drafted block against the target, per sequence, and the commit.

The target scores ``[last, d_1 … d_k]`` in one pass; ``target_logits[:, i]`` is its
distribution for the token after ``d_i`` (``d_0`` = last). Each row accepts a prefix of
its draft and appends one more token of the target's own (the bonus, or the correction
after a rejection), so every iteration commits ``accepted + 1`` tokens per row:

- greedy: accept while ``d_{i+1} == argmax target_logits[:, i]``; the bonus is the
  target's argmax after the accepted prefix — exactly the target's greedy decoding;
- sampling (lossless speculative sampling): accept ``d_{i+1}`` with probability
  ``min(1, p_i(d) / q_i(d))``; at the first rejection draw from the normalised residual
  ``max(0, p_i − q_i)``; after a fully accepted prefix draw from ``p``. ``p`` and ``q``
  are ``softmax(logits / T)`` of the target and of the walk's corrected logits.

``cap`` [B] limits each row's accepted draft tokens (a draft-only stopping rule of the
draft policy): a row capped at c behaves exactly as if it had drafted c tokens, which
keeps both rules lossless.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


def accepted_prefix(accept: jax.Array, cap: jax.Array) -> jax.Array:
  """[B] length of the all-True prefix of ``accept`` [B, k], at most ``cap`` [B]."""
  prefix = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)
  return jnp.minimum(prefix, cap).astype(jnp.int32)


def verify_greedy(draft_tokens: jax.Array, target_logits: jax.Array,
                  cap: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(accepted [B], bonus [B]) of greedy verification; target_logits [B, k + 1, V]."""
  steps = draft_tokens.shape[1]
  target_tokens = jnp.argmax(target_logits, axis=-1).astype(jnp.int32)
  accepted = accepted_prefix(draft_tokens == target_tokens[:, :steps], cap)
  bonus = jnp.take_along_axis(target_tokens, accepted[:, None], axis=1)[:, 0]
  return accepted, bonus


def verify_sampling(draft_tokens: jax.Array, draft_logits: jax.Array,
                    target_logits: jax.Array, temperature: float, key: jax.Array,
                    cap: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(accepted [B], bonus [B]) of lossless speculative sampling at ``temperature`` > 0.

  draft_logits [B, k, V]: the logits each draft token was drawn from (the walk's
  corrected logits); target_logits [B, k + 1, V].
  """
  batch, steps = draft_tokens.shape
  accept_key, residual_key = jax.random.split(key)
  p = jax.nn.softmax(target_logits.astype(jnp.float32) / temperature, axis=-1)
  q = jax.nn.softmax(draft_logits.astype(jnp.float32) / temperature, axis=-1)
  p_draft = jnp.take_along_axis(p[:, :steps], draft_tokens[..., None], axis=-1)[..., 0]
  q_draft = jnp.take_along_axis(q, draft_tokens[..., None], axis=-1)[..., 0]
  uniform = jax.random.uniform(accept_key, (batch, steps))
  # u < p/q without dividing: q(d) > 0 for a drawn token, but may underflow in fp32.
  accepted = accepted_prefix(uniform * q_draft < p_draft, cap)

  rejected = accepted < jnp.minimum(cap, steps)
  p_next = jnp.take_along_axis(p, accepted[:, None, None], axis=1)[:, 0]
  q_next = jnp.take_along_axis(q, jnp.minimum(accepted, steps - 1)[:, None, None],
                               axis=1)[:, 0]
  residual = jnp.maximum(p_next - q_next, 0.0)
  # An empty residual means p == q there, where a rejection has probability zero.
  residual_ok = jnp.sum(residual, axis=-1, keepdims=True) > 0
  weights = jnp.where(rejected[:, None] & residual_ok, residual, p_next)
  bonus = jax.random.categorical(residual_key, jnp.log(weights), axis=-1)
  return accepted, bonus.astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Commit:
  """What one iteration appends to each row.

  tokens [B, k + 1]: ``d_1 … d_a, bonus`` then unused entries; count [B]: how many of
  them the row keeps (``a + 1``, cut at the first EOS and at the row's token budget;
  0 for a finished row); finished [B]: the row is done after this commit; new_length
  [B]: the cache length after the commit (the rejected entries beyond it are stale
  and are overwritten later).
  """

  tokens: jax.Array
  count: jax.Array
  finished: jax.Array
  new_length: jax.Array


def commit(draft_tokens: jax.Array, accepted: jax.Array, bonus: jax.Array,
           length: jax.Array, generated: jax.Array, active: jax.Array,
           max_new_tokens: int, eos_ids: jax.Array) -> Commit:
  """The tokens each row appends, with EOS and ``max_new_tokens`` applied per row.

  eos_ids: [n] int32 ids that end a row (-1 entries match nothing).
  """
  steps = draft_tokens.shape[1]
  index = jnp.arange(steps + 1)[None]
  padded = jnp.concatenate([draft_tokens, bonus[:, None]], axis=1)
  tokens = jnp.where(index == accepted[:, None], bonus[:, None], padded)
  count = accepted + 1
  is_eos = jnp.isin(tokens, eos_ids) & (index < count[:, None])
  finished = jnp.any(is_eos, axis=1)
  count = jnp.where(finished, jnp.argmax(is_eos, axis=1) + 1, count)
  budget = max_new_tokens - generated
  finished = finished | (count >= budget)
  count = jnp.minimum(count, budget)
  count = jnp.where(active, count, 0)
  return Commit(tokens, count.astype(jnp.int32), active & finished,
                jnp.where(active, length + accepted + 1, length).astype(jnp.int32))
