"""Checks of ``walk``'s inputs: every error names the offending value.

Shape, rank and dtype checks run at trace time. Value checks (token ids in range,
temperatures) run when the values are concrete; under ``jit`` the walk reports
out-of-range tokens, NaN logits and invalid temperatures through ``WalkOutput.status``
instead.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax import sampling
from wts_jax.heads.base import SerialHead
from wts_jax.heads.draft_head import DraftHead
from wts_jax.output import (STATUS_INVALID_TEMPERATURE, STATUS_NO_FINITE_LOGIT, WalkOutput,
                            output_status)


def is_concrete(value) -> bool:
  return not isinstance(value, jax.core.Tracer)


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How tokens are chosen: ``greedy`` (no noise at all) or Gumbel-max per row."""

  greedy: bool
  score_scale: jax.Array | None = None   # [B] fp32: 1/T, or 1.0 on greedy rows
  noise_on: jax.Array | None = None      # [B] bool: False on greedy rows
  seed: jax.Array | None = None          # uint32[2]
  # int32 scalar: STATUS_INVALID_TEMPERATURE when a traced temperature was < 0 or not
  # finite (a concrete one is refused at the call instead).
  status: jax.Array | None = None


def as_draft_head(head) -> DraftHead:
  if isinstance(head, DraftHead):
    return head
  if isinstance(head, SerialHead):
    return DraftHead.wrap(head)   # a bare serial head walks without a confidence head
  raise TypeError(f"head must be a wts_jax DraftHead or serial head, got {type(head)!r}")


def _check_array(name: str, value) -> None:
  """Arrays only: a list has no dtype to check, and the walk needs a static shape."""
  if not isinstance(value, (jax.Array, np.ndarray)):
    raise TypeError(f"{name} must be a jax or numpy array, got {type(value).__name__} "
                    f"(wrap it: jnp.asarray({name}))")


def _check_floating(name: str, array) -> None:
  if not jnp.issubdtype(array.dtype, jnp.floating):
    raise TypeError(f"{name}.dtype={array.dtype} must be a floating dtype")


def check_walk_inputs(head: DraftHead, base_logits, first_tokens, hidden, *,
                      vocab_shards: int = 1) -> None:
  """``vocab_shards``: base_logits holds one device's 1/vocab_shards of the vocabulary
  (a sharded walk inside ``shard_map``)."""
  config = head.config
  _check_array("base_logits", base_logits)
  _check_array("first_tokens", first_tokens)
  if hidden is not None:
    _check_array("hidden", hidden)
  if getattr(base_logits, "ndim", None) != 3:
    raise ValueError(f"base_logits must be [B, K, V]; got shape "
                     f"{getattr(base_logits, 'shape', None)}")
  _check_floating("base_logits", base_logits)
  batch, steps, vocab = base_logits.shape
  if vocab * vocab_shards != config.vocab_size:
    raise ValueError(f"base_logits vocabulary {vocab}"
                     f"{f' × {vocab_shards} devices' if vocab_shards > 1 else ''} != head "
                     f"vocab_size {config.vocab_size}")
  vocab = config.vocab_size
  if steps < 1:
    raise ValueError(f"walk length K={steps} must be >= 1")
  if batch < 1:
    raise ValueError(f"batch B={batch} must be >= 1")
  if batch > sampling.MAX_ROWS or steps > sampling.MAX_STEPS:
    raise ValueError(f"B={batch}, K={steps} exceed the generator's counter "
                     f"({sampling.MAX_ROWS} rows, {sampling.MAX_STEPS} steps)")

  if getattr(first_tokens, "ndim", None) != 1 or first_tokens.shape[0] != batch:
    raise ValueError(f"first_tokens must be [B={batch}]; got shape "
                     f"{getattr(first_tokens, 'shape', None)}")
  if not jnp.issubdtype(first_tokens.dtype, jnp.integer):
    raise TypeError(f"first_tokens.dtype={first_tokens.dtype} must be an integer dtype")
  if is_concrete(first_tokens):
    ids = np.asarray(first_tokens)
    bad = np.flatnonzero((ids < 0) | (ids >= vocab))
    if bad.size:
      raise ValueError(f"first_tokens[{bad[0]}]={ids[bad[0]]} is outside [0, {vocab})")

  if config.needs_hidden:
    if hidden is None:
      raise ValueError(f"the {config.head_type} head"
                       f"{' with a confidence head' if config.confidence else ''} "
                       f"needs hidden [B, K, d={config.hidden_size}]; got hidden=None")
  if hidden is not None:
    expected = (batch, steps, config.hidden_size)
    if getattr(hidden, "shape", None) != expected:
      raise ValueError(f"hidden must be [B, K, d]={expected}; got shape "
                       f"{getattr(hidden, 'shape', None)}")
    _check_floating("hidden", hidden)


