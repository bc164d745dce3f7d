"""How many tokens the decode loop drafts each iteration: the ``DraftPolicy`` protocol.

``generate(..., draft_len=...)`` takes an int (a ``FixedDraftLength``) or any object
that follows ``DraftPolicy``. The loop compiles one branch per k in
1..``max_draft_len`` and switches between them with ``lax.switch``, so a policy that
changes k never recompiles; every method runs inside ``lax.while_loop`` and must be
pure and jittable, its state a pytree of arrays with static shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax.numpy as jnp


@runtime_checkable
class DraftPolicy(Protocol):
  """How many tokens to draft each iteration of the jitted decode loop.

  All methods are pure, jittable, called inside lax.while_loop; state is a pytree of arrays.
  """

  max_draft_len: int  # static: the loop compiles variants for k in 1..max_draft_len

  def init(self, batch: int) -> Any:
    """The policy's state before the first iteration."""
    ...

  def choose(self, state: Any, active: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray, Any]:
    """-> (k: int32 scalar in [1, max_draft_len], per_row_cap: [B] int32 in [0, k], state).

    active: [B] bool. ``per_row_cap[b] < k`` means row b accepts at most
    ``per_row_cap[b]`` drafted tokens this iteration (a draft-only stopping rule:
    lossless for greedy and sampling).
    """
    ...

  def observe(self, state: Any, k: jnp.ndarray, accepted: jnp.ndarray,
              confidence: jnp.ndarray | None, active: jnp.ndarray) -> Any:
    """-> state after one iteration.

    k: int32 scalar drafted this iteration; accepted: [B] int32 draft tokens accepted
    (0..k, excluding the bonus token); confidence: [B, k_max] f32 raw logits from the
    confidence head or None; active: [B] bool.
    """
    ...


@dataclasses.dataclass(frozen=True)
class FixedDraftLength:
  """The trivial policy: always k, no per-row cap."""

  k: int

  def __post_init__(self):
    if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
      raise ValueError(f"draft_len={self.k!r} must be an int >= 1")

  @property
  def max_draft_len(self) -> int:
    return self.k

  def init(self, batch: int) -> tuple[()]:
    del batch
    return ()

  def choose(self, state, active):
    k = jnp.int32(self.k)
    return k, jnp.full(active.shape, self.k, jnp.int32), state

  def observe(self, state, k, accepted, confidence, active):
    del k, accepted, confidence, active
    return state


def as_policy(draft_len: int | DraftPolicy) -> DraftPolicy:
  """``draft_len`` as a policy: an int means ``FixedDraftLength(draft_len)``."""
  if isinstance(draft_len, int) and not isinstance(draft_len, bool):
    return FixedDraftLength(draft_len)
  for name in ("max_draft_len", "init", "choose", "observe"):
    if not hasattr(draft_len, name):
      raise TypeError(f"draft_len={draft_len!r} must be an int or a DraftPolicy "
                      f"(it has no {name!r})")
  max_k = draft_len.max_draft_len
  if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
    raise ValueError(f"draft_len.max_draft_len={max_k!r} must be an int >= 1")
  return draft_len
