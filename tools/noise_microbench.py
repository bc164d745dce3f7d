"""What the sampled walk's Gumbel noise costs on the GPU, stage by stage.

  python tools/noise_microbench.py [--values-m 68] [--out noise_microbench.json]

The batched kernel's sampled epilogue draws a noise value for every element of every
chunk's accumulator (68 M values a walk at B = 64, K = 7), and at B = 64 that is most of
what sampling costs. Here a Mosaic GPU kernel, one block an SM, draws ``--values-m``
million values in the epilogue's layout ([64, 64] f32 tiles in the WGMMA layout), each
tile folded into a running max so that nothing is dead code, for each stage of
``wts_jax.sampling``:

- ``hash``: the counter's two lowbias32 rounds (``uniform_from_stream``'s bits);
- ``uniform``: and the uniform in (0, 1);
- ``log``: and the inner log (``log_positive``);
- ``gumbel``: and the outer log (``gumbel_from_uniform``), what the walk draws;
- ``gumbel-2wg``: the same over two warpgroups a block, as the vanilla head's epilogue.

Each is timed by the device clock (a CUPTI trace, median of ``--repeats`` launches);
the differences between stages are what each costs. ``--check`` (any backend) runs a
small grid in Pallas interpret mode and compares every stage with XLA's values (the
hash and the uniform bit for bit, the log within an ulp, the noise within
``sampling.KERNEL_NOISE_TOLERANCE``).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys
import tempfile

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import sampling
from wts_jax.bench.registry import gpu_reason

TILE = 64
STAGES = ("hash", "uniform", "log", "gumbel", "gumbel-2wg")


def stage_values(stage: str, streams, vocab_index):
  """The stage's values of a tile: f32 (the hash's bits as f32 by value, exact order)."""
  if stage == "hash":
    bits = sampling.stream_bits(streams, vocab_index)
    return lax.shift_right_logical(bits, jnp.uint32(9)).astype(jnp.int32).astype(
        jnp.float32)
  u = sampling.uniform_from_stream(streams, vocab_index)
  if stage == "uniform":
    return u
  if stage == "log":
    return -sampling.log_positive(u)
  return sampling.gumbel_from_uniform(u)


def _kernel(seed_ref, out_ref, out_s, *, stage: str, tiles: int, warpgroups: int):
  block = lax.axis_index("blocks")
  wg = lax.axis_index("wg") if warpgroups > 1 else 0
  layout = plgpu.Layout.WGMMA
  rows = plgpu.broadcasted_iota(jnp.int32, (TILE, TILE), 0, layout=layout)
  cols = plgpu.broadcasted_iota(jnp.int32, (TILE, TILE), 1, layout=layout)
  streams = sampling.mix32(rows.astype(jnp.uint32) + seed_ref[0])
  first = (block * warpgroups + wg) * tiles

  def tile(i, best):
    vocab_index = ((first + i) * TILE + cols).astype(jnp.uint32)
    return jnp.maximum(best, stage_values(stage, streams, vocab_index))

  best = lax.fori_loop(0, tiles, tile, plgpu.layout_cast(
      jnp.full((TILE, TILE), -jnp.inf, jnp.float32), layout))
  out_s.at[wg][...] = best
  plgpu.commit_smem()
  plgpu.copy_smem_to_gmem(out_s.at[wg], out_ref.at[block * warpgroups + wg])
  plgpu.wait_smem_to_gmem(0)


def noise_kernel(stage: str, *, blocks: int, tiles: int, interpret: bool = False):
  """``f(seed uint32[1]) -> [blocks · warpgroups, 64, 64]`` f32: each warpgroup's max
  over its ``tiles`` tiles of the stage's values."""
  warpgroups = 2 if stage.endswith("-2wg") else 1
  params = {}
  if interpret:
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    params["interpret"] = InterpretGPUParams()
  if warpgroups > 1:
    params.update(num_threads=warpgroups, thread_name="wg")
  return plgpu.kernel(
      functools.partial(_kernel, stage=stage.removesuffix("-2wg"), tiles=tiles,
                        warpgroups=warpgroups),
      out_type=jax.ShapeDtypeStruct((blocks * warpgroups, TILE, TILE), jnp.float32),
      grid=(blocks,), grid_names=("blocks",),
      scratch_types=[plgpu.SMEM((warpgroups, TILE, TILE), jnp.float32)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
      **params)


def expected(stage: str, seed, *, blocks: int, tiles: int):
  """XLA's values of the same grid (the kernel's output, computed without it)."""
  warpgroups = 2 if stage.endswith("-2wg") else 1
  rows = jnp.arange(TILE, dtype=jnp.uint32)[:, None]
  streams = sampling.mix32(rows + seed[0])
  owners = blocks * warpgroups
  index = (jnp.arange(owners * tiles)[:, None] * TILE
           + jnp.arange(TILE)[None, :]).astype(jnp.uint32)   # [owners · tiles, 64]
  values = jax.vmap(lambda v: stage_values(stage.removesuffix("-2wg"), streams,
                                           v[None, :]))(index)
  return values.reshape(owners, tiles, TILE, TILE).max(axis=1)


def check(blocks: int = 2, tiles: int = 3) -> int:
  seed = jnp.asarray([12345], jnp.uint32)
  failures = 0
  for stage in STAGES:
    got = jax.jit(noise_kernel(stage, blocks=blocks, tiles=tiles, interpret=True))(seed)
    want = expected(stage, seed, blocks=blocks, tiles=tiles)
    # The hash and the uniform bit for bit; the log within an ulp and the noise within
    # the kernels' tolerance (compilers may round a step differently, as between XLA and
    # Mosaic GPU: wts_jax.sampling).
    error = jnp.abs(got - want)
    if stage in ("hash", "uniform"):
      same = bool(jnp.all(error == 0))
    elif stage == "log":
      same = bool(jnp.all(error <= jnp.spacing(jnp.abs(want))))
    else:
      same = bool(jnp.all(error <= sampling.KERNEL_NOISE_TOLERANCE))
    failures += not same
    print(f"{'ok' if same else 'FAIL':4} {stage}")
  return 1 if failures else 0


def time_stages(values_m: float, repeats: int) -> dict:
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
  from device_time import _device_ops, _trace_events
  from wts_jax import device
  blocks = device.current().num_sms
  tiles = max(1, round(values_m * 1e6 / (blocks * TILE * TILE)))
  seed = jnp.asarray([12345], jnp.uint32)
  result = {"device_kind": device.current().kind, "jax_version": jax.__version__,
            "blocks": blocks, "values": blocks * tiles * TILE * TILE, "stages": {}}
  for stage in STAGES:
    warpgroups = 2 if stage.endswith("-2wg") else 1
    # The same values in all: two warpgroups take half the tiles each.
    kernel = jax.jit(noise_kernel(stage, blocks=blocks, tiles=tiles // warpgroups))
    jax.block_until_ready(kernel(seed))
    with tempfile.TemporaryDirectory() as trace_dir:
      with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(repeats):
          out = kernel(seed)
        jax.block_until_ready(out)
      durations = [float(e["dur"]) for e in _device_ops(_trace_events(trace_dir))]
    median = statistics.median(durations) if durations else float("nan")
    result["stages"][stage] = {"median_us": median,
                               "ns_per_value": median * 1e3 / result["values"]}
    print(f"{stage:12} {median:9.1f} µs  {median * 1e3 / result['values']:.4f} ns a value")
  return result


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--values-m", type=float, default=68.0,
                      help="million noise values a stage (68: a B = 64, K = 7 walk)")
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--check", action="store_true",
                      help="interpret mode against XLA's values (any backend)")
  parser.add_argument("--out", default=None, help="results JSON path")
  args = parser.parse_args(argv)
  if args.check:
    return check()
  reason = gpu_reason()
  if reason is not None:
    print(f"error: {reason}; --check runs anywhere", file=sys.stderr)
    return 2
  result = time_stages(args.values_m, args.repeats)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