def check_key(key) -> None:
  """A single JAX PRNG key: new-style (``jax.random.key``) or raw uint32[2]."""
  if not isinstance(key, (jax.Array, np.ndarray)):
    raise TypeError(f"key={key!r} must be a JAX PRNG key from jax.random.key(seed), not "
                    f"a {type(key).__name__}")
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  if typed and key.shape != ():
    raise ValueError(f"key must be one PRNG key; got a key array of shape {key.shape} "
                     "(split keys are per walk, not per row)")
  if not typed and (key.dtype != np.uint32 or key.shape != (2,)):
    raise TypeError(f"key must be a JAX PRNG key from jax.random.key(seed) (or a raw "
                    f"uint32[2] key); got {key.dtype}{list(key.shape)}")


def make_sampling(temperature, key, batch: int) -> Sampling:
  """Turn ``temperature`` (a number or [B] array) and ``key`` into a ``Sampling``."""
  if key is not None:
    check_key(key)
  status = None
  if isinstance(temperature, (str, bytes)) or not (
      isinstance(temperature, (int, float, np.integer, np.floating, list, tuple))
      or hasattr(temperature, "dtype")):
    raise TypeError(f"temperature={temperature!r} must be a number or a [B] array of "
                    "floats (0 = greedy)")
  if isinstance(temperature, (int, float, np.integer, np.floating)) and not isinstance(
      temperature, bool):
    temperature = float(temperature)
    if not np.isfinite(temperature) or temperature < 0:
      raise ValueError(f"temperature={temperature} must be finite and >= 0")
    if temperature == 0.0:
      return Sampling(greedy=True)
    temps = jnp.full((batch,), temperature, jnp.float32)
  else:
    temps = jnp.asarray(temperature)
    if temps.ndim == 0:
      temps = jnp.broadcast_to(temps, (batch,))
    if temps.shape != (batch,):
      raise ValueError(f"temperature must be a number or [B={batch}]; got shape "
                       f"{temps.shape}")
    _check_floating("temperature", temps)
    if is_concrete(temps):
      values = np.asarray(temps, dtype=np.float64)
      bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
      if bad.size:
        raise ValueError(f"temperature[{bad[0]}]={values[bad[0]]} must be finite and >= 0")
    temps = temps.astype(jnp.float32)
    invalid = ~jnp.isfinite(temps) | (temps < 0)
    status = jnp.where(jnp.any(invalid), STATUS_INVALID_TEMPERATURE, 0).astype(jnp.int32)
    temps = jnp.where(invalid, 0.0, temps)   # an invalid row is walked greedily
  if key is None:
    raise ValueError("temperature > 0 samples tokens and needs key=jax.random.key(...)")
  noise_on = temps > 0
  score_scale = jnp.where(noise_on, 1.0 / jnp.where(noise_on, temps, 1.0), 1.0)
  return Sampling(greedy=False, score_scale=score_scale.astype(jnp.float32),
                  noise_on=noise_on, seed=sampling.seed_words(key), status=status)


def finish_walk(output: WalkOutput, mode: Sampling, base_logits=None, *,
                vocab_split: bool = False) -> WalkOutput:
  """``output`` with every status bit set that the inputs (``mode.status``,
  ``base_logits``) and the outputs themselves (NaN confidence, NaN or +Inf
  log-probabilities) call for, whichever implementation produced it; ``walk`` applies
  it to every output.

  A step whose logits are all -Inf has no token to choose, yet every implementation
  returns one (the first index): the chosen token's base logit is then -Inf, which no
  token of a step with a finite logit can have (the head's term is finite or NaN), so
  a [B, K] gather tells, without another pass over the [B, K, V] logits. Base logits
  split over devices along V (``vocab_split``) are asked by a max over V instead: each
  device reduces its columns and only [B, K] values cross, where a gather by global
  column would have to move the logits.
  """
  status = output.status | output_status(output.confidence, output.logprobs)
  if mode.status is not None:
    status = status | mode.status
  if base_logits is not None:
    if vocab_split:
      none_finite = jnp.max(base_logits, axis=-1) == -jnp.inf
    else:
      none_finite = jnp.take_along_axis(base_logits, output.tokens[..., None].astype(
          jnp.int32), axis=-1, mode="clip") == -jnp.inf
    status = status | jnp.where(jnp.any(none_finite), STATUS_NO_FINITE_LOGIT, 0)
  return dataclasses.replace(output, status=status.astype(jnp.int32))
