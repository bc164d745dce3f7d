"""``wts_jax.walk``: the public entry point, and the choice of implementation."""

from __future__ import annotations

import jax

from wts_jax import validation
from wts_jax.output import WalkOutput, check
from wts_jax.reference import reference_walk
from wts_jax.walk_config import WalkConfig

IMPLEMENTATIONS = ("auto", "pallas", "xla")


def _pallas_walk():
  # GPU-only code imports lazily: the package must import on any machine.
  from wts_jax.pallas import walk_kernel
  return walk_kernel


def pallas_unsupported_reason(head, base_logits, config: WalkConfig) -> str | None:
  """Why ``impl="pallas"`` cannot run this walk here (None when it can)."""
  if not config.interpret and jax.default_backend() != "gpu":
    return f"no GPU (default backend is {jax.default_backend()!r}; use impl='xla')"
  try:
    walk_kernel = _pallas_walk()
  except ImportError as err:  # pragma: no cover - depends on the installed jaxlib
    return f"the Pallas GPU backend failed to import: {err}"
  return walk_kernel.unsupported_reason(head, base_logits, config)


def walk(head, base_logits: jax.Array, first_tokens: jax.Array,
         hidden: jax.Array | None = None, *, temperature=0.0, key: jax.Array | None = None,
         return_logits: bool = False, return_logprobs: bool = False,
         impl: str = "auto", config: WalkConfig | None = None) -> WalkOutput:
  """Walk the serial head over a block of K draft positions.

  Args:
    head: a ``DraftHead`` (or a bare serial head), e.g. from ``wts_jax.load``.
    base_logits: [B, K, V] backbone logits of the K draft positions.
    first_tokens: [B] int, the last accepted token ``x_{-1}`` of each row.
    hidden: [B, K, d] backbone hidden states; needed by the gated and rnn heads and by
      the confidence head.
    temperature: 0 for greedy; a number > 0 or a [B] array (0 entries stay greedy)
      samples by Gumbel-max with ``key``'s counter-based noise.
    key: a JAX PRNG key, needed when sampling; the same key gives the same tokens on
      every implementation.
    return_logits / return_logprobs: also return the corrected logits [B, K, V] /
      the log-probability of each drafted token [B, K].
    impl: ``"pallas"`` (the Weights-That-Stay kernel), ``"xla"`` (the step-wise
      reference) or ``"auto"`` (the kernel where it supports the walk, else XLA).
    config: kernel options (residency, grid, interpret mode); see ``WalkConfig``.

  Returns a ``WalkOutput``. Called eagerly, a reported problem (NaN logits, a barrier
  timeout) raises ``WalkError``; under ``jit`` it is left in ``WalkOutput.status``.
  """
  config = WalkConfig() if config is None else config
  head = validation.as_draft_head(head)
  validation.check_walk_inputs(head, base_logits, first_tokens, hidden)
  mode = validation.make_sampling(temperature, key, base_logits.shape[0])
  if not head.config.needs_hidden:
    hidden = None  # nothing reads it; keep it out of the compiled program

  if chosen_implementation(head, base_logits, impl, config) == "pallas":
    output = _pallas_walk().kernel_walk(
        head, base_logits, first_tokens, hidden, mode, config=config,
        return_logits=return_logits, return_logprobs=return_logprobs)
  else:
    output = reference_walk(head, base_logits, first_tokens, hidden, mode.score_scale,
                            mode.noise_on, mode.seed, return_logits=return_logits,
                            return_logprobs=return_logprobs)
  if validation.is_concrete(output.status):
    check(output)
  return output


def chosen_implementation(head, base_logits, impl: str = "auto",
                          config: WalkConfig | None = None) -> str:
  """The implementation ``walk(..., impl=impl)`` would run (``"pallas"`` or ``"xla"``)."""
  if impl not in IMPLEMENTATIONS:
    raise ValueError(f"impl={impl!r} must be one of {IMPLEMENTATIONS}")
  if impl == "xla":
    return "xla"
  config = WalkConfig() if config is None else config
  reason = pallas_unsupported_reason(validation.as_draft_head(head), base_logits, config)
  if reason is None:
    return "pallas"
  if impl == "pallas":
    raise ValueError(f"impl='pallas' cannot run this walk: {reason}")
  return "xla"
