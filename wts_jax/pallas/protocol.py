"""What passes between the registry (``backend``) and a backend's module: the facts a
planner may know about a walk, the validated operands a launch receives, and a
refusal. A leaf module, so that the backends need not import the registry that
imports them."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Refusal:
  """Why a backend cannot run a walk: one sentence that names the value."""
  reason: str


@dataclasses.dataclass(frozen=True)
class WalkShapes:
  """What a planner may know about a walk besides the head: static facts only."""
  batch: int
  steps: int
  base_itemsize: int = 2
  greedy: bool = True
  return_logits: bool = False
  return_logprobs: bool = False

  @classmethod
  def of(cls, base_logits, greedy: bool, *, return_logits=False, return_logprobs=False):
    batch, steps, _ = base_logits.shape
    return cls(batch=batch, steps=steps,
               base_itemsize=jnp.dtype(base_logits.dtype).itemsize, greedy=greedy,
               return_logits=return_logits, return_logprobs=return_logprobs)


@dataclasses.dataclass(frozen=True)
class WalkOperands:
  """The validated inputs of one walk, as ``launch`` receives them."""
  head: object
  base_logits: object
  first_tokens: object
  hidden: object
  mode: object      # validation.Sampling
