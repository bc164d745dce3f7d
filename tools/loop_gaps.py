"""Where the GPU waits inside a decode loop: the idle gaps of a profiled ``generate`` call.

  python tools/loop_gaps.py TRACE.perfetto_trace.json.gz [--module jit_run] [--min-us 5]

Reads a Perfetto trace (``jax.profiler.trace(..., create_perfetto_trace=True)``; the
``wts-e2e-bench`` profiles, ``tools/e2e_session.sh`` brings some back) and, over the GPU
kernels of one compiled program (``--module``: its HLO module name), finds every stretch
of at least ``--min-us`` in which no kernel ran. Gaps are grouped by the kernels on either
side (a loop's gaps recur once an iteration) and printed as JSON lines, the costliest
group first: count, median and total µs, the kernel before and after, the HLO operations
(command buffer or custom call) they ran in, and the host events that began or ended in
the group's longest gap (what the host did while the GPU waited; a profile taken with
``jax.profiler.ProfileOptions(host_tracer_level=3)`` names XLA's thunks there). Then a
line per CUDA graph the host launched: how often, the host's ``cuGraphLaunch`` time
(median, longest) and the graph's kernels a launch — a graph's kernels start only as its
launch returns, so a long launch is GPU idle unless earlier work covers it. The last
line sums it: the span of the program's kernels, their busy time, the idle time.
Device time summed by phase (``specdecode.phase_profile``) leaves these gaps out; the
wall clock of the loop does not.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wts_jax.specdecode.phase_profile import (busy_seconds, device_kernels, is_copy,  # noqa: E402
                                              read_trace)


def gaps(events: list[dict], module: str, min_us: float) -> tuple[list[dict], dict]:
  """(the gaps of ``module``'s kernels, the totals): each gap with its length (µs), its
  start, and the kernel events before and after it."""
  kernels = sorted((e for e in device_kernels(events)
                    if e.get("args", {}).get("hlo_module") == module and not is_copy(e)),
                   key=lambda e: float(e["ts"]))
  if not kernels:
    raise ValueError(f"no GPU kernel of module {module!r} in the trace")
  found = []
  last = kernels[0]
  end = float(last["ts"])
  for event in kernels:
    start, stop = float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0.0))
    if start - end >= min_us:
      found.append(dict(us=start - end, at=end, before=last, after=event))
    if stop > end:
      end, last = stop, event
  span = end - float(kernels[0]["ts"])
  busy = busy_seconds(kernels) * 1e6
  return found, dict(span_us=span, busy_us=busy, idle_us=span - busy, kernels=len(kernels))


def grouped(found: list[dict], events: list[dict]) -> list[dict]:
  """The gaps grouped by (kernel before, kernel after), costliest first, each group with
  the host events that began or ended in its longest gap."""
  gpu = {id(e) for e in device_kernels(events)}
  host = [e for e in events if e.get("ph") == "X" and id(e) not in gpu]
  groups: dict[tuple, list[dict]] = {}
  for gap in found:
    key = (gap["before"]["name"], gap["after"]["name"])
    groups.setdefault(key, []).append(gap)
  rows = []
  for (before, after), members in groups.items():
    lengths = [gap["us"] for gap in members]
    longest = max(members, key=lambda gap: gap["us"])
    lo, hi = longest["at"], longest["at"] + longest["us"]
    # what the host began or finished while the GPU waited (not the calls around it all)
    overlapping = sorted({str(e.get("name")) for e in host
                          if lo <= float(e["ts"]) <= hi
                          or lo <= float(e["ts"]) + float(e.get("dur", 0)) <= hi})
    rows.append(dict(count=len(members), median_us=round(statistics.median(lengths), 1),
                     total_us=round(sum(lengths), 1), before=before[:80], after=after[:80],
                     before_op=longest["before"].get("args", {}).get("hlo_op"),
                     after_op=longest["after"].get("args", {}).get("hlo_op"),
                     host_during_longest=overlapping[:12]))
  return sorted(rows, key=lambda row: row["total_us"], reverse=True)


_GRAPH_LAUNCH = re.compile(r"cuGraphLaunch \(CudaGraph:(\d+)\)")


def graph_launches(events: list[dict]) -> list[dict]:
  """Per CUDA graph (by id): launches, the host's launch time (median and longest µs),
  the GPU kernels it ran a launch and the host µs a kernel; the most host time
  (median × launches) first."""
  launches: dict[str, list[float]] = {}
  for event in events:
    match = _GRAPH_LAUNCH.fullmatch(str(event.get("name", "")))
    if event.get("ph") == "X" and match:
      launches.setdefault(match.group(1), []).append(float(event.get("dur", 0.0)))
  kernels: dict[str, int] = {}
  for event in device_kernels(events):
    graph = event.get("args", {}).get("cuda_graph_id")
    if graph is not None and not is_copy(event):
      kernels[str(graph)] = kernels.get(str(graph), 0) + 1
  rows = []
  for graph, times in launches.items():
    median = statistics.median(times)
    per_launch = kernels.get(graph, 0) / len(times)
    rows.append(dict(graph=graph, launches=len(times), host_median_us=round(median, 1),
                     host_max_us=round(max(times), 1), kernels_per_launch=round(per_launch, 1),
                     host_us_per_kernel=round(median / per_launch, 2) if per_launch else None))
  return sorted(rows, key=lambda row: row["host_median_us"] * row["launches"], reverse=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("trace", type=Path)
  parser.add_argument("--module", default="jit_run",
                      help="the HLO module whose kernels to read (default: jit_run, the "
                           "name generate's loop compiles under)")
  parser.add_argument("--min-us", type=float, default=5.0,
                      help="the shortest stretch without a kernel counted as a gap")
  parser.add_argument("--top", type=int, default=10)
  args = parser.parse_args(argv)
  try:
    events = read_trace(args.trace)
    found, totals = gaps(events, args.module, args.min_us)
  except (OSError, ValueError, KeyError) as err:
    print(f"error: {args.trace}: {err}", file=sys.stderr)
    return 2
  for row in grouped(found, events)[:args.top]:
    print(json.dumps(row))
  for row in graph_launches(events)[:args.top]:
    print(json.dumps(row))
  print(json.dumps({key: round(value, 1) for key, value in totals.items()}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
