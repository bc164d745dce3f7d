"""How many tokens the decode loop drafts each iteration: the ``DraftPolicy`` protocol.

``generate(..., draft_len=...)`` takes an int (a ``FixedDraftLength``) or any object
that follows ``DraftPolicy``. A policy drafts one of its ``draft_lens`` each iteration;
``K = 0`` means no draft: the target runs alone, one token per row. The loop compiles
one branch per draft length and switches between them with ``lax.switch``
(``branch_index``), so a policy that changes K never recompiles.

A policy is a pytree. Its static part — ``draft_lens`` and its method choices — lives in
the treedef (hashed; a change recompiles); its array part — a cost table, a prior — are
its leaves. The loop passes the policy as an operand of its compiled function (not as a
static setting), so a policy with new numbers runs in the same executable. A policy
without leaves (``FixedDraftLength``) is registered static.

Every method is pure and jittable and runs inside the loop's ``lax.while_loop``; the
state is a pytree of static-shape arrays. Per iteration the loop calls::

  k, cap, state = policy.choose(state, active, new_request, rows)
  ...   # the iteration drafts k tokens (k = 0: the target alone), row b accepting <= cap[b]
  state = policy.observe(state, k, accepted, confidence, active, measured)
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np


class MeasuredIteration(NamedTuple):
  """The measured device time of one iteration: ``seconds`` (f32 scalar; NaN or <= 0 when
  that iteration was not measured) of an iteration that drafted ``draft_len`` (int32) over
  ``rows`` (int32: the rows it computed, what its cost follows). It may be an earlier
  iteration's (a timer read one iteration late): it names its own K and rows."""

  seconds: jax.Array
  draft_len: jax.Array
  rows: jax.Array


@runtime_checkable
class DraftPolicy(Protocol):
  """How many tokens to draft each iteration of the jitted decode loop.

  ``draft_lens``: static, distinct increasing ints >= 0 (0: no draft). A policy may give
  ``max_draft_len`` alone instead: it then drafts 1..max_draft_len (``draft_lens_of``).
  All methods are pure, jittable, called inside ``lax.while_loop``; state is a pytree
  of arrays.
  """

  draft_lens: tuple[int, ...]

  def init(self, batch: int) -> Any:
    """The policy's state before the first iteration (inside the compiled loop)."""
    ...

  def choose(self, state: Any, active: jnp.ndarray, new_request: jnp.ndarray | None = None,
             rows: jnp.ndarray | None = None) -> tuple[jnp.ndarray, jnp.ndarray, Any]:
    """-> (k: int32 scalar, one of ``draft_lens``; per_row_cap: [B] int32 in [0, k];
    state).

    active: [B] bool, the rows with a request; new_request: [B] bool, the rows whose
    request started since the last iteration (None: none did) — a policy drops what it
    learnt of the slot's previous request; rows: int32 scalar, the rows this iteration
    computes, what its cost follows (None: the active rows; a static-shape loop that
    runs finished rows along passes B). ``per_row_cap[b] < k`` means row b accepts at
    most ``per_row_cap[b]`` drafted tokens this iteration (lossless for greedy and
    sampling).
    """
    ...

  def observe(self, state: Any, k: jnp.ndarray, accepted: jnp.ndarray,
              confidence: jnp.ndarray | None, active: jnp.ndarray,
              measured: MeasuredIteration | None = None) -> Any:
    """-> state after one iteration.

    k: int32 scalar drafted this iteration (0: none); accepted: [B] int32 draft tokens
    accepted (0..k, excluding the bonus token; 0 for inactive rows and when k = 0);
    confidence: [B, max_draft_len] f32 raw logits from the drafter's confidence head, or
    None; active: [B] bool, the rows that took part; measured: a measured iteration's
    device time, or None when the loop does not time its iterations.
    """
    ...


def check_draft_lens(draft_lens, what: str = "draft_lens") -> tuple[int, ...]:
  """``draft_lens`` as a tuple of distinct increasing ints >= 0, or a ValueError naming
  ``what``."""
  values = tuple(draft_lens)
  if (not values or any(isinstance(k, bool) or not isinstance(k, (int, np.integer))
                        for k in values)
      or min(values) < 0 or list(values) != sorted(set(values))):
    raise ValueError(f"{what}={values!r} must be distinct increasing ints >= 0")
  return tuple(int(k) for k in values)


def draft_lens_of(policy: Any) -> tuple[int, ...]:
  """The draft lengths the loop compiles a branch for: ``policy.draft_lens``, or
  1..``policy.max_draft_len`` for a policy that gives only that."""
  lens = getattr(policy, "draft_lens", None)
  if lens is None:
    max_k = getattr(policy, "max_draft_len", None)
    if isinstance(max_k, bool) or not isinstance(max_k, int) or max_k < 1:
      raise ValueError(f"draft_len.max_draft_len={max_k!r} must be an int >= 1")
    return tuple(range(1, max_k + 1))
  return check_draft_lens(lens, "draft_len.draft_lens")


def max_draft_len(policy: Any) -> int:
  """The longest draft the policy may choose (0 for a policy that never drafts)."""
  return draft_lens_of(policy)[-1]


def searchsorted(xp, sorted_values, values, side: str = "left"):
  """``xp.searchsorted``; in jax by comparing against every entry: its default search is a
  loop of log2(n) steps, which inside the decode loop on a GPU is a kernel and a host
  check a step, where comparing a handful of labels or buckets is one fused operation."""
  if xp is jnp:
    return jnp.searchsorted(sorted_values, values, side=side, method="compare_all")
  return np.searchsorted(sorted_values, values, side=side)


def branch_index(draft_lens: tuple[int, ...], k: jnp.ndarray) -> jnp.ndarray:
  """The ``lax.switch`` index of draft length ``k`` among ``draft_lens``."""
  if len(draft_lens) == 1:
    return jnp.int32(0)
  return jnp.clip(searchsorted(jnp, jnp.asarray(draft_lens, jnp.int32), k), 0,
                  len(draft_lens) - 1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class FixedDraftLength:
  """The trivial policy: always k (0: never draft), no per-row cap."""

  k: int

  def __post_init__(self):
    if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
      raise ValueError(f"draft_len={self.k!r} must be an int >= 0")

  @property
  def draft_lens(self) -> tuple[int, ...]:
    return (self.k,)

  @property
  def max_draft_len(self) -> int:
    return self.k

  def init(self, batch: int) -> tuple[()]:
    del batch
    return ()

  def choose(self, state, active, new_request=None, rows=None):
    del new_request, rows
    k = jnp.int32(self.k)
    return k, jnp.full(active.shape, self.k, jnp.int32), state

  def observe(self, state, k, accepted, confidence, active, measured=None):
    del k, accepted, confidence, active, measured
    return state


jax.tree_util.register_static(FixedDraftLength)


def as_policy(draft_len: int | DraftPolicy) -> DraftPolicy:
  """``draft_len`` as a policy: an int means ``FixedDraftLength(draft_len)``."""
  if isinstance(draft_len, int) and not isinstance(draft_len, bool):
    return FixedDraftLength(draft_len)
  for name in ("init", "choose", "observe"):
    if not hasattr(draft_len, name):
      raise TypeError(f"draft_len={draft_len!r} must be an int or a DraftPolicy "
                      f"(it has no {name!r})")
  draft_lens_of(draft_len)
  return draft_len
