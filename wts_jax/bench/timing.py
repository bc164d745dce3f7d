"""Per-walk device time of a path, with L2 flushed (cold) or not (warm) between walks.

``METHOD`` below is the method as the README and every results JSON state it.

The timed executables are compiled ahead by a ``ChainCompiler`` (lowering in the calling
thread, XLA compilation in a thread pool), then timed one at a time by ``time_chain``
with nothing else running: compiling never overlaps a timing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import glob
import gzip
import json
import os
import tempfile
import threading
import time
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.bench.flush import (FLUSH_IMPLS, FLUSH_KERNEL_NAME, default_flush_impl,
                                 flush_elems_for, flush_step, is_cold)

DEFAULT_WALKS = 10          # N: walks chained in one timed executable
DEFAULT_REPEATS = 10        # R: timed repetitions; the figure is their median
MIN_WALKS_PER_FIGURE = 100  # the harness warns below N * R = this

METHOD = """\
Timing method (wts_jax.bench.timing).

What is measured: the device time of one walk (K steps, one batch), as the median over
R repetitions, each repetition timing N walks back to back (defaults N = 10, R = 10, so
N*R = 100 walks per figure after warm-up; the harness warns below 100); min and p90 over
the repetitions beside it.

JAX paths (xla, pallas-stepwise, wts): one jitted executable runs the N walks, unrolled
in Python. Before walk i a flush step runs, `bump` (which depends on walk i-1's tokens)
is added to a flush buffer, and walk i takes its first tokens through
`where(flush[0] < 0, last_tokens_{i-1}, first_tokens)` (never true, but the compiler
cannot know it), last_tokens the last column of walk i-1's whole [B, K] tokens, sliced
inside that select (the flush-only chain has the select too, so no op is the walk's
alone; `build_chain`'s `carry_form="last_column"` keeps the earlier chain, whose slice
after each walk was charged to the walk); its operands (weights, base logits, hidden states) pass through
`lax.optimization_barrier` together with those tokens, and every walk's outputs are
outputs of the executable: nothing can be reordered, CSE'd across walks, hoisted out of
the chain or dead-code eliminated, and the flush step sits strictly between two walks
(on the GPU, XLA drops the barriers only after scheduling; a test checks that the
compiled chain of N walks holds N times the loops and library calls of one walk).

Cold and warm L2 are the same executable: how much of the flush buffer the flush step
adds `bump` to is an argument of the executable. Cold: all of an int32 buffer of 256 MB
(> 4x the H200's 60 MB L2), read and written. Warm: its first 128 elements only (the
dependency through flush[0] is kept; nothing else is touched). On the GPU the flush step
is a small Pallas kernel whose programs skip the blocks past that size (flush_impl
"kernel"; a probe at the start of a run checks that it adds to every element when cold
and to the first ones when warm, else the run falls back to "static"). flush_impl
"static" (the CPU's default) is the earlier form: two executables, the cold chain
adding `bump` to the whole buffer with an XLA op and the warm chain with no flush step
at all (its next walk takes its first tokens through `where(last_tokens < 0, ...)`);
"cond" is a `lax.cond` on the size. The results JSON names the flush_impl used.

A second executable, the identical chain minus the walks (flush and dependency ops
only, with the same flush size), runs interleaved with the first; both are compiled
ahead and called on flat argument lists, so their dispatch costs the same. The per-walk
time of repetition r is (T_r - median(T_flush_only)) / N: the flush and the dependency
ops cancel out. Before the R repetitions the executable has run at least twice (the
correctness check below, then one warm-up run of each of the two executables). T is,
by `--timing` (the results JSON's `timing.method` and each record's `timing_method`):
- "device" (the GPU's default): the device time of the executable's run from a CUPTI
  trace (`jax.profiler.trace`) of the 2R runs: from the start of its first flush step
  (the flush kernel, by name) to its last GPU op's end — the walks' steady state, as
  CUDA events around the N walks on a stream the host keeps fed would read it (the
  torch paths' clock). What the trace shows before the first flush step is the
  executable's start: its argument copies and a few tiny ops, with the device idle
  between them while the host prepares the run (tools/walk_timeline.py shows it). That
  idle differs between a chain and its flush-only chain by a roughly fixed amount per
  run, not per walk, so from the first op it would be added to every walk as (that
  difference) / N (docs/decisions.md, "Walk timing from the first flush step"). `span_from_first_op_us` beside it keeps that
  older reading; with the "static" flush (no flush kernel to find) both start at the
  first op. The runs are told apart by a 5 ms host pause after each (the device is idle
  between them); the trace must hold exactly 2R runs, else the figure is an error.
  Beside it: `device_busy_us`, the same difference of the length of the union of each
  run's op intervals from the same start (the span less the time the device waited for
  the host to launch an op), and `host_wall_us`, of the host wall clock around each run
  (under the trace, which adds a little host work a launch).
- "host" (the CPU's default): the host wall clock around `jax.block_until_ready` (one
  dispatch per N walks), which also counts any time the device waits for the host.

Torch paths (torch-eager, torch-graph): CUDA events recorded around N walks (N eager
loop calls, or N CUDA-graph replays) on the current stream, with the same 256 MB
`flush.add_(1)` before each walk for cold L2; a flush-only loop is timed the same way
and subtracted in the same way (3 warm-up repetitions). Eager time includes the host's
launch gaps, since the eager loop is launch-bound as DeepSpec runs it; with cold L2 part
of those launches overlap the preceding flush (as they would overlap the target model
in serving), so torch-eager's cold figure can be below its warm one.

Sanity lines: "empty" walks (a 1-element Pallas kernel on the GPU and a 1-element XLA
op; for torch a 1-element `add_`) timed with exactly this method give the method's own
per-walk overhead and resolution (their H200 readings: docs/decisions.md, "Walk timing
from the first flush step"): differences of a few microseconds between paths are below
the method's resolution; with N = 10 each repetition's share of the host jitter
doubles, which the sanity lines of the same run show.

Correctness before timing: the XLA reference walk runs once per point and mode, and
every path's tokens are checked against it on the same inputs before that path is
timed; for a JAX path the check reads the tokens (and the status) of all N walks of the
first run of the very executable that is then timed, for each L2 state. A path that
disagrees is recorded as a mismatch and not timed. Each path's time is also reported as
a multiple of the floor model (wts_jax.bench.floor), whose ceilings (HBM and L2
bandwidth) are measured in the same run.

Compilation ahead: all executables of one point (every JAX path and mode, the reference
walks, the flush-only chains) are lowered in the main thread and compiled in a pool of
threads before that point's first timing; nothing compiles while anything is timed.
"""



@dataclasses.dataclass(frozen=True)
class Timing:
  """Per-walk times in microseconds over the repetitions."""

  median_us: float
  min_us: float
  p90_us: float
  flush_us: float        # median per-walk cost of the subtracted flush-only chain
  n_walks: int
  repeats: int
  samples_us: tuple[float, ...]
  method: str = "host"   # "host", "device" (JAX chains) or "cuda events" (torch)
  extra: tuple[tuple[str, float], ...] = ()   # per-walk medians by other clocks

  def as_record(self) -> dict:
    return {"median_us": self.median_us, "min_us": self.min_us, "p90_us": self.p90_us,
            "flush_only_us": self.flush_us, "n_walks": self.n_walks,
            "repeats": self.repeats, "samples_us": list(self.samples_us),
            "timing_method": self.method, **dict(self.extra)}


def summarize(total_s, flush_only_s, n_walks: int) -> Timing:
  """Per-walk times from R chain times and R flush-only chain times (seconds)."""
  total = np.asarray(total_s, np.float64)
  flush_median = float(np.median(np.asarray(flush_only_s, np.float64)))
  per_walk_us = (total - flush_median) / n_walks * 1e6
  return Timing(median_us=float(np.median(per_walk_us)),
                min_us=float(np.min(per_walk_us)),
                p90_us=float(np.percentile(per_walk_us, 90)),
                flush_us=flush_median / n_walks * 1e6, n_walks=n_walks,
                repeats=len(per_walk_us),
                samples_us=tuple(float(t) for t in per_walk_us))


# --- the chain of N walks ----------------------------------------------------------------

def tokens_of(outputs) -> jax.Array:
  """The [B, K] tokens of a walk's outputs (a WalkOutput, a dict or a tuple)."""
  if hasattr(outputs, "tokens"):
    return outputs.tokens
  if isinstance(outputs, dict):
    return outputs["tokens"]
  if isinstance(outputs, (tuple, list)):
    return outputs[0]
  return outputs


CHAIN_CARRIES = ("tokens", "last_column")


def build_chain(walk_fn: Callable | None, n_walks: int, cold: bool | None = None,
                traced_tokens: Callable = tokens_of, *,
                flush_impl: str | None = None, carry_form: str = "tokens") -> Callable:
  """The chain of ``n_walks`` walks, each after a flush step.

  ``walk_fn(operands, first_tokens)`` is one walk, traceable; ``None`` builds the
  flush-only chain (everything but the walks), which is subtracted. With a runtime flush
  (``flush_impl`` "kernel" or "cond"; the default when ``cold`` is not given) it is
  ``chain(operands, first_tokens, flush, flush_elems) -> (all walks' outputs, tokens,
  flush)``, cold or warm by ``flush_elems`` (``flush_elems_for``). With ``flush_impl``
  "static" (the default when ``cold`` is given) ``cold`` is fixed at trace time and the
  chain takes no ``flush_elems``.

  ``carry_form`` is how a walk's tokens reach the next flush and walk: "tokens" carries
  the whole [B, K] array and the next walk's first tokens are its last column, sliced
  inside the select that the flush-only chain has too; "last_column" slices the column
  right after the walk, an op of its own that only the walk chain has (so charged to the
  walk, which a torch path timed by CUDA events never pays).
  """
  if carry_form not in CHAIN_CARRIES:
    raise ValueError(f"carry_form={carry_form!r} must be one of {CHAIN_CARRIES}")
  if flush_impl is None:
    flush_impl = "static" if cold is not None else default_flush_impl()
  if flush_impl == "static" and cold is None:
    raise ValueError("flush_impl='static' needs cold=True or False")
  barrier = jax.lax.optimization_barrier

  def walks(operands, first_tokens, flush, flush_step):
    carry = first_tokens
    outputs = []
    for _ in range(n_walks):
      if flush_step is not None:
        # The flush depends on the previous walk, and the next walk on the flush.
        bump = jnp.where(jnp.any(last_column(carry) < 0), 2, 1).astype(flush.dtype)
        flush, carry = barrier((flush_step(flush, bump), carry))
        tokens_in = jnp.where(flush[0] < 0, last_column(carry), first_tokens)
      else:
        tokens_in = jnp.where(last_column(carry) < 0, last_column(carry), first_tokens)
      # Each walk sees its own (aliased) operands: no CSE or hoisting across walks.
      walk_operands, tokens_in = barrier((operands, tokens_in))
      if walk_fn is None:
        carry = barrier(tokens_in)
        continue
      out = barrier(walk_fn(walk_operands, tokens_in))
      outputs.append(out)
      carry = traced_tokens(out).astype(first_tokens.dtype)
      if carry_form == "last_column":
        carry = carry[:, -1]
    return outputs, carry, flush

  def last_column(carry):
    return carry if carry.ndim == 1 else carry[:, -1]

  if flush_impl == "static":
    def static_chain(operands, first_tokens, flush):
      return walks(operands, first_tokens, flush,
                   (lambda f, bump: f + bump) if cold else None)
    return static_chain

  step = flush_step(flush_impl)

  def chain(operands, first_tokens, flush, flush_elems):
    return walks(operands, first_tokens, flush,
                 lambda f, bump: step(f, bump, flush_elems))
  return chain


@dataclasses.dataclass
class CompiledChain:
  """A chain compiled over its operands' flat leaves, ready to run cold and/or warm."""

  executable: Any
  leaves: list
  n_walks: int
  flush_impl: str
  cold: bool | None = None        # "static" chains only: the L2 state they were built for

  def args(self, first_tokens, flush, l2: str) -> tuple:
    if self.flush_impl == "static":
      if is_cold(l2) != self.cold:
        raise ValueError(f"this static chain was built for cold={self.cold}, not l2={l2}")
      return (self.leaves, first_tokens, flush)
    return (self.leaves, first_tokens, flush, flush_elems_for(flush, l2))

  def __call__(self, first_tokens, flush, l2: str):
    return self.executable(*self.args(first_tokens, flush, l2))


def lower_chain(walk_fn: Callable | None, operands, first_tokens: jax.Array,
                flush: jax.Array, *, n_walks: int, flush_impl: str, cold: bool | None = None,
                traced_tokens: Callable = tokens_of, carry_form: str = "tokens"):
  """(lowered, finish): the chain lowered over the operands' flat leaves (the leanest
  dispatch, alike for the walk and the flush-only chains); ``finish(compiled)`` gives
  the ``CompiledChain``. Lowering traces in this thread; compile anywhere."""
  leaves, treedef = jax.tree_util.tree_flatten(operands)
  chain = build_chain(walk_fn, n_walks, cold if flush_impl == "static" else None,
                      traced_tokens, flush_impl=flush_impl, carry_form=carry_form)

  def flat_chain(leaves, *rest):
    return chain(jax.tree_util.tree_unflatten(treedef, leaves), *rest)

  extra = () if flush_impl == "static" else (flush_elems_for(flush, "warm"),)
  lowered = jax.jit(flat_chain).lower(leaves, first_tokens, flush, *extra)
  return lowered, lambda compiled: CompiledChain(compiled, leaves, n_walks, flush_impl,
                                                 cold if flush_impl == "static" else None)


def _done(value=None, error: BaseException | None = None) -> concurrent.futures.Future:
  future: concurrent.futures.Future = concurrent.futures.Future()
  if error is not None:
    future.set_exception(error)
  else:
    future.set_result(value)
  return future


class ChainCompiler:
  """Compiles ahead: ``lower`` runs in the calling thread (tracing holds the GIL), XLA
  compilation in a pool of ``jobs`` threads (it releases the GIL). Every method returns
  futures; a failure to lower or compile is the future's exception. Flush-only chains
  are cached by (batch shape, N, flush buffer, flush_impl, L2 state). Every executable
  is compiled with ``compiler_options`` (XLA options; ``wts-bench --command-buffers``)."""

  def __init__(self, jobs: int = 1, flush_impl: str | None = None,
               compiler_options: dict | None = None):
    self.jobs = max(1, int(jobs))
    self.compiler_options = dict(compiler_options or {})
    self.flush_impl = flush_impl or default_flush_impl()
    if self.flush_impl not in FLUSH_IMPLS:
      raise ValueError(f"flush_impl={self.flush_impl!r} must be one of {FLUSH_IMPLS}")
    self._pool = (concurrent.futures.ThreadPoolExecutor(self.jobs, "wts-bench-compile")
                  if self.jobs > 1 else None)
    self._flush_only: dict[tuple, concurrent.futures.Future] = {}
    self._lock = threading.Lock()
    self.submitted = 0

  def submit(self, lower: Callable[[], tuple[Any, Callable[[Any], Any]]]
             ) -> concurrent.futures.Future:
    """``lower() -> (lowered, finish)`` now, here; ``finish(lowered.compile())`` in the
    pool."""
    self.submitted += 1
    try:
      lowered, finish = lower()
    except Exception as err:  # noqa: BLE001 - reported where the result is used
      return _done(error=err)

    def compile_it():
      if self.compiler_options:
        return finish(lowered.compile(compiler_options=dict(self.compiler_options)))
      return finish(lowered.compile())

    if self._pool is None:
      try:
        return _done(compile_it())
      except Exception as err:  # noqa: BLE001
        return _done(error=err)
    return self._pool.submit(compile_it)

  def _l2_states(self, l2s) -> list[bool | None]:
    return [None] if self.flush_impl != "static" else sorted({is_cold(l2) for l2 in l2s})

  def _chains(self, walk_fn, operands, first_tokens, flush, n_walks, l2s, traced_tokens,
              carry_form="tokens"):
    by_state = {
        cold: self.submit(functools.partial(
            lower_chain, walk_fn, operands, first_tokens, flush, n_walks=n_walks,
            flush_impl=self.flush_impl, cold=cold, traced_tokens=traced_tokens,
            carry_form=carry_form))
        for cold in self._l2_states(l2s)}
    return {l2: by_state[None if self.flush_impl != "static" else is_cold(l2)]
            for l2 in l2s}

  def chains(self, walk_fn: Callable, operands, first_tokens: jax.Array, flush: jax.Array,
             *, n_walks: int, l2s, traced_tokens: Callable = tokens_of,
             carry_form: str = "tokens") -> dict[str, concurrent.futures.Future]:
    """{l2: future CompiledChain} of one walk; one executable for all L2 states unless
    flush_impl is "static". ``carry_form``: ``build_chain``'s."""
    return self._chains(walk_fn, operands, first_tokens, flush, n_walks, l2s,
                        traced_tokens, carry_form)

  def flush_only(self, first_tokens: jax.Array, flush: jax.Array, *, n_walks: int, l2s
                 ) -> dict[str, concurrent.futures.Future]:
    """{l2: future CompiledChain} of the flush-only chain (cached)."""
    result = {}
    for l2 in l2s:
      cold = None if self.flush_impl != "static" else is_cold(l2)
      key = (tuple(first_tokens.shape), str(first_tokens.dtype), tuple(flush.shape),
             str(getattr(flush, "sharding", "")), n_walks, self.flush_impl, cold)
      with self._lock:
        if key not in self._flush_only:
          self._flush_only[key] = self._chains(None, (), first_tokens, flush, n_walks,
                                               [l2], tokens_of)[l2]
        result[l2] = self._flush_only[key]
    return result

  def close(self, cancel: bool = False) -> None:
    if self._pool is not None:
      self._pool.shutdown(wait=not cancel, cancel_futures=cancel)


def _wall(fn, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


TIMING_METHODS = ("device", "host")
RUN_PAUSE_S = 0.005   # host pause after each traced run: the device idles between runs


def default_timing_method() -> str:
  return "device" if jax.default_backend() == "gpu" else "host"


def time_chain(chain: CompiledChain, flush_only: CompiledChain, first_tokens: jax.Array,
               flush: jax.Array, *, l2: str, repeats: int, warmup: int = 2,
               method: str = "host") -> Timing:
  """Time a compiled chain against its flush-only chain, interleaved (see METHOD)."""
  if method not in TIMING_METHODS:
    raise ValueError(f"timing method {method!r} must be one of {TIMING_METHODS}")
  walks_args = chain.args(first_tokens, flush, l2)
  base_args = flush_only.args(first_tokens, flush, l2)
  for _ in range(warmup):
    _wall(chain.executable, *walks_args)
    _wall(flush_only.executable, *base_args)
  if method == "host":
    total, base = [], []
    for _ in range(repeats):
      total.append(_wall(chain.executable, *walks_args))
      base.append(_wall(flush_only.executable, *base_args))
    return summarize(total, base, chain.n_walks)
  walls = []
  with tempfile.TemporaryDirectory(prefix="wts_bench_trace_") as trace_dir:
    with jax.profiler.trace(trace_dir):
      for _ in range(repeats):
        for executable, args in ((chain.executable, walks_args),
                                 (flush_only.executable, base_args)):
          walls.append(_wall(executable, *args))
          time.sleep(RUN_PAUSE_S)
    runs = split_runs(gpu_ops(trace_dir), gap_us=RUN_PAUSE_S * 1e6 / 2)
  return device_timing(runs, walls, chain.n_walks)


# --- device time from a CUPTI trace ------------------------------------------------------

def gpu_events(trace_dir: str) -> list[dict]:
  """Every GPU op's event (name, ``ts`` and ``dur`` in µs) of the trace
  ``jax.profiler.trace`` wrote under ``trace_dir``, by start."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not paths:
    raise RuntimeError(f"no trace written under {trace_dir}")
  with gzip.open(sorted(paths)[-1], "rt") as f:
    events = json.load(f)["traceEvents"]
  gpu = {e["pid"] for e in events
         if e.get("ph") == "M" and e.get("name") == "process_name"
         and "/device:GPU" in str(e.get("args", {}).get("name", ""))}
  return sorted((e for e in events if e.get("ph") == "X" and e.get("pid") in gpu),
                key=lambda e: e["ts"])


def gpu_ops(trace_dir: str) -> list[tuple[float, float, str]]:
  """(start, duration in µs, name) of every GPU op of the trace under ``trace_dir``, by
  start."""
  return [(float(e["ts"]), float(e["dur"]), str(e.get("name", "")))
          for e in gpu_events(trace_dir)]


def split_runs(ops: list[tuple], gap_us: float) -> list[list[tuple]]:
  """The ops ((start, duration, ...) each) cut into runs wherever the device was idle
  longer than ``gap_us``."""
  runs, end = [], None
  for op in ops:
    start, duration = op[:2]
    if end is None or start - end > gap_us:
      runs.append([])
      end = start
    runs[-1].append(op)
    end = max(end, start + duration)
  return runs


def busy_us(run: list[tuple]) -> float:
  """The length of the union of the run's op intervals (overlapping ops count once)."""
  total, reach = 0.0, None
  for start, duration, *_ in sorted(run):
    end = start + duration
    if reach is None or start >= reach:
      total += duration
      reach = end
    elif end > reach:
      total += end - reach
      reach = end
  return total


def steady_part(run: list[tuple]) -> list[tuple]:
  """The run from its first flush step on (the ops that start at or after it), or all
  of it when no op is the flush kernel (the "static" flush, or ops without names)."""
  starts = [op[0] for op in run if len(op) > 2 and FLUSH_KERNEL_NAME in op[2]]
  if not starts:
    return run
  return [op for op in run if op[0] >= min(starts)]


def device_timing(runs, walls_s, n_walks: int) -> Timing:
  """Per-walk device time from the traced runs, alternately the chain's and the
  flush-only chain's (``walls_s``: the host wall clock around each, seconds)."""
  if not runs or len(runs) != len(walls_s):
    raise RuntimeError(f"the device trace holds {len(runs)} runs where {len(walls_s)} were "
                       "timed (the runs could not be told apart)")
  def span_s(run):
    return (max(op[0] + op[1] for op in run) - min(op[0] for op in run)) * 1e-6
  steady = [steady_part(run) for run in runs]
  span = [span_s(run) for run in steady]
  whole = [span_s(run) for run in runs]
  busy = [busy_us(run) * 1e-6 for run in steady]
  timing = summarize(span[0::2], span[1::2], n_walks)
  extra = {"device_busy_us": summarize(busy[0::2], busy[1::2], n_walks).median_us,
           "span_from_first_op_us": summarize(whole[0::2], whole[1::2], n_walks).median_us,
           "host_wall_us": summarize(walls_s[0::2], walls_s[1::2], n_walks).median_us}
  return dataclasses.replace(timing, method="device", extra=tuple(extra.items()))


# --- the sanity lines: empty walks -------------------------------------------------------

def _empty_pallas_walk():
  """A walk that launches one 1-element Pallas kernel (GPU), or None if Pallas fails."""
  from jax.experimental import pallas as pl

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

  def walk(operands, first_tokens):
    del operands
    x = first_tokens[:1]
    with warnings.catch_warnings():
      # "The Pallas Triton backend is deprecated": irrelevant to a 1-element probe.
      warnings.simplefilter("ignore", DeprecationWarning)
      out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                           name="wts_bench_empty")(x)
    return {"tokens": jnp.broadcast_to(out[:, None], (first_tokens.shape[0], 1))}

  return walk


def _launch_shape_walk(global_scratch: bool, dependent_launch: bool = False, *,
                       smem_bytes: int | None = None, warpgroups: int | None = None,
                       blocks: int | None = None, reduce: bool = True):
  """A walk that launches an empty Mosaic GPU kernel of the persistent walks' launch
  shape — one block an SM, four warpgroups, the device's shared memory less Mosaic's
  reserve — each warpgroup writing its status word, reduced after it as the batched
  walks' are (GPU). Beside the 1-element kernel's line it says what the walks' launch
  costs in the chain, their work apart. ``global_scratch``: the kernel signals a
  ``pl.get_global`` semaphore once, as the walks' exchange does (Pallas zeroes that
  scratch before every launch; no op of its own shows in a trace).
  ``dependent_launch``: it waits with ``griddepcontrol.wait`` first, which asks XLA for
  a programmatic dependent launch (jax >= 0.11). The rest vary the shape
  (``tools/walk_timeline.py``): shared memory a block (bytes, at most the default),
  warpgroups, blocks, and the status reduced after the kernel or one word read."""
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from wts_jax import device
  from wts_jax.pallas.mosaic_plan import SMEM_ALIGNMENT, SMEM_RESERVED_BYTES
  from wts_jax.pallas.stacked.plan import WARPGROUPS
  facts = device.current()
  warpgroups, blocks = warpgroups or WARPGROUPS, blocks or facts.num_sms
  most = (facts.smem_per_block - SMEM_RESERVED_BYTES) // SMEM_ALIGNMENT * SMEM_ALIGNMENT
  smem = most if smem_bytes is None else min(
      most, max(SMEM_ALIGNMENT, smem_bytes // SMEM_ALIGNMENT * SMEM_ALIGNMENT))

  def body(x_g, flags_g, _smem):
    del x_g   # (an operand only: the launch is ordered after the tokens it takes)
    if dependent_launch:
      plgpu.griddepcontrol_wait()
    block, wg = lax.axis_index("blocks"), lax.axis_index("wg")
    if global_scratch:
      sem = pl.get_global(plgpu.SemaphoreType.REGULAR(()))
      pl.when(wg == 0)(lambda: plgpu.semaphore_signal(sem, 1, memory_scope="gpu"))
    flags_g[block * warpgroups + wg] = jnp.int32(0)

  kernel = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((blocks * warpgroups,), jnp.int32),
      grid=(blocks,), grid_names=("blocks",), num_threads=warpgroups,
      thread_name="wg", scratch_types=[plgpu.SMEM((smem,), jnp.int8)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane))

  def walk(operands, first_tokens):
    del operands
    flags = kernel(first_tokens)
    status = (lax.reduce(flags, jnp.int32(0), lax.bitwise_or, (0,)) if reduce
              else flags[0])
    return {"tokens": jnp.broadcast_to(status, (first_tokens.shape[0], 1))}

  return walk


def _empty_xla_walk(operands, first_tokens):
  del operands
  return {"tokens": (first_tokens + 1)[:, None]}


def empty_walks() -> list[tuple[str, Callable[[], Callable]]]:
  """[(kind, make walk)] of the sanity lines: a 1-element Pallas kernel and an empty
  kernel of the persistent walks' launch shape — as theirs, without the global scratch
  and as a dependent launch — (GPU only), and a 1-element XLA op, each a walk of the
  same structure as the timed ones."""
  candidates = []
  if jax.default_backend() == "gpu":
    candidates.append(("pallas 1-element kernel", _empty_pallas_walk))
    candidates.append(("empty mosaic kernel of the walks' launch shape",
                       functools.partial(_launch_shape_walk, True)))
    candidates.append(("the same without its global scratch",
                       functools.partial(_launch_shape_walk, False)))
    candidates.append(("the same as a programmatic dependent launch",
                       functools.partial(_launch_shape_walk, True, True)))
  candidates.append(("xla 1-element op", lambda: _empty_xla_walk))
  return candidates
