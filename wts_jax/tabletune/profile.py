"""The profiler: c(B, K) of a device + model pair within a time budget.

It calls any ``cost(batch, draft_len) -> seconds`` (the real loop's
``wts_jax.specdecode.timing.iteration_cost`` through ``loop_cost_fn``, or a model) for each
draft length of ``draft_lens`` (default K = 0..max) at a list of batch buckets, bucket
by bucket in an order that
keeps the table usable if the budget runs out: the two ends first, then the midpoints
of the widest gaps (in log B). Before each bucket it projects the bucket's time from
the ones already measured and stops when it would overrun the budget; the table then
holds the measured buckets and ``CostTable.cost`` interpolates between them.

``draft_lens`` may name a subset of K to measure: the table then holds those columns,
labelled (``CostTable.cost`` is linear in K between labels; a controller chooses among
the labels).

Budget arithmetic: a point costs one compile of the iteration (t_c) plus its timed runs
(with ``iteration_cost``: a warm-up and 5 samples of 8 chained iterations, ~ 50 t_it);
``LoopCost`` compiles a bucket's points in parallel threads, so a bucket pays about its
slowest compile; a contested point measured again costs its timed runs only (its
compiled iteration is kept).
The full default grid is 9 buckets x 8 K = 72 points: at t_c ~ 2.5 s and t_it ~ 10 ms,
~ 3 s a point, ~ 215 s. The recommended real-loop grid, buckets 1, 4, 16, 32, 64, 128 and
K = 0, 1, 2, 3, 5, 7, is 36 points: within 300 s while t_c + 50 t_it <= 8 s (Qwen3-8B on
an H200: ~ 8 s, and the projection drops one middle bucket). A slower compile trims the
middle buckets, never the two ends.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
from typing import Any, Callable

import jax
import numpy as np

from wts_jax.specdecode.policy import check_draft_lens
from wts_jax.tabletune.cost_table import CostTable

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 48, 64, 128)
DEFAULT_BUDGET_S = 300.0
# Acceptance levels whose K* decisions the re-measurement protects: p_j = rate · 0.97^j.
CONTEST_RATES = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))

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
                  draft_lens: tuple[int, ...] | None = None,
                  clock: Callable[[], float] = time.perf_counter,
                  log: Callable[[str], None] | None = None) -> CostTable:
  """Measures ``cost(B, K)`` for K in ``draft_lens`` (default 0..max_draft_len) at the
  buckets that fit the budget."""
  if isinstance(max_draft_len, bool) or not isinstance(max_draft_len, int) or max_draft_len < 1:
    raise ValueError(f"max_draft_len={max_draft_len!r} must be an int >= 1")
  if len(set(batches)) < 2 or min(batches) < 1:
    raise ValueError(f"batches={batches!r} must hold >= 2 distinct ints >= 1")
  if not budget_s > 0:
    raise ValueError(f"budget_s={budget_s!r} must be > 0")
  all_lens = tuple(range(max_draft_len + 1))
  measured_lens = all_lens if draft_lens is None else check_draft_lens(draft_lens)
  if len(measured_lens) < 2 or measured_lens[-1] != max_draft_len:
    raise ValueError(f"draft_lens={draft_lens!r} must hold >= 2 draft lengths in "
                     f"0..{max_draft_len}, {max_draft_len} among them")
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
    # A cost that can compile a bucket's points at once does so before timing them.
    prepare = getattr(cost, "prepare", None)
    prepared = prepare(batch, measured_lens) if prepare is not None else None
    row = []
    for draft_len in measured_lens:
      seconds = float(cost(batch, draft_len))
      if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"cost(batch={batch}, draft_len={draft_len})={seconds!r} must be > 0")
      row.append(seconds)
    bucket_seconds.append(clock() - bucket_start)
    measured[batch] = row
    if log:
      # (where the cost compiled the bucket first, how long tracing and compiling took)
      spent = "".join(f", {name[:-2]} {seconds:.1f} s" for name, seconds
                      in (prepared or {}).items())
      log(f"B={batch}: " + " ".join(f"{s * 1e3:.3f}" for s in row) + " ms "
          f"({bucket_seconds[-1]:.1f} s{spent})")
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
                   batches=tuple(order), draft_lens=measured_lens,
                   seconds=tuple(tuple(measured[b]) for b in order),
                   provenance=provenance)


def remeasure_contested(table: CostTable, cost: CostFn, profiles=None, *,
                        margin: float = 0.03,
                        rounds: int = 3, budget_s: float = DEFAULT_BUDGET_S,
                        point_seconds: float = 0.0,
                        clock: Callable[[], float] = time.perf_counter,
                        log: Callable[[str], None] | None = None) -> CostTable:
  """Measures again the points that decide K*, and averages: for each bucket and each
  acceptance profile, the best K and the runner-up when their tokens/s are within
  ``margin`` of each other. Measurement noise matters only there (a flat top), so that
  is where the budget goes. Columns an older profile interpolated (its provenance's
  ``interpolated_draft_lens``) are left alone. No point starts
  that would end past ``budget_s`` by the longest point so far (``point_seconds``, e.g.
  the first pass's mean, stands in before the first). ``profiles``
  None: p_j = rate · 0.97^j for each of ``CONTEST_RATES``. ``log`` gets a line a point."""
  from wts_jax.tabletune.table import profile_from_rate, tokens_per_second  # pylint: disable=import-outside-toplevel
  if profiles is None:
    profiles = [profile_from_rate(rate, table.max_draft_len, 0.97) for rate in CONTEST_RATES]
  start = clock()
  seconds = table.array()
  counts = np.ones_like(seconds)
  interpolated = set(table.provenance.get("interpolated_draft_lens", []))
  remeasured = 0
  longest = 0.0
  for _ in range(rounds):
    current = dataclasses.replace(table, seconds=tuple(map(tuple, seconds.tolist())))
    contested = set()
    for i, batch in enumerate(current.batches):
      for profile in profiles:
        rates = tokens_per_second(current, profile, batch)
        best, second = np.argsort(rates)[::-1][:2]
        if rates[second] >= rates[best] * (1.0 - margin):
          contested |= {(i, int(j)) for j in (best, second)
                        if table.draft_lens[j] not in interpolated}
    if not contested:
      break
    for i, j in sorted(contested):
      # Stop before a point that would overrun the budget, its time projected as the
      # longest point so far (``point_seconds`` before the first).
      if clock() - start + (longest if remeasured else point_seconds) > budget_s:
        break
      point_start = clock()
      measured = float(cost(current.batches[i], table.draft_lens[j]))
      seconds[i, j] = (seconds[i, j] * counts[i, j] + measured) / (counts[i, j] + 1)
      longest = max(longest, clock() - point_start)
      counts[i, j] += 1
      remeasured += 1
      if log:
        log(f"again B={current.batches[i]} K={table.draft_lens[j]}: {measured * 1e3:.3f} ms, "
            f"mean of {int(counts[i, j])} {seconds[i, j] * 1e3:.3f} ms "
            f"({clock() - start:.1f} s of {budget_s:.0f})")
  provenance = {**table.provenance, "remeasured_points": remeasured,
                "remeasure_margin": margin,
                "remeasure_seconds": round(clock() - start, 3)}
  return dataclasses.replace(table, seconds=tuple(map(tuple, seconds.tolist())),
                             provenance=provenance)


class LoopCost:
  """``cost(B, K)`` of the real decode loop: ``wts_jax.specdecode.timing.iteration_cost``'s
  median device time of one whole iteration (imported lazily: it needs the end-to-end
  loop). Only the ``total`` piece is timed: each piece is one more compile. ``prepare``
  compiles a bucket's draft lengths at once (``timing.compile_iterations``); a point
  timed again (a contested one) reuses its compiled iteration."""

  def __init__(self, target: Any, drafter: Any, *, prompt_len: int = 512, repeats: int = 5,
               compile_threads: int = 8, **kwargs: Any):
    self.target, self.drafter = target, drafter
    self.prompt_len, self.repeats, self.kwargs = prompt_len, repeats, kwargs
    self.compile_threads = compile_threads
    self.runs: dict = {}

  def prepare(self, batch: int, draft_lens: tuple[int, ...]) -> dict[str, float]:
    """Compiles the bucket's iterations; returns the seconds spent tracing and compiling
    (``trace_s``, ``compile_s``)."""
    from wts_jax.specdecode.timing import compile_iterations  # pylint: disable=import-outside-toplevel
    return compile_iterations(self.target, self.drafter, batch=batch,
                              draft_lens=draft_lens, prompt_len=self.prompt_len,
                              runs=self.runs, threads=self.compile_threads, **self.kwargs)

  def __call__(self, batch: int, draft_len: int) -> float:
    from wts_jax.specdecode.timing import iteration_cost  # pylint: disable=import-outside-toplevel
    return iteration_cost(self.target, self.drafter, batch=batch, draft_len=draft_len,
                          prompt_len=self.prompt_len, repeats=self.repeats,
                          pieces=("total",), runs=self.runs, **self.kwargs)["total_s"]


def loop_cost_fn(target: Any, drafter: Any, *, prompt_len: int = 512,
                 repeats: int = 5, **kwargs: Any) -> LoopCost:
  """The real loop's ``cost(B, K)`` (``LoopCost``)."""
  return LoopCost(target, drafter, prompt_len=prompt_len, repeats=repeats, **kwargs)
