"""The profiler: c(B, K) of a device + model pair within a time budget.

It calls any ``cost(batch, draft_len) -> seconds`` (the real loop's
``wts_jax.spec.timing.iteration_cost`` through ``loop_cost_fn``, or a model) for every
draft length K = 0..max at a list of batch buckets, bucket by bucket in an order that
keeps the table usable if the budget runs out: the two ends first, then the midpoints
of the widest gaps (in log B). Before each bucket it projects the bucket's time from
the ones already measured and stops when it would overrun the budget; the table then
holds the measured buckets and ``CostTable.cost`` interpolates between them.

Budget arithmetic (the default grid, 9 buckets x 8 draft lengths = 72 points): one
point is one jit compile of an iteration variant (t_compile) plus warm-up and
``repeats`` timed iterations (repeats x t_iter). With t_compile ~ 2.5 s and 10 x 10 ms
that is ~ 2.6 s a point, ~ 21 s a bucket, ~ 190 s for the grid: inside 5 minutes with
a third to spare. A slower compile trims the middle buckets, never the ends.
"""

from __future__ import annotations

import datetime
import math
import time
from typing import Any, Callable

import jax

from wts_jax.tabletune.cost_table import CostTable

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 48, 64, 128)
DEFAULT_BUDGET_S = 300.0

CostFn = Callable[[int, int], float]


def bucket_order(batches: tuple[int, ...]) -> list[int]:
  """The two ends, then repeatedly the bucket nearest the middle (in log B) of the widest
  remaining gap between chosen buckets."""
  batches = sorted(batches)
  chosen = [batches[0], batches[-1]] if len(batches) > 1 else list(batches)
  remaining = [b for b in batches if b not in chosen]
  while remaining:
    ordered = sorted(chosen)
    gaps = [(math.log(hi) - math.log(lo), lo, hi) for lo, hi in zip(ordered, ordered[1:])
            if any(lo < b < hi for b in remaining)]
    _, lo, hi = max(gaps)
    middle = 0.5 * (math.log(lo) + math.log(hi))
    pick = min((b for b in remaining if lo < b < hi), key=lambda b: abs(math.log(b) - middle))
    chosen.append(pick)
    remaining.remove(pick)
  return chosen


def profile_costs(cost: CostFn, *, device_kind: str, target: str, drafter: str,
                  max_draft_len: int, batches: tuple[int, ...] = DEFAULT_BATCHES,
                  budget_s: float = DEFAULT_BUDGET_S, source: str = "measured",
                  clock: Callable[[], float] = time.perf_counter,
                  log: Callable[[str], None] | None = None) -> CostTable:
  """Measures ``cost(B, K)`` for K = 0..max_draft_len at the buckets that fit the budget."""
  if isinstance(max_draft_len, bool) or not isinstance(max_draft_len, int) or max_draft_len < 1:
    raise ValueError(f"max_draft_len={max_draft_len!r} must be an int >= 1")
  if len(set(batches)) < 2 or min(batches) < 1:
    raise ValueError(f"batches={batches!r} must hold >= 2 distinct ints >= 1")
  if not budget_s > 0:
    raise ValueError(f"budget_s={budget_s!r} must be > 0")
  start = clock()
  measured: dict[int, list[float]] = {}
  bucket_seconds: list[float] = []
  skipped: list[int] = []
  for batch in bucket_order(tuple(batches)):
    elapsed = clock() - start
    projected = max(bucket_seconds) if bucket_seconds else 0.0
    # The two ends are always measured: without them nothing can be interpolated.
    if len(measured) >= 2 and elapsed + projected > budget_s:
      skipped.append(batch)
      continue
    bucket_start = clock()
    row = []
    for draft_len in range(max_draft_len + 1):
      seconds = float(cost(batch, draft_len))
      if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"cost(batch={batch}, draft_len={draft_len})={seconds!r} must be > 0")
      row.append(seconds)
    bucket_seconds.append(clock() - bucket_start)
    measured[batch] = row
    if log:
      log(f"B={batch}: " + " ".join(f"{s * 1e3:.3f}" for s in row) + " ms "
          f"({bucket_seconds[-1]:.1f} s)")
  order = sorted(measured)
  provenance = {
      "source": source,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "jax_version": jax.__version__,
      "profile_seconds": round(clock() - start, 3),
      "budget_s": budget_s,
      "requested_batches": sorted(batches),
      "skipped_batches": sorted(skipped),
  }
  return CostTable(device_kind=device_kind, target=target, drafter=drafter,
                   batches=tuple(order), seconds=tuple(tuple(measured[b]) for b in order),
                   provenance=provenance)


def loop_cost_fn(target: Any, drafter: Any, *, prompt_len: int = 512,
                 repeats: int = 10, **kwargs: Any) -> CostFn:
  """``cost(B, K)`` of the real decode loop: ``wts_jax.spec.timing.iteration_cost``'s
  median device time of one iteration (imported lazily: it needs the end-to-end loop)."""
  from wts_jax.spec.timing import iteration_cost  # pylint: disable=import-outside-toplevel

  def cost(batch: int, draft_len: int) -> float:
    return iteration_cost(target, drafter, batch=batch, draft_len=draft_len,
                          prompt_len=prompt_len, repeats=repeats, **kwargs)["total_s"]

  return cost
