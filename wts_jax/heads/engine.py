"""Heads built from the arrays a serving engine already holds, read where they lie.

Engines written with Flax (sglang-jax's DSpark drafter, for one) keep a linear layer as a
*kernel* ``[in, out]`` with ``y = x @ kernel``: the Markov W2 is then ``[r, V]``, and
under tensor parallelism it is sharded along V (``P(None, "tensor")``); W1 is the
embedding table ``[V, r]``, replicated or sharded along V. ``head_from_arrays`` wraps such
arrays in a ``DraftHead`` without copying them: each array becomes a parameter of the head
as it is (its dtype, its sharding), and a kernel ``[in, out]`` is read through its
transpose, a view the compiler folds into the contraction.

The Weights-That-Stay kernels read W2 by vocabulary rows (``[V, r]``, one row
contiguous), so a head holding W2 as a kernel ``[r, V]`` is walked by the XLA walk (one
device, or sharded: ``wts_jax.sharded``); ``uses_w2_kernel`` tells the two apart.
"""

from __future__ import annotations

import jax
from flax import nnx

from wts_jax.heads.config import HeadConfig
from wts_jax.heads.draft_head import DraftHead
from wts_jax.heads.layers import Linear


class KernelLinear(nnx.Module):
  """A linear layer stored as an engine stores it: ``kernel`` [in, out] (``y = x @ kernel
  + bias``). ``weight`` is the ``[out, in]`` view every head reads (``heads.layers.Linear``'s
  layout): the kernel's transpose, never materialized by itself."""

  def __init__(self, kernel: jax.Array, bias: jax.Array | None = None):
    self.kernel = nnx.Param(kernel)
    self.bias = None if bias is None else nnx.Param(bias)

  @property
  def weight(self) -> jax.Array:
    return self.kernel[...].T

  __call__ = Linear.__call__   # y = x Wᵀ + b, on the view


def uses_w2_kernel(head) -> bool:
  """Whether the head holds W2 as an engine's kernel ``[r, V]`` (``head_from_arrays``)."""
  serial = getattr(head, "markov_head", head)
  return isinstance(serial.markov_w2, KernelLinear)


def _check_shape(name: str, array, expected: tuple) -> None:
  if tuple(array.shape) != tuple(expected):
    raise ValueError(f"{name} must be {list(expected)}; got shape {list(array.shape)}")


def _hidden_size_of(rows: int, rank_terms: int, name: str, rank: int) -> int:
  hidden = rows - rank_terms * rank
  if hidden <= 0:
    raise ValueError(f"{name} has {rows} input rows; it needs {rank_terms} × r = "
                     f"{rank_terms * rank} token/state rows plus d > 0 hidden rows")
  return hidden


