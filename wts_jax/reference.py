"""The step-wise walk in pure JAX: the ``impl="xla"`` fallback and every kernel's oracle.

One ``lax.scan`` over the K steps; everything that depends only on the hidden states is
hoisted before it. Per step: ``e = W1[x_{k-1}]``, the head's state update, ``W2 · z``,
the add to the base logits, and greedy or Gumbel-max selection with the counter-based
generator of ``wts_jax.sampling``. W2 is re-read at every step, which is exactly what the
Weights-That-Stay kernel avoids.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from wts_jax import sampling
from wts_jax.heads.draft_head import DraftHead
from wts_jax.output import (STATUS_NAN_LOGITS, STATUS_TOKEN_OUT_OF_RANGE, WalkOutput,
                            output_status)


def select_tokens(logits: jax.Array, step, *, score_scale, noise_on, seed):
  """Greedy (``seed is None``) or Gumbel-max selection over [B, V] fp32 logits.

  score = logits * score_scale[b] + (Gumbel noise if noise_on[b]); ties → lowest index.
  """
  if seed is None:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  batch, vocab = logits.shape
  noise = sampling.gumbel_noise(seed, jnp.arange(batch), jnp.asarray(step),
                                jnp.arange(vocab))
  score = logits * score_scale[:, None] + jnp.where(noise_on[:, None], noise, 0.0)
  return jnp.argmax(score, axis=-1).astype(jnp.int32)


def token_logprobs(logits: jax.Array, tokens: jax.Array, score_scale) -> jax.Array:
  """``log_softmax(logits * score_scale)[token]`` per row: logits [B, ..., V], tokens
  [B, ...], score_scale [B] or None."""
  scaled = logits if score_scale is None else logits * score_scale.reshape(
      score_scale.shape + (1,) * (logits.ndim - 1))
  chosen = jnp.take_along_axis(scaled, tokens[..., None], axis=-1)[..., 0]
  return chosen - jax.nn.logsumexp(scaled, axis=-1)


def clamp_first_tokens(first_tokens: jax.Array, vocab: int):
  """Clamp out-of-range ids so the walk can run on; report them in the status word."""
  first_tokens = first_tokens.astype(jnp.int32)
  bad = jnp.any((first_tokens < 0) | (first_tokens >= vocab))
  status = jnp.where(bad, STATUS_TOKEN_OUT_OF_RANGE, 0).astype(jnp.int32)
  return jnp.clip(first_tokens, 0, vocab - 1), status


@functools.partial(jax.jit, static_argnames=("return_logits", "return_logprobs",
                                             "max_steps"))
def reference_walk(head: DraftHead, base_logits: jax.Array, first_tokens: jax.Array,
                   hidden: jax.Array | None, score_scale: jax.Array | None,
                   noise_on: jax.Array | None, seed: jax.Array | None, *,
                   return_logits: bool = False, return_logprobs: bool = False,
                   max_steps: int | None = None) -> WalkOutput:
  """The walk, step by step. Inputs are validated by ``wts_jax.walk``.

  score_scale [B] fp32 (1/T, or 1 for greedy rows), noise_on [B] bool and seed uint32[2]
  are all None for a greedy walk. ``max_steps`` stops after that many steps (a debugging
  aid for bisecting a kernel against this oracle); the rest of the outputs stay zero.
  """
  serial = head.markov_head
  batch, steps, vocab = base_logits.shape
  run_steps = steps if max_steps is None else min(max_steps, steps)
  x_prev, status = clamp_first_tokens(first_tokens, vocab)

  hoisted = serial.hoist(hidden) if hidden is not None else None
  conf_head = head.confidence_head
  conf_hoisted = conf_head.hoist(hidden) if conf_head is not None else None

  def step(carry, k):
    x_prev, state, status = carry
    e = serial.embed(x_prev)
    state, z = serial.advance(state, e, None if hoisted is None else
                              serial.hoisted_at(hoisted, k))
    logits = jnp.take(base_logits, k, axis=1).astype(jnp.float32) + serial.vocab_bias(z)
    status = status | jnp.where(jnp.any(jnp.isnan(logits)), STATUS_NAN_LOGITS, 0)
    tokens = select_tokens(logits, k, score_scale=score_scale, noise_on=noise_on,
                           seed=seed)
    out = {"tokens": tokens}
    if conf_head is not None:
      out["confidence"] = jnp.take(conf_hoisted, k, axis=1) + conf_head.serial(e)
    if return_logits:
      out["logits"] = logits
    if return_logprobs:
      out["logprobs"] = token_logprobs(logits, tokens, score_scale)
    return (tokens, state, status), out

  (_, _, status), per_step = jax.lax.scan(
      step, (x_prev, serial.init_state(batch), status), jnp.arange(run_steps))
  # scan stacks along axis 0 (steps); outputs are [B, K, ...].
  per_step = {name: jnp.moveaxis(value, 0, 1) for name, value in per_step.items()}
  if run_steps < steps:
    per_step = {name: jnp.pad(value, [(0, 0), (0, steps - run_steps)] +
                              [(0, 0)] * (value.ndim - 2))
                for name, value in per_step.items()}
  status = status | output_status(per_step.get("confidence"), per_step.get("logprobs"))
  return WalkOutput(tokens=per_step["tokens"], status=status.astype(jnp.int32),
                    confidence=per_step.get("confidence"), logits=per_step.get("logits"),
                    logprobs=per_step.get("logprobs"))


def previous_tokens(first_tokens: jax.Array, tokens: jax.Array) -> jax.Array:
  """[B, K]: the token each step's e reads, x_{k-1} (the first token at step 0)."""
  return jnp.concatenate([first_tokens[:, None], tokens[:, :-1]], axis=1)


@functools.partial(jax.jit, static_argnames=("return_logits", "return_logprobs"))
def logits_of_tokens(head: DraftHead, base_logits: jax.Array, first_tokens: jax.Array,
                     tokens: jax.Array, hidden: jax.Array | None,
                     score_scale: jax.Array | None, *, return_logits: bool,
                     return_logprobs: bool) -> tuple[jax.Array | None, jax.Array | None]:
  """(logits [B, K, V] or None, log-probabilities [B, K] or None) of a walk that drafted
  ``tokens``: step k's z reads only the tokens before it, so the head's update runs over
  the given tokens (a scan of ``advance``, no selection), then one ``W2 · z`` for all K
  steps. What a kernel that selects without writing logits returns when asked for them."""
  serial = head.markov_head
  batch, steps, vocab = base_logits.shape
  first, _ = clamp_first_tokens(first_tokens, vocab)
  previous = previous_tokens(first, tokens)
  hoisted = serial.hoist(hidden) if hidden is not None else None

  def step(state, k):
    state, z = serial.advance(state, serial.embed(previous[:, k]),
                              None if hoisted is None else serial.hoisted_at(hoisted, k))
    return state, z

  _, z = jax.lax.scan(step, serial.init_state(batch), jnp.arange(steps))
  logits = base_logits.astype(jnp.float32) + serial.vocab_bias(jnp.moveaxis(z, 0, 1))
  logprobs = token_logprobs(logits, tokens, score_scale) if return_logprobs else None
  return (logits if return_logits else None), logprobs
