"""A quantized W2 (int8 or fp8 e4m3, one fp32 scale per vocabulary row).

Halving W2 lets the whole rank-256 projection stay on chip. The quantized walk has its
own contract, shared by the reference and the kernels, chosen by ``state``:

- ``"float"``: ``b = (Σ_j q[v, j] · z_j) · scale[v]`` with fp32 ``z`` and fp32
  accumulation (the Triton kernel and the Mosaic register GEMV);
- ``"planes"`` (int8 only): ``z`` as two int8 planes and exact int32 products
  (``wts_jax.int8_state``) — what int8 tensor cores compute; W1's planes are stored
  beside W1 (``W1Planes``) for the kernels.

``wts-bench`` reports how often the quantized walk's tokens agree with the bf16 walk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.heads.base import sharing_copy
from wts_jax.heads.draft_head import DraftHead
from wts_jax.int8_state import fragment_ordered, interleaved_planes, thread_rows_ordered

SCHEMES = {"int8": (jnp.int8, 127.0), "fp8": (jnp.float8_e4m3fn, 448.0)}
STATES = ("float", "planes")


class QuantizedLinear(nnx.Module):
  """``weight`` [V, r] int8/fp8 and ``scale`` [V] fp32: ``W ≈ weight · scale[:, None]``.
  ``state_planes``: z meets it as two int8 planes (``wts_jax.int8_state``); then, with V
  a multiple of 64, ``thread_rows`` holds the same rows in the order the stacked walk's
  threads meet them (``int8_state.thread_rows_ordered``: a thread's base logits in
  two 16-byte copies)."""

  def __init__(self, weight: jax.Array, scale: jax.Array, *, state_planes: bool = False):
    self.weight = nnx.Param(weight)
    self.scale = nnx.Param(scale)
    self.state_planes = state_planes
    if state_planes and weight.shape[0] % 64 == 0:
      self.thread_rows = nnx.Variable(thread_rows_ordered(weight))


class W1Planes(nnx.Module):
  """W1's rows as interleaved int8 planes ``planes`` [2V, r] and their ``scale`` [V]
  (``s_lo``): the vanilla head's z, precomputed for the int8 tensor-core kernels; and
  ``fragments`` [2V, r], the same bytes in the order the stacked walk's threads load
  them (``int8_state.fragment_ordered``: a quarter of the loads)."""

  def __init__(self, w1: jax.Array):
    planes, scale = interleaved_planes(w1)
    self.planes = nnx.Variable(planes)
    self.scale = nnx.Variable(scale)
    self.fragments = nnx.Variable(
        fragment_ordered(planes.reshape(w1.shape[0], -1)).reshape(planes.shape))


def quantize_rows(weight: jax.Array, scheme: str = "int8"):
  """Per-row symmetric quantization of ``weight`` [V, r] → (q [V, r], scale [V] fp32)."""
  if scheme not in SCHEMES:
    raise ValueError(f"scheme={scheme!r} must be one of {sorted(SCHEMES)}")
  dtype, top = SCHEMES[scheme]
  weight = weight.astype(jnp.float32)
  max_abs = jnp.max(jnp.abs(weight), axis=1)
  scale = jnp.where(max_abs > 0, max_abs / top, 1.0)
  scaled = weight / scale[:, None]
  if scheme == "int8":
    q = jnp.clip(jnp.round(scaled), -127, 127).astype(dtype)
  else:
    q = jnp.clip(scaled, -top, top).astype(dtype)
  return q, scale.astype(jnp.float32)


def quantize_w2(head: DraftHead, scheme: str = "int8", *, state: str = "float"
                ) -> DraftHead:
  """A head sharing every weight with ``head`` but with W2 quantized per row; with
  ``state="planes"`` (int8) the serial vector meets W2 as two int8 planes, exactly, on
  the int8 tensor-core kernels (the module docstring has both contracts)."""
  if state not in STATES:
    raise ValueError(f"state={state!r} must be one of {STATES}")
  if state == "planes" and scheme != "int8":
    raise ValueError(f"state='planes' needs scheme='int8' (got scheme={scheme!r})")
  quantized = sharing_copy(head)
  serial = quantized.markov_head
  q, scale = quantize_rows(head.markov_head.markov_w2.weight[...], scheme)
  serial.markov_w2 = QuantizedLinear(q, scale, state_planes=state == "planes")
  if state == "planes":
    serial.markov_w1_planes = W1Planes(serial.markov_w1.weight[...])
  return quantized
