"""The correctness gate: every path's tokens against the XLA reference on the same
inputs, before it is timed (a torch path may differ only at near-ties, where the
reference's top-2 gap is below the path's margin).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax import sampling, validation
from wts_jax.bench.registry import BenchMode


@functools.partial(jax.jit, static_argnames=("batch", "steps", "vocab"))
def gumbel_noise_bkv(seed, *, batch: int, steps: int, vocab: int) -> jax.Array:
  """The walks' Gumbel noise as one [B, K, V] fp32 array (``sampling.gumbel_noise``)."""
  rows, vocab_ids = jnp.arange(batch), jnp.arange(vocab)
  return jnp.stack([sampling.gumbel_noise(seed, rows, jnp.asarray(k), vocab_ids)
                    for k in range(steps)], axis=1)


# --- the correctness gate ----------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("greedy", "temperature"))
def _reference_with_gaps(head, base_logits, first_tokens, hidden, key, *, temperature,
                         greedy: bool):
  from wts_jax.reference import reference_walk
  batch, steps, vocab = base_logits.shape
  if greedy:
    s = validation.Sampling(greedy=True)
  else:
    s = validation.make_sampling(temperature, key, batch)
  out = reference_walk(head, base_logits, first_tokens, hidden, s.score_scale, s.noise_on,
                       s.seed, return_logits=True)
  score = out.logits
  if not greedy:
    noise = gumbel_noise_bkv(s.seed, batch=batch, steps=steps, vocab=vocab)
    score = score * s.score_scale[:, None, None] + jnp.where(
        s.noise_on[:, None, None], noise, 0.0)
  top2 = jax.lax.top_k(score, 2)[0] if vocab > 1 else jnp.concatenate(
      [score, jnp.full_like(score, -jnp.inf)], axis=-1)
  return out.tokens, top2[..., 0] - top2[..., 1]


def _reference_args(head, base_logits, first_tokens, hidden, mode: BenchMode):
  head = validation.as_draft_head(head)
  if not head.config.needs_hidden:
    hidden = None
  return ((head, base_logits, first_tokens, hidden, mode.key),
          {"temperature": None if mode.greedy else float(mode.temperature),
           "greedy": mode.greedy})


def reference_tokens_and_gaps(head, base_logits, first_tokens, hidden, mode: BenchMode):
  """The XLA reference's tokens [B, K] and the top-2 gap of its selection scores [B, K]."""
  args, static = _reference_args(head, base_logits, first_tokens, hidden, mode)
  tokens, gaps = _reference_with_gaps(*args, **static)
  return np.asarray(tokens), np.asarray(gaps)


def lower_reference(head, base_logits, first_tokens, hidden, mode: BenchMode):
  """``reference_tokens_and_gaps`` split for compiling ahead: (lowered, finish), where
  ``finish(lowered.compile())`` is a function of no arguments giving (tokens, gaps)."""
  args, static = _reference_args(head, base_logits, first_tokens, hidden, mode)
  lowered = _reference_with_gaps.lower(*args, **static)

  def finish(compiled):
    def run():
      tokens, gaps = compiled(*args)
      return np.asarray(tokens), np.asarray(gaps)
    return run

  return lowered, finish


def compare_tokens(reference: np.ndarray, tokens: np.ndarray, gaps: np.ndarray | None = None,
                   margin: float | None = None) -> tuple[bool, str, float]:
  """(passed, check text, fraction of tokens equal) of a path's tokens vs the reference.

  Exact unless ``margin`` is given; with a margin, each row may first differ only at a
  step where the reference's top-2 score gap is below ``margin`` (a near-tie that a
  lower-precision bias can flip); after that the walks diverge and are not compared.
  """
  reference, tokens = np.asarray(reference), np.asarray(tokens)
  if reference.shape != tokens.shape:
    return False, (f"mismatch: tokens shape {tokens.shape} != reference shape "
                   f"{reference.shape}"), 0.0
  equal = reference == tokens
  agreement = float(equal.mean()) if equal.size else 1.0
  if equal.all():
    return True, "ok", agreement
  differing = int((~equal).sum())
  rows = np.flatnonzero(~equal.all(axis=1))
  if margin is None:
    row = rows[0]
    step = int(np.flatnonzero(~equal[row])[0])
    return False, (f"mismatch: row {row} step {step}: token {tokens[row, step]} != "
                   f"reference {reference[row, step]} ({differing} of {equal.size} "
                   f"tokens differ)"), agreement
  for row in rows:
    step = int(np.flatnonzero(~equal[row])[0])
    gap = float(gaps[row, step])
    if not gap < margin:
      return False, (f"mismatch: row {row} step {step}: token {tokens[row, step]} != "
                     f"reference {reference[row, step]} where the reference's top-2 gap "
                     f"{gap:.3g} >= margin {margin}"), agreement
  return True, (f"ok (tie margin {margin}: {len(rows)} of {reference.shape[0]} rows "
                f"diverged at a near-tie; {agreement:.1%} of tokens agree)"), agreement


