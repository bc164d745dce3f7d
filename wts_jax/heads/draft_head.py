"""``DraftHead``: a serial head plus the optional confidence head (DeepSpec's layout).

Attribute paths equal the DeepSpec checkpoint keys: ``markov_head.markov_w1.weight``,
``markov_head.markov_w2.weight``, ``markov_head.gate_proj.{weight,bias}``,
``markov_head.joint_proj.{weight,bias}``, ``confidence_head.proj.{weight,bias}``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.heads.base import SerialHead
from wts_jax.heads.config import HeadConfig
from wts_jax.heads.confidence import ConfidenceHead
from wts_jax.heads.markov import GatedMarkovHead, VanillaMarkovHead
from wts_jax.heads.recurrent import RecurrentHead

HEAD_CLASSES = {
    "vanilla": VanillaMarkovHead,
    "gated": GatedMarkovHead,
    "rnn": RecurrentHead,
}


class DraftHead(nnx.Module):
  """The serial head of a DSpark drafter; ``wts_jax.walk`` takes it as its first argument."""

  def __init__(self, config: HeadConfig, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16):
    self.config = config
    self.markov_head: SerialHead = HEAD_CLASSES[config.head_type](
        config, rngs=rngs, param_dtype=param_dtype)
    self.confidence_head = (ConfidenceHead(config, rngs=rngs, param_dtype=param_dtype)
                            if config.confidence else None)

  def block(self, hidden: jax.Array | None, prev_tokens: jax.Array):
    """Teacher-forced block: all K positions given their previous tokens.

    ``prev_tokens`` [B, K] holds ``x_{k-1}`` for every position (``[x_{-1}, x_0, …,
    x_{K-2}]``), as training and evaluation use. Returns ``(bias [B, K, V] fp32,
    confidence [B, K] fp32 or None)``. The rnn head still scans over K for its state.
    """
    head = self.markov_head
    batch, steps = prev_tokens.shape
    e_all = head.embed(prev_tokens)                       # [B, K, r]
    hoisted = head.hoist(hidden)

    def one_step(state, k):
      state, z = head.advance(state, e_all[:, k], head.hoisted_at(hoisted, k))
      return state, z

    _, z_all = jax.lax.scan(one_step, head.init_state(batch), jnp.arange(steps))
    bias = head.vocab_bias(jnp.swapaxes(z_all, 0, 1))     # [B, K, V]
    confidence = None
    if self.confidence_head is not None:
      confidence = self.confidence_head.hoist(hidden) + jax.vmap(
          self.confidence_head.serial, in_axes=1, out_axes=1)(e_all)
    return bias, confidence

  @classmethod
  def wrap(cls, markov_head: SerialHead) -> "DraftHead":
    """A ``DraftHead`` around an existing serial head, without a confidence head."""
    config = markov_head.config.replace(confidence=False)
    head = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
    head.markov_head = markov_head
    return head


def make_head(config: HeadConfig, *, seed: int = 0, param_dtype=jnp.bfloat16) -> DraftHead:
  """A random-weight ``DraftHead`` (tests, benchmarks, the demo)."""
  return DraftHead(config, rngs=nnx.Rngs(seed), param_dtype=param_dtype)
