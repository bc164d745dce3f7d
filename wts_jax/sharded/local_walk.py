"""One device's part of a vocabulary-sharded walk (the body that ``shard_map`` runs).

The device holds W2's rows (and the base logits' columns, and the int8 scales) of its
slice of the vocabulary, ``[offset, offset + V_local)``; W1 either all of it or the same
slice; everything else whole (the gate / joint / confidence weights, the hidden states).
The walk is the reference walk's (``wts_jax.reference``): the hidden-only terms hoisted,
then one ``lax.scan`` over the K steps of the head's ``advance``, ``W2 · z`` over the
device's own rows, and selection — except that the selection ends with the exchange of
``wts_jax.sharded.exchange``: one ``all_gather`` of a few words a batch row per step,
after which every device holds the same token (and, with a sharded W1, its W1 row).

The head's update (``advance``: r-sized) runs on every device, replicated: it costs less
than a second exchange would. The device's scores come from ``scores`` (a
``LocalScores`` callable): the XLA one here, or the step kernel of
``wts_jax.sharded.step_kernel`` — one Pallas launch a step, between the exchanges.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from wts_jax import sampling
from wts_jax.output import STATUS_NAN_LOGITS, WalkOutput
from wts_jax.reference import clamp_first_tokens
from wts_jax.sharded.exchange import exchange, gather_packed, local_candidate, or_over


@dataclasses.dataclass(frozen=True)
class ShardLayout:
  """Where a device's arrays sit in the mesh (static; the same on every device).

  vocab_axis: the mesh axis (or tuple of axes) the vocabulary is split over; batch_axis:
  the axis (or axes) the batch rows are split over, or None (every device holds every
  row); vocab_size: the global V; w1_sharded: W1 is split along V like W2 (else every
  device holds all of it)."""
  vocab_axis: str | tuple[str, ...]
  batch_axis: str | tuple[str, ...] | None
  vocab_size: int
  w1_sharded: bool

  @property
  def status_axes(self) -> tuple[str, ...]:
    """Every mesh axis the walk's status word is spread over."""
    return _axes(self.vocab_axis) + _axes(self.batch_axis)


def _axes(axis) -> tuple[str, ...]:
  if axis is None:
    return ()
  return tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)


@dataclasses.dataclass(frozen=True)
class StepScores:
  """What one device's step produces before the exchange (all [B] unless noted)."""
  best: jax.Array            # its candidate's selection score
  index: jax.Array           # its candidate's global column, int32
  nan: jax.Array             # bool scalar: a NaN among its logits
  chosen: jax.Array | None   # its candidate's scaled logit (log-probabilities asked)
  lse: jax.Array | None      # log-sum-exp of its scaled logits (log-probabilities asked)
  logits: jax.Array | None   # [B, V_local] fp32 corrected logits (logits asked)


@dataclasses.dataclass(frozen=True)
class StepInputs:
  """What a device's step scores read besides z (static flags and per-walk arrays)."""
  column_offset: jax.Array   # int32 scalar: the device's first global column
  rows: jax.Array            # [B] int32: the global batch rows (the noise counter)
  score_scale: jax.Array | None
  noise_on: jax.Array | None
  seed: jax.Array | None
  return_logits: bool
  return_logprobs: bool


# A device's step: (serial head, base logits [B, K, V_local], z [B, r], step,
# StepInputs) -> StepScores. Hashable (a static argument of the jitted walk).
LocalScores = Callable[..., StepScores]


def xla_scores(serial, base_logits: jax.Array, z: jax.Array, step, inputs: StepInputs
               ) -> StepScores:
  """The reference's arithmetic on the device's own columns (``reference.select_tokens``
  and ``token_logprobs``, with the noise drawn by global column)."""
  logits = (jnp.take(base_logits, step, axis=1).astype(jnp.float32)
            + serial.vocab_bias(z))
  nan = jnp.any(jnp.isnan(logits))
  if inputs.seed is None:
    score = logits
  else:
    columns = inputs.column_offset + jnp.arange(logits.shape[-1], dtype=jnp.int32)
    noise = sampling.gumbel_noise(inputs.seed, inputs.rows, jnp.asarray(step), columns)
    score = (logits * inputs.score_scale[:, None]
             + jnp.where(inputs.noise_on[:, None], noise, 0.0))
  best, index = local_candidate(score, inputs.column_offset)
  chosen = lse = None
  if inputs.return_logprobs:
    scaled = logits if inputs.score_scale is None else logits * inputs.score_scale[:, None]
    local = index - inputs.column_offset
    chosen = jnp.take_along_axis(scaled, local[:, None], axis=-1)[:, 0]
    lse = jax.nn.logsumexp(scaled, axis=-1)
  return StepScores(best=best, index=index, nan=nan, chosen=chosen, lse=lse,
                    logits=logits if inputs.return_logits else None)


