"""The int8 W2's widening to bf16 (GPU), alone: XLA's convert against Pallas kernels.

  python tools/widen_microbench.py [--out widen_microbench.json] [--rows 151936]

At 33–64 rows the batched walk meets an int8 W2 widened to bf16 before its launch
(``mosaic_batched_backend._launch_batched``). XLA's convert fusion moves 1 byte in and 2 out
an element; this times it beside Pallas Triton kernels of several block shapes (the
shipped one, ``wts_jax.pallas.widen``, among them: ``triton_flat8192_w4``) and an
int8 -> int8 copy of the same array (the bytes read) and a bf16 -> bf16 copy (the bytes
written), each from a CUPTI trace (device time of the op, median of ``--repeats``), and
checks every candidate's bits against XLA's.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.bench.registry import gpu_reason
from wts_jax.pallas import widen


def _triton_widen_rows(rows_per_block: int, num_warps: int, num_stages: int):
  """Each program converts ``rows_per_block`` whole rows (power-of-two rows only)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as pl_triton

  @jax.jit
  def widen_rows(x):
    rows, cols = x.shape
    spec = pl.BlockSpec((rows_per_block, cols), lambda i: (i, 0))
    return pl.pallas_call(
        widen._widen_block, out_shape=jax.ShapeDtypeStruct((rows, cols), jnp.bfloat16),
        grid=(pl.cdiv(rows, rows_per_block),), in_specs=[spec], out_specs=spec,
        name="wts_widen_rows",
        compiler_params=pl_triton.CompilerParams(num_warps=num_warps,
                                                 num_stages=num_stages))(x)
  return widen_rows


def _op_durations(fn, x, repeats: int) -> tuple[list[float], list[str]]:
  """(device µs of each of ``repeats`` calls, its GPU ops summed; the ops' names)."""
  from wts_jax.bench.timing import gpu_ops
  jax.block_until_ready(fn(x))
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      for _ in range(repeats):
        jax.block_until_ready(fn(x))
    ops = gpu_ops(trace_dir)
  names = sorted({name for _, _, name in ops})
  per_call = len(ops) // repeats if repeats else 0
  durations = [sum(d for _, d, _ in ops[i * per_call:(i + 1) * per_call])
               for i in range(repeats)] if per_call else []
  return durations, names


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=None)
  parser.add_argument("--rows", type=int, default=151936)
  parser.add_argument("--cols", type=int, default=256)
  parser.add_argument("--repeats", type=int, default=21)
  args = parser.parse_args(argv)
  reason = gpu_reason()
  if reason is not None:
    print(f"error: {reason}", file=sys.stderr)
    return 2
  x = jax.random.randint(jax.random.key(0), (args.rows, args.cols), -127, 128,
                         jnp.int32).astype(jnp.int8)
  y = x.astype(jnp.bfloat16)
  expected = np.asarray(jax.jit(lambda a: a.astype(jnp.bfloat16))(x)).view(np.uint16)
  candidates = {"xla": jax.jit(lambda a: a.astype(jnp.bfloat16)),
                "xla_flat": jax.jit(lambda a: a.reshape(-1).astype(jnp.bfloat16).reshape(a.shape)),
                "xla_rows16": jax.jit(lambda a: a.reshape(-1, 16).astype(jnp.bfloat16)
                                      .reshape(a.shape))}
  for rows_per_block in (32, 64, 128):
    for num_warps in (4, 8):
      for num_stages in (1, 3):
        candidates[f"triton_r{rows_per_block}_w{num_warps}_s{num_stages}"] = (
            _triton_widen_rows(rows_per_block, num_warps, num_stages))
  # The shipped kernel (``wts_jax.pallas.widen``: the array as one flat run), its
  # elements a program and warps swept.
  for elements in (8192, 16384, 32768):
    for num_warps in (4, 8):
      candidates[f"triton_flat{elements}_w{num_warps}"] = functools.partial(
          widen.widen_to_bf16, most_per_program=elements, num_warps=num_warps)
  copies = {"int8_copy": (jax.jit(lambda a: a + jnp.int8(1)), x),
            "bf16_copy": (jax.jit(lambda a: a + jnp.bfloat16(1)), y)}
  read_write = args.rows * args.cols * 3
  results = {}
  for name, fn in candidates.items():
    try:
      same = bool(np.array_equal(np.asarray(fn(x)).view(np.uint16), expected))
      durations, ops = _op_durations(fn, x, args.repeats)
      median = float(np.median(durations))
      results[name] = {"median_us": median, "same_bits": same, "ops": ops,
                       "gbps": read_write / median / 1e3}
    except Exception as error:   # a variant that does not lower: recorded, not fatal
      results[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    print(name, results[name], flush=True)
  for name, (fn, operand) in copies.items():
    durations, ops = _op_durations(fn, operand, args.repeats)
    median = float(np.median(durations))
    moved = 2 * operand.size * operand.dtype.itemsize
    results[name] = {"median_us": median, "ops": ops, "gbps": moved / median / 1e3}
    print(name, results[name], flush=True)
  from wts_jax import device
  record = {"device_kind": device.current().kind, "jax_version": jax.__version__,
            "shape": [args.rows, args.cols], "repeats": args.repeats, "results": results}
  if args.out:
    with open(args.out, "w") as handle:
      json.dump(record, handle, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
