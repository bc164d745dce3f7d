"""Device time of a real ``generate`` call, split by the loop's phases, from a profile.

``generate``'s iteration names its phases (``loop.PHASES``: verify, drafter, walk) with
``jax.named_scope``, so every HLO operation's ``op_name`` carries its phase. A profile
(``jax.profiler.trace`` with a Perfetto trace) records each GPU kernel with the HLO
operation it ran; summing their durations by the phase of that operation gives the
device time of each phase inside the loop itself, "other" for the rest (the commit,
cache writes outside the phases, the loop's own bookkeeping).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from wts_jax.specdecode.loop import PHASES

_MODULE = re.compile(r"^HloModule ([\w\.\-]+)", re.MULTILINE)
_OP_NAME = re.compile(r"^\s*(?:ROOT )?%?([\w\.\-]+) = .*?metadata=\{[^}]*op_name=\"([^\"]*)\"")


def op_phases(hlo_text: str) -> dict[str, str]:
  """Each HLO instruction's phase (``PHASES`` or "other"), by instruction name."""
  phases = {}
  for line in hlo_text.splitlines():
    match = _OP_NAME.match(line)
    if match:
      phases[match.group(1)] = phase_of(match.group(2))
  return phases


def phase_of(op_name: str) -> str:
  for phase in PHASES:
    if f"/{phase}/" in op_name or op_name.endswith(f"/{phase}"):
      return phase
  return "other"


def _trace_events(trace_dir: Path) -> list[dict]:
  files = sorted(Path(trace_dir).rglob("perfetto_trace.json.gz"))
  if not files:
    raise ValueError(f"{trace_dir}: no perfetto_trace.json.gz (profile with "
                     "jax.profiler.trace(dir, create_perfetto_trace=True))")
  return read_trace(files[-1])


def read_trace(path: Path) -> list[dict]:
  """The events of one Perfetto trace file (``perfetto_trace.json.gz``)."""
  with gzip.open(path, "rt") as f:
    data = json.load(f)
  return data["traceEvents"] if isinstance(data, dict) else data


def device_kernels(events: list[dict]) -> list[dict]:
  """The complete events of the GPU's processes (named ``/device:GPU:…``)."""
  gpu = {e.get("pid") for e in events
         if e.get("ph") == "M" and e.get("name") == "process_name"
         and "GPU" in str(e.get("args", {}).get("name", ""))}
  return [e for e in events if e.get("ph") == "X" and e.get("pid") in gpu]


def _kernel_name(name: str) -> str:
  """An HLO instruction's name as its kernel is named (``loop_add_fusion.71`` →
  ``loop_add_fusion_71``)."""
  return re.sub(r"[.\-]", "_", name)


def phase_seconds(kernels: list[tuple[dict, str]]) -> dict[str, float]:
  """``{phase: device seconds}`` (and ``"other"``, ``"unattributed"`` for kernels whose
  phase nothing tells) over a profile's kernels (``attributed_kernels``)."""
  totals = {phase: 0.0 for phase in (*PHASES, "other", "unattributed")}
  for event, phase in kernels:
    totals[phase] += float(event.get("dur", 0.0)) * 1e-6
  return totals


def attributed_kernels(trace_dir: Path, hlo_text: str) -> list[tuple[dict, str]]:
  """Each GPU kernel of the profile with its phase.

  A kernel launched alone names its HLO operation (``hlo_op``). Inside a CUDA graph
  (XLA's command buffers: a loop body's kernels) ``hlo_op`` names the command buffer,
  and the kernel's own name is its fusion's instruction name, or a library's or a custom
  call's name (cuBLAS ``nvjet_…``, a Pallas kernel) that several phases may share; such
  a kernel takes the phase of the kernel before it on its stream (a phase's kernels run
  in program order, and a phase opens with a fusion that names it). A kernel that names
  another executable (``hlo_module``: the call's set-up, a check after it) is not the
  loop's: its instruction names may be the loop's too, so it is left out."""
  module = _MODULE.search(hlo_text)
  phases = op_phases(hlo_text)
  by_kernel_name: dict[str, set[str]] = {}
  for op, phase in phases.items():
    by_kernel_name.setdefault(_kernel_name(op), set()).add(phase)
  previous: dict[tuple, str] = {}
  attributed = []
  kernels = sorted(device_kernels(_trace_events(trace_dir)),
                   key=lambda e: (str(e.get("pid")), str(e.get("tid")), float(e.get("ts", 0.0))))
  for event in kernels:
    args = event.get("args", {})
    if module and args.get("hlo_module") not in (None, module.group(1)):
      continue
    stream = (event.get("pid"), event.get("tid"))
    op = args.get("hlo_op") or args.get("name")
    phase = phases.get(op) if op else None
    if phase is None:
      named = by_kernel_name.get(_kernel_name(str(event.get("name", ""))), set())
      phase = next(iter(named)) if len(named) == 1 else None
    if phase is None:
      scoped = [phase_of(str(v)) for v in args.values() if isinstance(v, str)]
      phase = next((p for p in scoped if p != "other"), None)
    if phase is None:
      phase = previous.get(stream, "unattributed")
    else:
      previous[stream] = phase
    attributed.append((event, phase))
  return attributed