def _first_embedding(serial, first: jax.Array, layout: ShardLayout, column_offset,
                     local_vocab: int) -> jax.Array:
  """``W1[x_{-1}]`` [B, r] on every device, bit for bit: from W1 itself, or, when W1 is
  sharded, from the owner of each token (the others' rows are masked, then one gather
  picks the owner's)."""
  if not layout.w1_sharded:
    return serial.embed(first)
  local = first - column_offset
  owned = (local >= 0) & (local < local_vocab)
  rows = jnp.where(owned[:, None], serial.embed(jnp.clip(local, 0, local_vocab - 1)), 0)
  gathered = gather_packed({"row": rows}, layout.vocab_axis)["row"]   # [n, B, r]
  owner = (first // local_vocab).astype(jnp.int32)
  return jnp.take_along_axis(gathered, owner[None, :, None], axis=0)[0]


def local_walk(head, base_logits: jax.Array, first_tokens: jax.Array,
               hidden: jax.Array | None, score_scale, noise_on, seed, *,
               layout: ShardLayout, return_logits: bool, return_logprobs: bool,
               scores: LocalScores = xla_scores) -> WalkOutput:
  """The walk of one device's vocabulary slice (inside ``shard_map`` over the layout's
  axes). ``head`` holds the device's own arrays; ``base_logits`` [B, K, V_local]. Returns
  the device's part of the walk: tokens [B, K] and confidence [B, K] (equal on every
  device of the vocabulary axis), logits [B, K, V_local], and the status word OR-ed over
  every device."""
  serial = head.markov_head
  batch, steps, local_vocab = base_logits.shape
  column_offset = (lax.axis_index(layout.vocab_axis) * local_vocab).astype(jnp.int32)
  row_offset = (0 if layout.batch_axis is None
                else lax.axis_index(layout.batch_axis) * batch)
  inputs = StepInputs(column_offset=column_offset,
                      rows=(row_offset + jnp.arange(batch)).astype(jnp.int32),
                      score_scale=score_scale, noise_on=noise_on, seed=seed,
                      return_logits=return_logits, return_logprobs=return_logprobs)

  first, status = clamp_first_tokens(first_tokens, layout.vocab_size)
  hoisted = serial.hoist(hidden) if hidden is not None else None
  conf_head = head.confidence_head
  conf_hoisted = conf_head.hoist(hidden) if conf_head is not None else None

  def step(carry, k):
    e, state, status = carry
    state, z = serial.advance(state, e, None if hoisted is None else
                              serial.hoisted_at(hoisted, k))
    local = scores(serial, base_logits, z, k, inputs)
    status = status | jnp.where(local.nan, STATUS_NAN_LOGITS, 0)
    candidate = {"score": local.best, "index": local.index}
    if layout.w1_sharded:
      candidate["row"] = serial.embed(local.index - column_offset)
    if return_logprobs:
      candidate["chosen"], candidate["lse"] = local.chosen, local.lse
    winner = exchange(candidate, layout.vocab_axis)
    tokens = winner["index"]
    out = {"tokens": tokens}
    if conf_head is not None:
      out["confidence"] = jnp.take(conf_hoisted, k, axis=1) + conf_head.serial(e)
    if return_logits:
      out["logits"] = local.logits
    if return_logprobs:
      out["logprobs"] = winner["chosen"] - winner["lse"]
    e_next = winner["row"] if layout.w1_sharded else serial.embed(tokens)
    return (e_next, state, status), out

  e0 = _first_embedding(serial, first, layout, column_offset, local_vocab)
  (_, _, status), per_step = lax.scan(
      step, (e0, serial.init_state(batch), status.astype(jnp.int32)), jnp.arange(steps))
  per_step = {name: jnp.moveaxis(value, 0, 1) for name, value in per_step.items()}
  status = or_over(status.astype(jnp.int32), layout.status_axes)
  return WalkOutput(tokens=per_step["tokens"], status=status,
                    confidence=per_step.get("confidence"), logits=per_step.get("logits"),
                    logprobs=per_step.get("logprobs"))
