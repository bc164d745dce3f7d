"""What a walk returns, and the status word every implementation reports."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

# Status bits: a walk never raises from inside a compiled program; it reports.
STATUS_NAN_LOGITS = 1          # a corrected logit was NaN (NaN in base_logits or weights)
STATUS_TOKEN_OUT_OF_RANGE = 2  # a first token was outside [0, V) (clamped to run on)
STATUS_SYNC_TIMEOUT = 4        # a kernel's bounded grid-barrier wait gave up
STATUS_NAN_CONFIDENCE = 8      # a confidence logit was NaN (NaN in hidden or its weights)
STATUS_BAD_LOGPROBS = 16       # a log-probability was NaN or +Inf (a +Inf logit, or a step
                               # whose logits were all -Inf)
STATUS_INVALID_TEMPERATURE = 32  # a traced temperature was negative or not finite (that
                                 # row was walked greedily)
STATUS_NO_FINITE_LOGIT = 64    # a step's logits were all -Inf: no token can be chosen

# The bits a walk kernel itself can set (a kernel that reduces its status in the kernel
# keeps a counter for each).
KERNEL_STATUS_BITS = (STATUS_NAN_LOGITS, STATUS_TOKEN_OUT_OF_RANGE, STATUS_SYNC_TIMEOUT)

_STATUS_TEXT = {
    STATUS_NAN_LOGITS: "NaN in the corrected logits (check base_logits and the head weights)",
    STATUS_TOKEN_OUT_OF_RANGE: "a first token was outside [0, vocab_size)",
    STATUS_SYNC_TIMEOUT: ("the kernel's grid barrier timed out (programs were not "
                          "co-resident); the tokens are not valid"),
    STATUS_NAN_CONFIDENCE: ("NaN in the confidence logits (check hidden and the "
                            "confidence head's weights)"),
    STATUS_BAD_LOGPROBS: ("a log-probability is NaN or +Inf (a +Inf base logit, or a step "
                          "whose logits are all -Inf)"),
    STATUS_INVALID_TEMPERATURE: ("a temperature was negative or not finite (passed traced, "
                                 "so not refused at the call); those rows were walked "
                                 "greedily"),
    STATUS_NO_FINITE_LOGIT: ("a step's logits were all -Inf (every token masked out of "
                             "base_logits): no token can be chosen, the tokens there are "
                             "not drafts"),
}


class WalkError(RuntimeError):
  """A walk finished but reported a problem (see ``WalkOutput.status``)."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WalkOutput:
  """Result of ``wts_jax.walk``.

  tokens: [B, K] int32 drafted tokens. confidence: [B, K] fp32 raw confidence logits
  (None without a confidence head). logits: [B, K, V] fp32 corrected logits
  ``base + W2·z`` (with ``return_logits``). logprobs: [B, K] fp32 log-probability of each
  drafted token under the draft distribution, ``log_softmax(logits / T)`` (``T = 1`` for
  greedy rows) (with ``return_logprobs``). status: int32 scalar, 0 when all is well, else
  a bitmask of the ``STATUS_*`` flags; an eager call raises ``WalkError`` instead.
  """

  tokens: jax.Array
  status: jax.Array
  confidence: jax.Array | None = None
  logits: jax.Array | None = None
  logprobs: jax.Array | None = None


def describe_status(status: int) -> str:
  parts = [text for bit, text in _STATUS_TEXT.items() if status & bit]
  return "; ".join(parts) if parts else "ok"


def output_status(confidence, logprobs, *, walk_ndim: int = 2):
  """The status bits that a walk's outputs show by themselves (NaN confidence, NaN or
  +Inf log-probabilities), one int32 per walk: over the last ``walk_ndim`` axes ([B, K])
  of ``confidence`` / ``logprobs`` (either may be None). Works on jax arrays under
  ``jit`` and on numpy arrays."""
  xp = np if all(isinstance(a, np.ndarray) for a in (confidence, logprobs)
                 if a is not None) else jnp
  status = xp.int32(0)
  axes = tuple(range(-walk_ndim, 0))
  if confidence is not None:
    nan = xp.any(xp.isnan(confidence), axis=axes)
    status = status | xp.where(nan, STATUS_NAN_CONFIDENCE, 0).astype(xp.int32)
  if logprobs is not None:
    bad = xp.any(xp.isnan(logprobs) | (logprobs == xp.inf), axis=axes)
    status = status | xp.where(bad, STATUS_BAD_LOGPROBS, 0).astype(xp.int32)
  return status


def check(output: WalkOutput) -> WalkOutput:
  """Raise ``WalkError`` if the walk reported a problem (blocks on the status word).

  Works on one walk and on walks stacked by ``vmap`` or ``lax.scan`` (status of shape
  [N, ...]): the error then says how many of them reported and which first. Also raises
  for what the outputs show by themselves (NaN confidence or log-probabilities) when
  the status word does not say it (an implementation that does not check them).
  """
  if isinstance(output.status, jax.core.Tracer):
    raise TypeError("check(output) needs a concrete output; under jit read output.status "
                    "(0 when all is well) or call check on the jitted function's result")
  status = np.asarray(output.status).astype(np.int32)
  status = status | output_status(
      None if output.confidence is None else np.asarray(output.confidence),
      None if output.logprobs is None else np.asarray(output.logprobs))
  if not status.any():
    return output
  bits = int(np.bitwise_or.reduce(status.reshape(-1)))
  where = ""
  if status.ndim:
    first = tuple(int(i) for i in np.argwhere(status != 0)[0])
    where = (f" in {np.count_nonzero(status)} of {status.size} walks (first at index "
             f"{first[0] if len(first) == 1 else first})")
  raise WalkError(f"walk status={bits}{where}: {describe_status(bits)}")
