"""What a walk returns, and the status word every implementation reports."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

# Status bits: a walk never raises from inside a compiled program; it reports.
STATUS_NAN_LOGITS = 1          # a corrected logit was NaN (NaN in base_logits or weights)
STATUS_TOKEN_OUT_OF_RANGE = 2  # a first token was outside [0, V) (clamped to run on)
STATUS_SYNC_TIMEOUT = 4        # a kernel's bounded grid-barrier wait gave up

_STATUS_TEXT = {
    STATUS_NAN_LOGITS: "NaN in the corrected logits (check base_logits and the head weights)",
    STATUS_TOKEN_OUT_OF_RANGE: "a first token was outside [0, vocab_size)",
    STATUS_SYNC_TIMEOUT: ("the kernel's grid barrier timed out (programs were not "
                          "co-resident); the tokens are not valid"),
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


def check(output: WalkOutput) -> WalkOutput:
  """Raise ``WalkError`` if the walk reported a problem (blocks on the status word)."""
  status = int(np.asarray(output.status))
  if status:
    raise WalkError(f"walk status={status}: {describe_status(status)}")
  return output
