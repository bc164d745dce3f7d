"""What the three Mosaic GPU backends (``mosaic_row``, ``mosaic_batched``,
``mosaic_stacked``) share around their kernels: the device they need, the interpret-mode
grid, the head's checks every Mosaic kernel makes, the first tokens and the confidence
logits after the launch, and a walk's logits computed from its drafted tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

# jax 0.10's Mosaic GPU cannot lower the batch-on-N kernel's transposed base-tile load.
BATCH_ON_N_LOWERS = jax.__version_info__ >= (0, 11)
# WGMMA (every Mosaic kernel's tensor-core instruction) is Hopper's: sm_90a.
COMPUTE_CAPABILITY = (9, 0)


def supported_on(device) -> str | None:
  """Why ``device`` cannot run a Mosaic kernel (its compute capability), or None."""
  capability = device.compute_capability
  if capability != COMPUTE_CAPABILITY:
    found = "not a CUDA GPU" if capability is None else f"compute capability {capability}"
    return (f"the Mosaic kernels need compute capability {COMPUTE_CAPABILITY} (Hopper's "
            f"WGMMA); {device.kind} is {found}")
  return None


def interpret_blocks_refusal(config) -> str | None:
  """Every Mosaic kernel's: interpret mode has one block (a grid exchange needs them all
  at once)."""
  if config.interpret and (config.num_blocks or 1) > 1:
    return ("interpret mode runs blocks one after another and has no semaphores: "
            "use num_blocks=1")
  return None


def weights_refusal(head) -> str | None:
  """What the row and batched kernels need of the head's weights: a bf16 or int8 W2 (an
  int8 one with its per-row scales), a bf16 gate for the gated head."""
  serial = head.markov_head
  if head.config.head_type == "gated":
    gate_dtype = jnp.dtype(serial.gate_proj.weight.dtype)
    if gate_dtype != jnp.dtype(jnp.bfloat16):
      return f"the Mosaic kernel's gated head needs a bf16 gate_proj (got {gate_dtype})"
  dtype = jnp.dtype(serial.markov_w2.weight.dtype)
  if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int8)):
    return f"the Mosaic kernel needs a bf16 or int8 W2 (got {dtype})"
  if dtype == jnp.dtype(jnp.int8) and getattr(serial.markov_w2, "scale", None) is None:
    return "an int8 W2 needs per-row scales (use wts_jax.quantize_w2)"
  return None


@dataclasses.dataclass(frozen=True)
class WithLogits:
  """A walk whose caller asked for its logits or log-probabilities: the kernels select
  without writing them, so they are computed from the drafted tokens after the launch
  (``reference.logits_of_tokens``)."""
  inner: object   # the kernel's spec
  logits: bool
  logprobs: bool


def with_logits(spec, shapes):
  """``spec``, in a ``WithLogits`` where the walk asks for logits or log-probabilities."""
  if not (shapes.return_logits or shapes.return_logprobs):
    return spec
  return WithLogits(spec, shapes.return_logits, shapes.return_logprobs)


def launch_with_logits(launch, spec, operands):
  """``launch(spec, head, base_logits, first_tokens, hidden, score_scale, noise_on,
  seed)`` of a Mosaic backend with ``operands`` (a ``WalkOperands``), then the logits and
  log-probabilities of its tokens where ``spec`` is a ``WithLogits``."""
  def run(spec):
    mode = operands.mode
    return launch(spec, operands.head, operands.base_logits, operands.first_tokens,
                  operands.hidden, mode.score_scale, mode.noise_on, mode.seed)
  if not isinstance(spec, WithLogits):
    return run(spec)
  from wts_jax.reference import logits_of_tokens
  output = run(spec.inner)
  logits, logprobs = logits_of_tokens(
      operands.head, operands.base_logits, operands.first_tokens, output.tokens,
      operands.hidden, operands.mode.score_scale, return_logits=spec.logits,
      return_logprobs=spec.logprobs)
  return dataclasses.replace(output, logits=logits, logprobs=logprobs)


def first_tokens(head, first_tokens, vocab):
  """(the first tokens, the status they set). The Mosaic kernels clamp the first tokens
  and report those outside [0, V) themselves, so without a confidence head they go in
  as given, with no op before the launch; the confidence logits read the W1 rows of
  the clamped ids, so with one they are clamped here too."""
  if head.confidence_head is None:
    return first_tokens.astype(jnp.int32), jnp.int32(0)
  from wts_jax.reference import clamp_first_tokens
  return clamp_first_tokens(first_tokens, vocab)


def confidence_logits(head, hidden, first, tokens, w1):
  """The confidence logits from the drafted tokens, or None without a confidence head:
  c_k reads e_k = W1[x_{k-1}], so the tokens give all K of them at once."""
  conf_head = head.confidence_head
  if conf_head is None:
    return None
  from wts_jax.reference import previous_tokens
  previous = previous_tokens(first, tokens)
  return (conf_head.hoist(hidden) + jax.vmap(conf_head.serial, in_axes=1,
                                             out_axes=1)(w1[previous]))
