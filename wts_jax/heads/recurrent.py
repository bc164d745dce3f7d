"""The recurrent (rnn) head: a small gated recurrence carried across the walk.

``[a ; c ; o] = J_s s_{k-1} + J_e e_k + J_h h_k + j_b`` with ``joint_proj.weight``
[3r, 2r + d] (input order ``[s ; e ; h]``, output chunks ``(gate, candidate, output)``),
``u = σ(a)``, ``s_k = u ⊙ s_{k-1} + (1 − u) ⊙ tanh(c)``, ``b_k = W2 · tanh(o)``,
``s_{-1} = 0``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.heads.base import SerialHead, hidden_terms, with_derived_copy
from wts_jax.heads.config import HeadConfig
from wts_jax.heads.layers import Linear


class RecurrentHead(SerialHead):
  head_type = "rnn"

  def __init__(self, config: HeadConfig, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16):
    super().__init__(config, rngs=rngs, param_dtype=param_dtype)
    r, d = config.rank, config.hidden_size
    self.joint_proj = Linear(2 * r + d, 3 * r, use_bias=True, rngs=rngs,
                             param_dtype=param_dtype)

  def joint_weights(self):
    """(J_s [3r, r], J_e [3r, r], J_h [3r, d], j_b [3r]) as fp32."""
    weight = self.joint_proj.weight[...].astype(jnp.float32)
    r = self.config.rank
    return (weight[:, :r], weight[:, r:2 * r], weight[:, 2 * r:],
            self.joint_proj.bias[...].astype(jnp.float32))

  def hidden_weight(self):
    """J_h [3r, d] as stored: the head's contiguous copy (``with_joint_hidden``), else
    the columns of ``joint_proj.weight`` (which a GEMM reads only after copying them out:
    an op every walk)."""
    joint_hidden = getattr(self, "joint_hidden", None)
    if joint_hidden is not None:
      return joint_hidden.weight[...]
    return _hidden_columns(self)

  def hoist(self, hidden):
    return hidden_terms(hidden, self.hidden_weight(), self.joint_proj.bias[...])

  def init_state(self, batch):
    return jnp.zeros((batch, self.config.rank), jnp.float32)

  def advance(self, state, e, hoisted_k):
    joint_s, joint_e, _, _ = self.joint_weights()
    r = self.config.rank
    pre = hoisted_k + jnp.einsum(
        "br,jr->bj", state, joint_s, precision=jax.lax.Precision.HIGHEST) + jnp.einsum(
            "br,jr->bj", e.astype(jnp.float32), joint_e,
            precision=jax.lax.Precision.HIGHEST)
    gate, candidate, output = pre[:, :r], pre[:, r:2 * r], pre[:, 2 * r:]
    update = jax.nn.sigmoid(gate)
    state = update * state + (1.0 - update) * jnp.tanh(candidate)
    return state, jnp.tanh(output)


class JointHidden(nnx.Module):
  """An rnn head's J_h [3r, d] (``joint_proj.weight``'s hidden columns) as its own
  contiguous array (``with_joint_hidden``)."""

  def __init__(self, weight: jax.Array):
    self.weight = nnx.Variable(weight)

  @classmethod
  def of(cls, serial) -> "JointHidden":
    """The copy of an rnn serial head's J_h as ``joint_proj.weight`` holds it now."""
    return cls(jnp.array(_hidden_columns(serial)))


def _hidden_columns(serial) -> jax.Array:
  """J_h [3r, d]: the hidden columns of ``joint_proj.weight`` (a strided view)."""
  return serial.joint_proj.weight[...][:, 2 * serial.config.rank:]


def with_joint_hidden(head):
  """An rnn head sharing every weight with ``head``, with J_h copied beside them as one
  contiguous array, so every walk's hoist (the reference's and every kernel's: one
  ``RecurrentHead.hoist``) reads it as stored instead of slicing it out of
  ``joint_proj.weight`` first. The values are the same bits: the walk's tokens do not
  change. The copy is a function of ``joint_proj.weight``: rebuild it after changing it."""
  return with_derived_copy(head, "rnn", "a contiguous J_h", "joint_hidden", JointHidden.of)
