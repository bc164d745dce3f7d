"""The per-step exchange of a vocabulary-sharded walk: each device's best candidate in,
the same token out on every device.

Device ``i`` of ``n`` along the vocabulary axis owns the columns ``[i·V/n, (i+1)·V/n)``.
At every step it selects its own candidate exactly as the single-device walk selects over
all of V (``jnp.argmax`` of its scores: the highest, the lowest column among equal ones,
the first NaN where there is one) and publishes it as a few words per batch row:

- ``score``: the candidate's selection score (its logit, or logit / T + Gumbel noise);
- ``index``: its *global* column;
- ``row``: its W1 row, only when W1 is sharded along V too (then the next step's
  ``e = W1[x]`` arrives with the token, in the same exchange);
- ``chosen`` and ``lse``: its scaled logit and the log-sum-exp of the device's scaled
  logits, only when the walk returns log-probabilities.

``pick`` reduces the ``n`` candidates with the single-device rule (a NaN score wins, the
lowest global column first; otherwise the highest score, the lowest global column among
equal scores), so the token is the single-device walk's for the same logits: exactly,
greedy, and bit for bit sampled with the same key (the Gumbel noise of a column is drawn
by its global index, ``wts_jax.sampling``). The fields travel as one int32 message (their
bits, packed), so a step is one ``all_gather``; nothing V-sized crosses devices.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax


def _argmax_reducer(candidate, accumulated):
  """``lax.argmax``'s own reduction rule (a NaN is picked; of equal values the lower
  index), kept with its value: one pass gives both."""
  value, index = candidate
  best, best_index = accumulated
  take_value = (value > best) | (value != value)
  take_index = take_value | ((value == best) & (index < best_index))
  return (jnp.where(take_value, value, best), jnp.where(take_index, index, best_index))


def local_candidate(score: jax.Array, column_offset) -> tuple[jax.Array, jax.Array]:
  """(best score [B], its global column [B] int32) of one device's scores [B, V_local]:
  ``jnp.argmax``'s choice and its score from one reduction (the scores, a fusion of the
  logits' add, need not be written out to be read twice)."""
  columns = lax.broadcasted_iota(jnp.int32, score.shape, score.ndim - 1)
  best, local = lax.reduce((score, columns), (jnp.array(-jnp.inf, score.dtype),
                                              jnp.int32(0)),
                           _argmax_reducer, (score.ndim - 1,))
  return best, local + column_offset


def pick(scores: jax.Array, indices: jax.Array) -> jax.Array:
  """Which of the ``n`` candidates wins, per batch row: scores and indices [n, B] →
  positions [B] in ``0 … n-1`` (the single-device argmax rule; the module docstring)."""
  nan = jnp.isnan(scores)
  any_nan = jnp.any(nan, axis=0)
  top = jnp.max(jnp.where(nan, -jnp.inf, scores), axis=0)
  contender = jnp.where(any_nan[None], nan, scores == top[None])
  lowest = jnp.min(jnp.where(contender, indices, jnp.iinfo(jnp.int32).max), axis=0)
  return jnp.argmax(contender & (indices == lowest[None]), axis=0).astype(jnp.int32)


def combined_logsumexp(lse: jax.Array) -> jax.Array:
  """The log-sum-exp over all devices' columns from each device's own, [n, B] → [B]
  (as ``jax.nn.logsumexp`` guards an infinite maximum)."""
  top = jnp.max(lse, axis=0)
  safe = jnp.where(jnp.isfinite(top), top, 0.0)
  return safe + jnp.log(jnp.sum(jnp.exp(lse - safe[None]), axis=0))


def _as_words(values: jax.Array) -> jax.Array:
  """[B, ...] values of any 4-, 2- or 1-byte dtype as their bits in int32 words [B, w]
  (16-bit values two to a word when they pair up)."""
  values = values.reshape(values.shape[0], -1)
  itemsize = jnp.dtype(values.dtype).itemsize
  if itemsize == 4:
    return lax.bitcast_convert_type(values, jnp.int32)
  per_word = 4 // itemsize
  if values.shape[1] % per_word == 0:
    grouped = values.reshape(values.shape[0], -1, per_word)
    return lax.bitcast_convert_type(grouped, jnp.int32)
  unsigned = {2: jnp.uint16, 1: jnp.uint8}[itemsize]
  return lax.bitcast_convert_type(values, unsigned).astype(jnp.int32)


def _from_words(words: jax.Array, like: jax.ShapeDtypeStruct) -> jax.Array:
  """``_as_words``' inverse: words [..., w] back to values shaped like ``like`` [B, ...]
  (with the leading axes of ``words``)."""
  lead = words.shape[:-1]
  itemsize = jnp.dtype(like.dtype).itemsize
  size = math.prod(like.shape[1:])
  if itemsize == 4:
    values = lax.bitcast_convert_type(words, like.dtype)
  elif size % (4 // itemsize) == 0:
    values = lax.bitcast_convert_type(words, like.dtype)     # [..., w, per_word]
  else:
    unsigned = {2: jnp.uint16, 1: jnp.uint8}[itemsize]
    values = lax.bitcast_convert_type(words.astype(unsigned), like.dtype)
  return values.reshape(lead + tuple(like.shape[1:]))


def gather_packed(candidate: dict[str, jax.Array], axis_name) -> dict[str, jax.Array]:
  """``lax.all_gather`` of every field of ``candidate`` (each [B, ...]) as one message:
  the fields' bits packed into one int32 array [B, words], gathered once, unpacked to
  [n, B, ...] each — one collective a step, whatever the fields."""
  names = sorted(candidate)
  words = [_as_words(candidate[name]) for name in names]
  gathered = lax.all_gather(jnp.concatenate(words, axis=1), axis_name)   # [n, B, words]
  fields, start = {}, 0
  for name, part in zip(names, words):
    like = jax.ShapeDtypeStruct(candidate[name].shape, candidate[name].dtype)
    fields[name] = _from_words(gathered[..., start:start + part.shape[1]], like)
    start += part.shape[1]
  return fields


def exchange(candidate: dict[str, jax.Array], axis_name) -> dict[str, jax.Array]:
  """Every device's ``candidate`` (a dict of [B, ...] arrays with at least ``score`` and
  ``index``) gathered over ``axis_name`` in one message and reduced to the winner's
  fields, the same on every device. ``lse``, when present, becomes the log-sum-exp over
  all columns."""
  gathered = gather_packed(candidate, axis_name)           # each [n, B, ...]
  winner = pick(gathered["score"], gathered["index"])       # [B]

  def of_winner(values):
    return jnp.take_along_axis(
        values, winner.reshape((1, -1) + (1,) * (values.ndim - 2)), axis=0)[0]

  result = {name: of_winner(values) for name, values in gathered.items() if name != "lse"}
  if "lse" in gathered:
    result["lse"] = combined_logsumexp(gathered["lse"])
  return result


def or_over(status: jax.Array, axis_name) -> jax.Array:
  """The bitwise OR of an int32 status word over the devices of ``axis_name``."""
  return jnp.bitwise_or.reduce(lax.all_gather(status, axis_name).reshape(-1))