def head_from_arrays(w1: jax.Array, w2_kernel: jax.Array, *,
                     gate_kernel: jax.Array | None = None,
                     gate_bias: jax.Array | None = None,
                     joint_kernel: jax.Array | None = None,
                     joint_bias: jax.Array | None = None,
                     confidence_kernel: jax.Array | None = None,
                     confidence_bias: jax.Array | None = None,
                     hidden_size: int | None = None) -> DraftHead:
  """A ``DraftHead`` over an engine's arrays, each used as it is (no copy, its sharding
  kept).

  Args:
    w1: the Markov embedding ``markov_w1`` [V, r].
    w2_kernel: ``markov_w2`` as a Linear kernel [r, V] (``logits += e @ w2_kernel``).
    gate_kernel, gate_bias: the gated head's ``gate_proj`` as a kernel [d + r, r] (input
      order ``[h ; e]``) and its bias [r]; give them for a gated head.
    joint_kernel, joint_bias: the rnn head's ``joint_proj`` as a kernel [2r + d, 3r]
      (input order ``[s ; e ; h]``, output chunks ``(gate, candidate, output)``) and its
      bias [3r]; give them for an rnn head.
    confidence_kernel, confidence_bias: the confidence head's ``proj`` as a kernel
      [d + r, 1] (it also reads ``e_k``) or [d, 1], and its bias [1].
    hidden_size: d, the drafter's hidden size; needed only where no gate or joint kernel
      gives it (a vanilla head).

  The head type follows from the weights given: a gate kernel makes a gated head, a joint
  kernel an rnn head, neither a vanilla head.
  """
  if w1.ndim != 2:
    raise ValueError(f"w1 must be [V, r]; got shape {list(w1.shape)}")
  vocab, rank = w1.shape
  _check_shape("w2_kernel", w2_kernel, (rank, vocab))
  if gate_kernel is not None and joint_kernel is not None:
    raise ValueError("give gate_kernel (a gated head) or joint_kernel (an rnn head), not both")
  for kernel, bias, name in ((gate_kernel, gate_bias, "gate"),
                             (joint_kernel, joint_bias, "joint"),
                             (confidence_kernel, confidence_bias, "confidence")):
    if (kernel is None) != (bias is None):
      raise ValueError(f"{name}_kernel and {name}_bias go together; got only "
                       f"{name}_{'kernel' if bias is None else 'bias'}")

  derived_hidden = None
  if gate_kernel is not None:
    head_type = "gated"
    derived_hidden = _hidden_size_of(gate_kernel.shape[0], 1, "gate_kernel", rank)
    _check_shape("gate_kernel", gate_kernel, (derived_hidden + rank, rank))
    _check_shape("gate_bias", gate_bias, (rank,))
  elif joint_kernel is not None:
    head_type = "rnn"
    derived_hidden = _hidden_size_of(joint_kernel.shape[0], 2, "joint_kernel", rank)
    _check_shape("joint_kernel", joint_kernel, (derived_hidden + 2 * rank, 3 * rank))
    _check_shape("joint_bias", joint_bias, (3 * rank,))
  else:
    head_type = "vanilla"
  if hidden_size is not None and derived_hidden is not None and hidden_size != derived_hidden:
    raise ValueError(f"hidden_size={hidden_size} disagrees with the {head_type} kernel's "
                     f"d={derived_hidden}")
  hidden = derived_hidden if derived_hidden is not None else hidden_size
  if hidden is None:
    raise ValueError("hidden_size=None: a vanilla head needs hidden_size=d (no gate or "
                     "joint kernel gives it)")

  with_markov = True
  if confidence_kernel is not None:
    if confidence_kernel.shape not in ((hidden + rank, 1), (hidden, 1)):
      raise ValueError(f"confidence_kernel must be [d + r, 1] = [{hidden + rank}, 1] or "
                       f"[d, 1] = [{hidden}, 1]; got shape {list(confidence_kernel.shape)}")
    with_markov = confidence_kernel.shape[0] == hidden + rank
    _check_shape("confidence_bias", confidence_bias, (1,))

  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=hidden, head_type=head_type,
                      confidence=confidence_kernel is not None,
                      confidence_with_markov=with_markov)
  # The module tree without allocating its random weights; every parameter is then
  # replaced by the caller's array.
  head = nnx.eval_shape(lambda: DraftHead(config, rngs=nnx.Rngs(0)))
  serial = head.markov_head
  serial.markov_w1.weight = nnx.Param(w1)
  serial.markov_w2 = KernelLinear(w2_kernel)
  if head_type == "gated":
    serial.gate_proj = KernelLinear(gate_kernel, gate_bias)
  elif head_type == "rnn":
    serial.joint_proj = KernelLinear(joint_kernel, joint_bias)
  if confidence_kernel is not None:
    head.confidence_head.proj = KernelLinear(confidence_kernel, confidence_bias)
  placeholders = [jax.tree_util.keystr(path) for path, leaf in
                  jax.tree_util.tree_flatten_with_path(head)[0]
                  if isinstance(leaf, jax.ShapeDtypeStruct)]
  assert not placeholders, f"parameters left unset: {placeholders}"
  return head
