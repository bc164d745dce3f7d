"""What ``generate`` returns: the tokens, counts, the status word and its error."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from wts_jax.output import describe_status

PAD = -1   # fills ``GenerateOutput.tokens`` after each row's end

# Status bits of ``GenerateOutput.status``. The low byte holds the walk's own bits
# (``wts_jax.output.STATUS_*``, OR-ed over the iterations).
STATUS_TARGET_NONFINITE = 1 << 8    # a row's target logits were NaN or ±Inf (row stopped)
STATUS_DRAFTER_NONFINITE = 1 << 9   # a row's drafter logits were NaN or ±Inf (its drafts
                                    # were not accepted; the output stays exact)
WALK_BITS = 0xFF
_STATUS_TEXT = {
    STATUS_TARGET_NONFINITE: ("the target's logits were NaN or infinite (check its "
                              "weights); those rows stopped early"),
    STATUS_DRAFTER_NONFINITE: ("the drafter's logits were NaN or infinite (check its "
                               "weights); its drafts were not accepted"),
}


class GenerateError(RuntimeError):
  """``generate`` finished but a part reported a problem (``GenerateOutput.status``)."""


def describe_generate_status(status: int) -> str:
  parts = [text for bit, text in _STATUS_TEXT.items() if status & bit]
  if status & WALK_BITS:
    parts.append(f"walk: {describe_status(status & WALK_BITS)}")
  return "; ".join(parts) if parts else "ok"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """tokens [B, max_new_tokens] int32 (``PAD`` after each row's end); num_tokens [B];
  iterations: decode iterations run (target verify passes); accepted [B]: drafted
  tokens accepted in all; steps [B]: iterations in which the row was still decoding;
  status: int32, 0 when all went well, else ``STATUS_*`` bits (``check``);
  policy_state: the draft policy's state after the last iteration (what a controller
  learnt: ``TableTuneController.with_learned_costs`` starts the next call from it)."""

  tokens: jax.Array
  num_tokens: jax.Array
  iterations: jax.Array
  accepted: jax.Array
  steps: jax.Array
  status: jax.Array
  policy_state: object = ()

  def acceptance_length(self) -> np.ndarray:
    """Tokens committed per verify pass, per row (accepted drafts + 1)."""
    steps = np.maximum(np.asarray(self.steps), 1)
    return (np.asarray(self.accepted) + np.asarray(self.steps)) / steps

  def rows(self) -> list[list[int]]:
    """Each row's generated tokens as a list."""
    tokens, counts = np.asarray(self.tokens), np.asarray(self.num_tokens)
    return [tokens[b, :counts[b]].tolist() for b in range(tokens.shape[0])]

  def check(self) -> "GenerateOutput":
    """Raise ``GenerateError`` naming what went wrong if ``status`` is not 0."""
    status = int(np.asarray(self.status))
    if status:
      raise GenerateError(f"generate status={status}: {describe_generate_status(status)}")
    return self