def is_copy(event: dict) -> bool:
  """Whether a GPU event is a copy or a set rather than a kernel: the duration recorded
  for one can run from its enqueueing, across time the GPU was idle (docs/e2e.md)."""
  return str(event.get("name", "")).startswith(("Memcpy", "Memset"))


def busy_seconds(events: list[dict]) -> float:
  """The time the GPU was busy with ``events``: the length of the union of their
  intervals (kernels a CUDA graph runs side by side count once)."""
  busy, end = 0.0, float("-inf")
  for start, stop in sorted((float(e.get("ts", 0.0)), float(e.get("ts", 0.0))
                             + float(e.get("dur", 0.0))) for e in events):
    if stop > end:
      busy += stop - max(start, end)
      end = stop
  return busy * 1e-6


def loop_idle_seconds(kernels: list[tuple[dict, str]]) -> float:
  """The GPU's idle time inside a ``generate`` call's loop, over a profile's kernels
  (``attributed_kernels``): from the end of the prefill's last kernel before the loop's
  first (verify, drafter or walk) kernel to the last kernel, the time no kernel ran — the
  host's condition reads and the launches it waits on. The kernels that set the call up
  before its prefill are not the loop's (counted from them, the prefill itself read as
  idle); a kernel attributed to the prefill that runs after the loop's first kernel (a
  fusion takes its root operation's name, which can be a prefill one) is the loop's:
  taken for the prefill's end, it would make the loop read as no time."""
  kernels = [(event, phase) for event, phase in kernels if not is_copy(event)]
  loop_phases = [phase for phase in PHASES if phase != "prefill"]
  first = min((_start(e) for e, phase in kernels if phase in loop_phases), default=None)
  if first is None:
    return 0.0
  # (no later than the loop's first kernel: a prefill kernel may end beside it)
  start = min(first, max((_start(e) + float(e.get("dur", 0.0)) for e, phase in kernels
                          if phase == "prefill" and _start(e) < first), default=first))
  events = [event for event, _ in kernels if _start(event) >= start]
  stop = max(_start(e) + float(e.get("dur", 0.0)) for e in events)
  return max((stop - start) * 1e-6 - busy_seconds(events), 0.0)


def _start(event: dict) -> float:
  return float(event.get("ts", 0.0))


def device_time(trace_dir: Path) -> tuple[dict[str, tuple[int, float]], float]:
  """(``{kernel name: (launches, device seconds)}`` over every GPU kernel of a profile
  whatever its phase, ``busy_seconds`` of them all); copies and sets (``is_copy``) left
  out."""
  events = [e for e in device_kernels(_trace_events(trace_dir)) if not is_copy(e)]
  totals: dict[str, tuple[int, float]] = {}
  for event in events:
    name = str(event.get("name", ""))
    launches, seconds = totals.get(name, (0, 0.0))
    totals[name] = (launches + 1, seconds + float(event.get("dur", 0.0)) * 1e-6)
  return totals, busy_seconds(events)


def kernel_seconds(kernels: list[tuple[dict, str]], phases: tuple[str, ...],
                   top: int = 10) -> list[tuple[str, int, float]]:
  """The ``top`` GPU kernels of ``phases`` by total device time, over a profile's
  kernels (``attributed_kernels``): (name, launches, seconds)."""
  seconds: dict[str, float] = {}
  launches: dict[str, int] = {}
  for event, phase in kernels:
    if phase in phases:
      name = str(event.get("name", ""))
      seconds[name] = seconds.get(name, 0.0) + float(event.get("dur", 0.0)) * 1e-6
      launches[name] = launches.get(name, 0) + 1
  ranked = sorted(seconds, key=seconds.get, reverse=True)[:top]
  return [(name, launches[name], seconds[name]) for name in ranked]
