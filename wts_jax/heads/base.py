"""What every serial head shares: the token embedding W1 and the vocabulary projection W2.

A serial head is described to the walks by four pieces, so the reference walk, the
teacher-forced block and the kernels all run the same math:

- ``hoist(hidden)``: every term that depends only on the backbone hidden states, for all
  K positions at once (one batched matmul before the serial loop);
- ``init_state(batch)``: the carried state before step 0;
- ``advance(state, e, hoisted_k)``: one serial step from ``e_k = W1[x_{k-1}]``, returning
  the new state and the r-vector ``z_k`` that W2 multiplies;
- ``vocab_bias(z)``: ``W2 · z`` — W2's stored values against fp32 ``z``, accumulated in
  fp32, times the per-row scale when quantized (an int8 W2 quantized with
  ``state="planes"`` meets z as two int8 planes: ``wts_jax.int8_state``). (The kernels
  meet the fp32 contract on tensor cores by splitting fp32 vectors into two bf16 parts; rounding ``z`` to bf16 instead would let
  last-ulp differences in σ/tanh flip whole bf16 steps and, at near-ties, tokens.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.heads.config import HeadConfig
from wts_jax.heads.layers import Embedding, Linear
from wts_jax.int8_state import planes_vocab_bias


def sharing_copy(head):
  """A head that shares every weight variable with ``head`` (an ``nnx`` split and merge):
  modules set on the copy leave ``head`` as it was."""
  graphdef, state = nnx.split(head)
  return nnx.merge(graphdef, state)


def with_derived_copy(head, head_type: str, what: str, name: str, build):
  """``sharing_copy(head)`` with ``build(serial head)`` set as its serial head's ``name``:
  a derived copy a kernel reads (``wts_jax.derived`` lists them). Only a ``head_type``
  head has one (``what`` names it in the error)."""
  if head.config.head_type != head_type:
    raise ValueError(f"{what} is the {head_type} head's (got {head.config.head_type!r})")
  copied = sharing_copy(head)
  setattr(copied.markov_head, name, build(copied.markov_head))
  return copied


def has_derived(serial, name: str) -> bool:
  """Whether the serial head carries the derived copy ``name`` (a planner's question:
  its rows are not read)."""
  return getattr(serial, name, None) is not None


def derived_rows(serial, name: str):
  """The rows of the serial head's derived copy ``name`` (``with_derived_copy``), or None
  where it has none."""
  copy = getattr(serial, name, None)
  return None if copy is None else copy.rows[...]


def hidden_terms(hidden: jax.Array, weight: jax.Array, bias: jax.Array) -> jax.Array:
  """``hidden · weightᵀ + bias`` [B, K, j] in fp32: a projection's hidden-side terms.

  When the hidden states and the weight share a 16-bit float dtype the GEMM takes them as
  stored and accumulates in fp32 (tensor cores on a GPU): every product of two 16-bit
  floats is exact in fp32, as in the fp32 GEMM of widened copies, which would cost the
  walk two converts and a CUDA-core GEMM before the kernel. Otherwise both widen to fp32.
  """
  if hidden.dtype == weight.dtype and weight.dtype in (jnp.bfloat16, jnp.float16):
    terms = jnp.einsum("bkd,jd->bkj", hidden, weight, preferred_element_type=jnp.float32)
  else:
    terms = jnp.einsum("bkd,jd->bkj", hidden.astype(jnp.float32),
                       weight.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
  return terms + bias.astype(jnp.float32)


class SerialHead(nnx.Module):
  """Base of the vanilla, gated and recurrent heads (``markov_head.*`` in DeepSpec)."""

  head_type: str = ""

  def __init__(self, config: HeadConfig, *, rngs: nnx.Rngs, param_dtype=jnp.bfloat16):
    self.config = config
    self.markov_w1 = Embedding(config.vocab_size, config.rank, rngs=rngs,
                               param_dtype=param_dtype)
    self.markov_w2 = Linear(config.rank, config.vocab_size, use_bias=False, rngs=rngs,
                            param_dtype=param_dtype)

  # --- the four pieces (overridden where the head differs) ---
  def hoist(self, hidden: jax.Array | None):
    return None

  def init_state(self, batch: int):
    return None

  def advance(self, state, e: jax.Array, hoisted_k):
    raise NotImplementedError

  def vocab_bias(self, z: jax.Array) -> jax.Array:
    """``W2 · z`` for z [..., r] → [..., V] fp32 (the kernels' exact contract)."""
    w2 = self.markov_w2
    weight = w2.weight[...]
    if self.z_as_int8_planes:
      return planes_vocab_bias(z, weight, w2.scale[...])
    z = z.astype(jnp.float32)
    bias = jnp.einsum("...r,vr->...v", z, weight.astype(jnp.float32),
                      precision=jax.lax.Precision.HIGHEST)
    scale = getattr(w2, "scale", None)
    if scale is not None:
      bias = bias * scale[...]
    return bias

  def embed(self, tokens: jax.Array) -> jax.Array:
    return self.markov_w1(tokens)

  @property
  def z_as_int8_planes(self) -> bool:
    """Whether z meets an int8 W2 as two int8 planes (``quantize_w2(...,
    state="planes")``; ``wts_jax.int8_state``)."""
    return bool(getattr(self.markov_w2, "state_planes", False))

  @property
  def w2_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.markov_w2.weight.dtype)

  def hoisted_at(self, hoisted, k):
    """Position k of the hoisted terms (a pytree of [B, K, ...] arrays)."""
    return jax.tree_util.tree_map(lambda a: a[:, k], hoisted)
