"""The rnn head's token-side terms as a table: a kernel's step gathers them, not computes
them.

``[a ; c ; o] = J_s s_{k-1} + J_e e_k + J_h h_k + j_b`` reads the token only through
``J_e e_k`` with ``e_k = W1[x]``, so ``T = W1 · J_eᵀ`` ([V, 3r] fp32, once per head) holds
that term for every token. With it the batched Mosaic kernel needs no second grid
barrier a step: after the token exchange every block gathers its rows' ``T[x]``, reads
the ``J_s s_{k-1}`` that the blocks owning the state's units published during the last
step (riding on that step's barrier), and advances the whole state itself, elementwise
(``pallas/batched/update_joint_table``). ``T`` is the reference's own contraction
(``RecurrentHead.advance``: fp32 products summed in fp32), taken over all of W1 at once.

Stored as one row of 16-bit words a token, ``[T's upper 16 bits ; T's lower 16 bits]``
([V, 6r] int16), as ``wts_jax.gate_table`` stores the gate's terms, so a kernel gathers a
token with one bulk copy and rebuilds ``T`` bit for bit (``gate_table.f32_from_halves``).
At the Qwen3-4B shape the table is 467 MB beside the head's 156 MB: a walk's speed bought
with memory, so a head holds it only when asked (``with_joint_table``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.gate_table import f32_halves, token_terms
from wts_jax.heads.base import derived_rows, has_derived, with_derived_copy


def joint_rows(w1: jax.Array, joint_e: jax.Array) -> jax.Array:
  """[V, 6r] int16: each token's ``J_e e`` (``T = W1 · J_eᵀ``, ``gate_table.token_terms``)
  as fp32 bit halves, the upper 16 bits of all 3r terms, then the lower."""
  upper, lower = f32_halves(token_terms(w1, joint_e))
  return jnp.concatenate([upper, lower], axis=1)


class JointTable(nnx.Module):
  """An rnn head's ``joint_rows`` [V, 6r] (``with_joint_table``)."""

  def __init__(self, rows: jax.Array):
    self.rows = nnx.Variable(rows)

  @classmethod
  def of(cls, serial) -> "JointTable":
    """The table of an rnn serial head's weights as they are now."""
    _, joint_e, _, _ = serial.joint_weights()
    return cls(joint_rows(serial.markov_w1.weight[...], joint_e))


def with_joint_table(head):
  """An rnn head sharing every weight with ``head``, with its joint table beside them
  (``serial_update="table"``, up to ``batched.plan.JOINT_TABLE_MAX_ROWS`` rows,
  and ``"auto"``, up to ``AUTO_JOINT_TABLE_MAX_ROWS``, on the batched Mosaic kernel read
  it, the batch on N; the reference and
  the other kernels compute ``J_e e`` as before). The table is a function of W1 and
  ``joint_proj``: rebuild it after changing either (``wts_jax.with_fresh_copies``)."""
  return with_derived_copy(head, "rnn", "a joint table", "joint_table", JointTable.of)


def has_joint_table(serial) -> bool:
  """Whether the serial head carries its joint table."""
  return has_derived(serial, "joint_table")


def joint_table_of(serial):
  """The serial head's ``JointTable`` rows, or None."""
  return derived_rows(serial, "joint_table")
