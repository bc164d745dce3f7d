"""Per-walk device time of a path, with L2 flushed (cold) or not (warm) between walks.

``METHOD`` below is the method as the README and every results JSON state it.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

METHOD = """\
Timing method (wts_jax.bench.timing).

What is measured: the device time of one walk (K steps, one batch), as the median over
R repetitions, each repetition timing N walks back to back (defaults N = 20, R = 15,
so N*R = 300 walks after warm-up); min and p90 over the repetitions beside it.

JAX paths (xla, pallas-stepwise, wts): one jitted executable runs the N walks, unrolled
in Python. Walk i takes its first tokens through `where(last_tokens_{i-1} < 0, ...,
first_tokens)` (never true, but the compiler cannot know it), its operands (weights,
base logits, hidden states) pass through `lax.optimization_barrier` together with those
tokens, and every walk's outputs are outputs of the executable: nothing can be
reordered, CSE'd across walks, hoisted out of the chain or dead-code eliminated (on the
GPU, XLA drops the barriers only after scheduling; a test checks that the compiled
chain of N walks holds N times the loops and library calls of one walk). For cold L2,
a flush runs between walks: `flush = flush + bump` on an int32 buffer of 256 MB (> 4x
the H200's 60 MB L2), where `bump` depends on the previous walk's tokens and the next
walk's first tokens depend on `flush[0]`, both through optimization barriers, so the
flush sits strictly between two walks. The executable is timed by host wall clock
around `jax.block_until_ready` (one dispatch per N walks). A second executable, the
identical chain minus the walks (flush and dependency ops only), is timed the same way,
interleaved with the first; both are compiled ahead and called on flat argument lists,
so their dispatch costs the same. The per-walk time of repetition r is
(T_r - median(T_flush_only)) / N: the flush, the dependency ops and the dispatch
cancel out.

Torch paths (torch-eager, torch-graph): CUDA events recorded around N walks (N eager
loop calls, or N CUDA-graph replays) on the current stream, with the same 256 MB
`flush.add_(1)` before each walk for cold L2; a flush-only loop is timed the same way
and subtracted in the same way. Eager time includes the host's launch gaps, since the
eager loop is launch-bound as DeepSpec runs it; with cold L2 part of those launches
overlap the preceding flush (as they would overlap the target model in serving), so
torch-eager's cold figure can be below its warm one.

Sanity lines: "empty" walks (a 1-element Pallas kernel on the GPU and a 1-element XLA
op; for torch a 1-element `add_`) timed with exactly this method give the method's own
per-walk overhead and resolution. On the H200 (jax 0.11.2, torch 2.11) they read about
5-12 us for JAX (one dependent kernel launch inside an XLA executable, median of 15
repetitions with a spread of about +-8 us), about 2 us for torch with cold L2 and about
10 us warm (host-bound eager launches): differences of a few microseconds between
paths are below the method's resolution.

Before any timing every path's tokens are checked against the XLA reference walk on
the same inputs; a path that disagrees is recorded as a mismatch and not timed. Each
path's time is also reported as a multiple of the floor model (wts_jax.bench.floor),
whose ceilings (HBM and L2 bandwidth) are measured in the same run.
"""

FLUSH_BYTES_GPU = 256 << 20


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

  def as_record(self) -> dict:
    return {"median_us": self.median_us, "min_us": self.min_us, "p90_us": self.p90_us,
            "flush_only_us": self.flush_us, "n_walks": self.n_walks,
            "repeats": self.repeats, "samples_us": list(self.samples_us)}


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


# --- JAX -------------------------------------------------------------------------------

def default_flush_bytes() -> int:
  return FLUSH_BYTES_GPU if jax.default_backend() == "gpu" else 4 << 20


def make_jax_flush_buffer(nbytes: int) -> jax.Array:
  return jnp.zeros((max(1, nbytes // 4),), jnp.int32)


def tokens_of(outputs) -> jax.Array:
  """The [B, K] tokens of a walk's outputs (a WalkOutput, a dict or a tuple)."""
  if hasattr(outputs, "tokens"):
    return outputs.tokens
  if isinstance(outputs, dict):
    return outputs["tokens"]
  if isinstance(outputs, (tuple, list)):
    return outputs[0]
  return outputs


def build_chain(walk_fn: Callable | None, n_walks: int, cold: bool,
                traced_tokens: Callable = tokens_of) -> Callable:
  """``chain(operands, first_tokens, flush) -> (all walks' outputs, tokens, flush)``.

  ``walk_fn(operands, first_tokens)`` is one walk, traceable; ``None`` builds the
  flush-only chain (everything but the walks), which is subtracted.
  """
  barrier = jax.lax.optimization_barrier

  def chain(operands, first_tokens, flush):
    carry = first_tokens
    outputs = []
    for _ in range(n_walks):
      if cold:
        # The flush depends on the previous walk, and the next walk on the flush.
        bump = jnp.where(jnp.any(carry < 0), 2, 1).astype(flush.dtype)
        flush, carry = barrier((flush + bump, carry))
        tokens_in = jnp.where(flush[0] < 0, carry, first_tokens)
      else:
        tokens_in = jnp.where(carry < 0, carry, first_tokens)
      # Each walk sees its own (aliased) operands: no CSE or hoisting across walks.
      walk_operands, tokens_in = barrier((operands, tokens_in))
      if walk_fn is None:
        carry = barrier(tokens_in)
        continue
      out = barrier(walk_fn(walk_operands, tokens_in))
      outputs.append(out)
      carry = traced_tokens(out)[:, -1].astype(first_tokens.dtype)
    return outputs, carry, flush

  return chain


def _wall(fn, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def _compiled(chain: Callable, operands, first_tokens, flush):
  """The chain compiled over the operands' flat leaves: the leanest dispatch (no pytree
  flattening of a module, no jit cache lookup) for both timed executables alike."""
  leaves, treedef = jax.tree_util.tree_flatten(operands)

  def flat_chain(leaves, first_tokens, flush):
    return chain(jax.tree_util.tree_unflatten(treedef, leaves), first_tokens, flush)

  compiled = jax.jit(flat_chain).lower(leaves, first_tokens, flush).compile()
  return compiled, leaves


def time_jax(walk_fn: Callable, operands, first_tokens: jax.Array, *, l2: str,
             n_walks: int, repeats: int, flush: jax.Array | None = None,
             traced_tokens: Callable = tokens_of, warmup: int = 2) -> Timing:
  """Time ``walk_fn(operands, first_tokens)`` by the chained-executable method."""
  cold = _is_cold(l2)
  flush = make_jax_flush_buffer(default_flush_bytes()) if flush is None else flush
  walks, leaves = _compiled(build_chain(walk_fn, n_walks, cold, traced_tokens), operands,
                            first_tokens, flush)
  flush_only, no_leaves = _compiled(build_chain(None, n_walks, cold), (), first_tokens,
                                    flush)
  for _ in range(warmup):
    _wall(walks, leaves, first_tokens, flush)
    _wall(flush_only, no_leaves, first_tokens, flush)
  total, base = [], []
  for _ in range(repeats):
    total.append(_wall(walks, leaves, first_tokens, flush))
    base.append(_wall(flush_only, no_leaves, first_tokens, flush))
  return summarize(total, base, n_walks)


def _empty_pallas_walk():
  """A walk that launches one 1-element Pallas kernel (GPU), or None if Pallas fails."""
  from jax.experimental import pallas as pl

  def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

  def walk(operands, first_tokens):
    del operands
    x = first_tokens[:1]
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         name="wts_bench_empty")(x)
    return {"tokens": jnp.broadcast_to(out[:, None], (first_tokens.shape[0], 1))}

  return walk


def _empty_xla_walk(operands, first_tokens):
  del operands
  return {"tokens": (first_tokens + 1)[:, None]}


def time_jax_empty(batch: int, *, l2: str, n_walks: int, repeats: int,
                   flush: jax.Array | None = None) -> list[tuple[str, Timing | str]]:
  """The sanity lines: [(kind, timing or error text)] of empty walks in the same
  structure: a 1-element Pallas kernel (GPU only) and a 1-element XLA op."""
  first_tokens = jnp.zeros((batch,), jnp.int32)
  candidates = []
  if jax.default_backend() == "gpu":
    candidates.append(("pallas 1-element kernel", _empty_pallas_walk))
  candidates.append(("xla 1-element op", lambda: _empty_xla_walk))
  results = []
  for kind, make in candidates:
    try:
      with warnings.catch_warnings():
        # "The Pallas Triton backend is deprecated": irrelevant to a 1-element probe.
        warnings.simplefilter("ignore", DeprecationWarning)
        walk = make()
        jax.block_until_ready(jax.jit(walk)((), first_tokens))
        results.append((kind, time_jax(walk, (), first_tokens, l2=l2, n_walks=n_walks,
                                       repeats=repeats, flush=flush)))
    except Exception as err:  # noqa: BLE001 - recorded, the run goes on
      results.append((kind, f"{type(err).__name__}: {err}"[:500]))
  return results


# --- torch -----------------------------------------------------------------------------

def make_torch_flush_buffer(nbytes: int, device):
  import torch
  return torch.zeros(max(1, nbytes // 4), dtype=torch.int32, device=device)


def time_torch(run: Callable[[], Any], *, l2: str, n_walks: int, repeats: int,
               flush, warmup: int = 3) -> Timing:
  """Time ``run()`` (one walk, launched on the current stream) by CUDA events.

  On a CPU device torch runs synchronously and the host clock is used instead.
  """
  import torch
  cold = _is_cold(l2)
  cuda = flush.is_cuda

  def loop(with_walk: bool):
    for _ in range(n_walks):
      if cold:
        flush.add_(1)
      if with_walk:
        run()

  def timed(with_walk: bool) -> float:
    if not cuda:
      start = time.perf_counter()
      loop(with_walk)
      return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loop(with_walk)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3

  for _ in range(warmup):
    timed(True)
    timed(False)
  if cuda:
    torch.cuda.synchronize()
  total, base = [], []
  for _ in range(repeats):
    total.append(timed(True))
    base.append(timed(False))
  return summarize(total, base, n_walks)


def time_torch_empty(batch: int, *, l2: str, n_walks: int, repeats: int,
                     flush) -> Timing:
  import torch
  del batch   # one element whatever the batch: this times the method, not a walk
  x = torch.zeros(1, dtype=torch.int32, device=flush.device)
  return time_torch(lambda: x.add_(1), l2=l2, n_walks=n_walks, repeats=repeats,
                    flush=flush)


def _is_cold(l2: str) -> bool:
  if l2 not in ("cold", "warm"):
    raise ValueError(f"l2={l2!r} must be 'cold' or 'warm'")
  return l2 == "cold"
