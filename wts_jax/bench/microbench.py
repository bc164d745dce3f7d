"""The floor model's ceilings, each from a kernel that does nothing else (GPU only).

- ``stream_gbps``: a Pallas kernel whose programs read their slice of a buffer with wide
  loads and keep a running sum — from HBM (a buffer far larger than the L2, read once)
  or from the L2 (a buffer that fits, read ``passes`` times in one launch; the first
  pass's cost is taken out by timing 1 pass and ``passes + 1`` passes).
- ``barrier_us``: the cheapest grid-wide barrier we have, the Triton kernel's
  (``grid_sync.arrive_and_wait``: one acquire-release atomic add per program, then
  polling) on a persistent grid of one program per SM, ``rounds`` times in one launch
  with no other work; per barrier = (time of 1 + R rounds − time of 1 round) / R.

Used by the harness's ceilings (``floor.measure_ceilings`` takes the best of these and
its XLA reductions and our kernel's exchange) and by ``tools/floor_microbench.py``.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

STREAM_BLOCK = 4096   # f32 elements per load (16 KB)


def median_time(fn, *args, repeats: int = 5) -> float:
  """Median wall time of ``fn(*args)`` after one warm-up (seconds)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def _stream_kernel(x_ref, o_ref, *, chunks: int, passes: int):
  from jax.experimental import pallas as pl
  program = pl.program_id(0)

  def one_pass(p, acc):
    def one_chunk(i, acc):
      # Rotated by the pass so no load is loop-invariant across passes.
      chunk = program * chunks + lax.rem(i + p, chunks)
      return acc + x_ref[pl.ds(chunk * STREAM_BLOCK, STREAM_BLOCK)]
    return lax.fori_loop(0, chunks, one_chunk, acc)

  o_ref[pl.ds(program * STREAM_BLOCK, STREAM_BLOCK)] = lax.fori_loop(
      0, passes, one_pass, jnp.zeros((STREAM_BLOCK,), jnp.float32))


@functools.partial(jax.jit, static_argnames=("programs", "passes", "interpret"))
def stream(x, *, programs: int, passes: int = 1, interpret: bool = False):
  """Each of ``programs`` programs reads its ``len(x) / programs`` elements ``passes``
  times; returns the per-program sums (so nothing is dead code)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as pl_triton
  chunks = x.shape[0] // (programs * STREAM_BLOCK)
  if chunks < 1 or x.shape[0] % (programs * STREAM_BLOCK):
    raise ValueError(f"len(x)={x.shape[0]} must be a multiple of programs x "
                     f"{STREAM_BLOCK} = {programs * STREAM_BLOCK}")
  return pl.pallas_call(
      functools.partial(_stream_kernel, chunks=chunks, passes=passes),
      out_shape=jax.ShapeDtypeStruct((programs * STREAM_BLOCK,), jnp.float32),
      grid=(programs,), interpret=interpret, name="wts_stream_read",
      compiler_params=pl_triton.CompilerParams(num_warps=8, num_stages=1))(x)


def stream_gbps(nbytes: int, *, programs: int, passes: int = 1) -> float:
  """Read bandwidth (GB/s) over an ``nbytes`` buffer; ``passes > 1``: the rate of the
  repeated passes (the buffer's first read taken out)."""
  unit = programs * STREAM_BLOCK
  n = max(1, nbytes // 4 // unit) * unit
  x = jnp.ones((n,), jnp.float32)
  one = median_time(functools.partial(stream, programs=programs, passes=1), x)
  if passes == 1:
    return 4 * n / one / 1e9
  more = median_time(functools.partial(stream, programs=programs, passes=passes + 1), x)
  return 4 * n * passes / (more - one) / 1e9


def _barrier_kernel(counters_in, counters_ref, timed_out_ref, *, rounds: int,
                    programs: int, spin_limit: int):
  from jax.experimental import pallas as pl
  from wts_jax.pallas import grid_sync
  del counters_in   # aliased to counters_ref (zero at launch)
  program = pl.program_id(0)
  zero = program * 0

  def one_round(k, timed_out):
    return timed_out | grid_sync.arrive_and_wait(counters_ref, k, num_programs=programs,
                                                 spin_limit=spin_limit, zero=zero)

  timed_out = lax.fori_loop(0, rounds, one_round, program < 0)
  timed_out_ref[pl.ds(program, 1)] = timed_out.astype(jnp.int32)[None]


@functools.partial(jax.jit, static_argnames=("programs", "rounds", "spin_limit",
                                             "interpret"))
def barriers(*, programs: int, rounds: int, spin_limit: int = 1 << 22,
             interpret: bool = False):
  """``rounds`` grid barriers of ``programs`` programs in one launch; returns the
  per-program timed-out flags (all 0 when every barrier completed)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as pl_triton
  counters = jnp.zeros((rounds,), jnp.int32)
  _, timed_out = pl.pallas_call(
      functools.partial(_barrier_kernel, rounds=rounds, programs=programs,
                        spin_limit=spin_limit),
      out_shape=(jax.ShapeDtypeStruct((rounds,), jnp.int32),
                 jax.ShapeDtypeStruct((programs,), jnp.int32)),
      grid=(programs,), input_output_aliases={0: 0}, interpret=interpret,
      name="wts_barrier_rounds",
      compiler_params=pl_triton.CompilerParams(num_warps=4, num_stages=1))(counters)
  return timed_out


def barrier_us(*, programs: int, rounds: int = 256) -> float:
  """µs per grid-wide barrier of ``programs`` co-resident programs."""
  flags = barriers(programs=programs, rounds=rounds + 1)
  if int(jnp.max(flags)):
    raise RuntimeError(f"a barrier of {programs} programs timed out: not co-resident?")
  one = median_time(functools.partial(barriers, programs=programs, rounds=1))
  more = median_time(functools.partial(barriers, programs=programs, rounds=rounds + 1))
  return (more - one) / rounds * 1e6
