"""The XLA backend (``impl="xla"``): the step-wise reference walk (``reference.py``), every
walk's last resort and the kernels' oracle. It runs any walk on any device."""

from __future__ import annotations

import dataclasses

from wts_jax.pallas.protocol import WalkOperands


@dataclasses.dataclass(frozen=True)
class XlaPlan:
  """The reference walk has nothing to plan: what it returns besides the tokens."""
  return_logits: bool = False
  return_logprobs: bool = False


def supported_on(device) -> str | None:
  del device
  return None


def plan(head, shapes, config, device) -> XlaPlan:
  del head, config, device
  return XlaPlan(shapes.return_logits, shapes.return_logprobs)


def launch(plan: XlaPlan, operands: WalkOperands):
  from wts_jax.reference import reference_walk
  mode = operands.mode
  return reference_walk(operands.head, operands.base_logits, operands.first_tokens,
                        operands.hidden, mode.score_scale, mode.noise_on, mode.seed,
                        return_logits=plan.return_logits,
                        return_logprobs=plan.return_logprobs)
