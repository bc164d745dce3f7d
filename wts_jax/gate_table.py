"""The gated head's token-side gate as a table: a kernel's step gathers it, not computes it.

The gate ``g_k = σ(G_h h_k + G_e e_k + b)`` reads the token only through ``G_e e_k`` with
``e_k = W1[x]``, so ``P = W1 · G_eᵀ`` ([V, r] fp32, once per head) holds that term for every
token: a step gathers ``P[x]`` beside ``W1[x]`` and its gate is elementwise,
``z = σ(hoisted_k + P[x]) ⊙ e`` — no G_e read, no matmul, no exchange between blocks for
it. ``P`` is the reference's own contraction (``GatedMarkovHead.advance``: fp32 products
summed in fp32), taken over all of W1 at once.

Stored as one row of 16-bit words a token, ``[e's bf16 bits ; P's upper 16 bits ; P's
lower 16 bits]`` ([V, 3r] int16): a kernel gathers a token with one bulk copy, loads the
three parts in one register layout, and rebuilds ``e`` and ``P`` bit for bit
(``bf16_from_bits``, ``f32_from_halves``). The words are typed as integers so that no
float handling (a NaN made canonical, a denormal flushed) can touch the halves on their
way. At the Qwen3-4B shape the table is 233 MB beside the head's 156 MB.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from wts_jax.heads.base import derived_rows, has_derived, hidden_terms, with_derived_copy


def f32_halves(values: jax.Array) -> tuple[jax.Array, jax.Array]:
  """fp32 ``values`` as the (upper, lower) 16 bits of each, int16 words (in XLA, and in
  the batched Mosaic kernel, whose joint-table owners publish J_s s so)."""
  bits = lax.bitcast_convert_type(values.astype(jnp.float32), jnp.uint32)
  def half(word):
    return lax.bitcast_convert_type(word.astype(jnp.uint16), jnp.int16)
  return half(bits >> 16), half(bits & 0xFFFF)


def f32_from_halves(upper: jax.Array, lower: jax.Array) -> jax.Array:
  """The fp32 values whose int16 halves ``f32_halves`` gave: the words widened (with
  their sign, then the lower one masked) and joined — the ops a Mosaic GPU kernel has."""
  bits = (lax.shift_left(upper.astype(jnp.int32), jnp.int32(16))
          | (lower.astype(jnp.int32) & 0xFFFF))
  return lax.bitcast_convert_type(bits, jnp.float32)


def bf16_bits(values: jax.Array) -> jax.Array:
  """bf16 ``values`` as int16 words."""
  return lax.bitcast_convert_type(values.astype(jnp.bfloat16), jnp.int16)


def bf16_from_bits(words: jax.Array) -> jax.Array:
  """The bf16 values of int16 words (``bf16_bits``)."""
  return lax.bitcast_convert_type(words, jnp.bfloat16)


def token_terms(w1: jax.Array, token_weight: jax.Array) -> jax.Array:
  """``W1 · token_weightᵀ`` [V, j] fp32: every token's term ``token_weight · e`` (e = W1[x];
  G_e for the gate table, J_e for the joint table) as the heads' ``advance`` contracts it,
  fp32 products summed in fp32."""
  return jnp.einsum("vr,jr->vj", w1.astype(jnp.float32), token_weight.astype(jnp.float32),
                    precision=lax.Precision.HIGHEST)


def gate_rows(w1: jax.Array, gate_e: jax.Array) -> jax.Array:
  """[V, 3r] int16: each token's W1 row (its bf16 bits), then its ``G_e e`` as fp32 bit
  halves."""
  upper, lower = f32_halves(token_terms(w1, gate_e))
  return jnp.concatenate([bf16_bits(w1), upper, lower], axis=1)


class GateTable(nnx.Module):
  """A gated head's ``gate_rows`` [V, 3r] (``with_gate_table``), and G_h [r, d] as its own
  contiguous array, so a walk's hoist reads it without first slicing it out of
  ``gate_proj.weight`` (an op of its own every walk)."""

  def __init__(self, rows: jax.Array, hidden_weight: jax.Array):
    self.rows = nnx.Variable(rows)
    self.hidden_weight = nnx.Variable(hidden_weight)

  @classmethod
  def of(cls, serial) -> "GateTable":
    """The table of a gated serial head's weights as they are now."""
    _, gate_e, _ = serial.gate_weights()
    return cls(gate_rows(serial.markov_w1.weight[...], gate_e),
               jnp.array(serial.gate_proj.weight[...][:, :serial.config.hidden_size]))


def with_gate_table(head):
  """A gated head sharing every weight with ``head``, with its gate table beside them
  (``serial_update="table"`` and, for the gated head, ``"auto"`` on the batched Mosaic
  kernel read it; the reference and the other kernels compute the gate as before).
  The table is a function of W1 and ``gate_proj``: rebuild it after changing either."""
  return with_derived_copy(head, "gated", "a gate table", "gate_table", GateTable.of)


def has_gate_table(serial) -> bool:
  """Whether the serial head carries its gate table."""
  return has_derived(serial, "gate_table")


def table_of(serial):
  """The serial head's ``GateTable`` rows, or None."""
  return derived_rows(serial, "gate_table")


def hoisted_terms(serial, hidden: jax.Array) -> jax.Array:
  """``GatedMarkovHead.hoist`` of a head with its table: the same GEMM, on the table's
  contiguous G_h."""
  return hidden_terms(hidden, serial.gate_table.hidden_weight[...],
                      serial.gate_proj.bias[...])
