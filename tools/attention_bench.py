"""Device time of the decode loop's cached attention: the cache-attention kernel against
JAX's shipped decode-attention kernel and XLA, at the Qwen3 shapes.

  python tools/attention_bench.py --batches 1,4,16,64 --steps 1,8 --out attention.json

Per point (batch, new tokens T, context length): the new tokens' keys and values are in
the cache already (written first), and each variant attends the T queries of every row
over it, causal among the new tokens:

- ``cache_kernel``: ``attention.attend_written`` with the Pallas kernel (what the loop
  runs);
- ``shipped_kernel``: JAX's ``decode_attention`` kernel over the context (one length per
  row and kv head), the new tokens' T × T part in XLA, merged by log-sum-exp — the
  loop's attention before the cache-attention kernel (for T = 1, the kernel alone over
  ``length + 1``);
- ``xla``: the XLA reference (masked softmax over the whole allocated cache);
- ``cache_kernel_splits_P``: the cache kernel with its keys split into P parts (its own
  choice is ``cache_attention.num_splits``), to choose that rule by measurement;
- ``fused_kernel`` (and ``fused_kernel_splits_P``, and each ``--launches``): what the
  loop's layers run on the GPU, ``qkv_attention.fused`` — the new tokens' queries, keys
  and values read from a q/k/v product, normed, rotated and written into the cache
  inside the attention kernel — compared with ``qkv_attention.reference``.

Each variant runs ``--calls`` times back to back under ``jax.profiler``; the JSON holds
per call the device time summed over its ops (``busy_us``), that of the attention's own
kernels alone (``kernels_us``: the fused kernel's call also copies the caches it writes
in place, which the loop, carrying them, does not) and per op name, with the device kind
and the JAX version, and each variant's largest difference from its XLA reference's
output (bf16 inputs: differences of a few 1e-3 are rounding).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402

from device_time import traced_ops  # noqa: E402
from wts_jax.specdecode import attention, cache_attention, numerics, qkv_attention  # noqa: E402

# The kernels of the attention itself, by the name their ops carry in a profile.
_KERNELS = (cache_attention.KERNEL_NAME, qkv_attention.KERNEL_NAME)


def _shipped(q, keys, values, cache_len, *, interpret=False):
  """JAX's decode kernel over ``[0, cache_len)``, the new tokens' part merged in."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from jax.experimental.pallas.ops.gpu import decode_attention
  batch, steps, heads, head_dim = q.shape
  kv_heads = keys.shape[1]
  scale = head_dim ** -0.5
  grouped = cache_attention.grouped(q, kv_heads)
  rows = grouped.shape[2]
  width = keys.shape[2]
  splits = cache_attention.num_splits(batch, kv_heads)
  block_k = cache_attention.key_block(width // splits)
  one = functools.partial(
      decode_attention.decode_attn_unbatched, start_idx=None, sm_scale=scale,
      block_h=max(16, pl.next_power_of_2(rows)), block_k=block_k, k_splits=splits,
      num_warps=None, num_stages=2, grid=None, interpret=interpret, debug=False,
      return_residuals=True, normalize_output=False)
  context = cache_len if steps > 1 else cache_len + 1
  per_head = jax.vmap(lambda q, k, v, n: one(q, k, v, kv_seq_len=n), in_axes=(0, 0, 0, None))
  out, (total, top) = jax.vmap(per_head)(grouped, keys, values, context)
  if steps == 1:
    return cache_attention.ungrouped(out.astype(jnp.float32) / total[..., None],
                                     1).reshape(batch, 1, heads * head_dim)
  take = jax.vmap(lambda c, at: jax.lax.dynamic_slice_in_dim(c, at, steps, axis=1))
  new_k, new_v = take(keys, cache_len), take(values, cache_len)
  visible = attention._new_token_mask(steps, True, rows)[None, None]
  new_scores = jnp.where(visible, cache_attention.scores(grouped, new_k, scale), -jnp.inf)
  new_max = new_scores.max(axis=-1)
  new_exp = jnp.exp(new_scores - new_max[..., None])
  new_out = cache_attention.weighted(new_exp, new_v)
  both = jnp.maximum(top, new_max)
  old_w, new_w = jnp.exp(top - both), jnp.exp(new_max - both)
  merged = (out.astype(jnp.float32) * old_w[..., None] + new_out * new_w[..., None]) / (
      total * old_w + new_exp.sum(axis=-1) * new_w)[..., None]
  return cache_attention.ungrouped(merged, steps).reshape(batch, steps, heads * head_dim)


def variants(interpret: bool, splits: list[int],
             launches: list[cache_attention.Launch] = ()):
  """{name: (which inputs, fn)}: "cache" variants attend ``(q, keys, values, lengths)``,
  "fused" ones take ``fused_inputs``."""
  found = {
      "cache_kernel": ("cache", lambda q, k, v, n: attention.attend_written(
          q, k, v, n, causal=True, impl="pallas", interpret=interpret)),
      "shipped_kernel": ("cache", functools.partial(_shipped, interpret=interpret)),
      "xla": ("cache", lambda q, k, v, n: attention.attend_written(q, k, v, n, causal=True,
                                                                   impl="xla")),
      "fused_reference": ("fused", _fused(qkv_attention.reference)),
      "fused_kernel": ("fused", _fused(qkv_attention.fused, interpret=interpret)),
  }
  for parts in splits:
    found[f"cache_kernel_splits_{parts}"] = ("cache", functools.partial(
        attention.attend_written, causal=True, impl="pallas", splits=parts,
        interpret=interpret))
    found[f"fused_kernel_splits_{parts}"] = ("fused", _fused(
        qkv_attention.fused, splits=parts, interpret=interpret))
  for how in launches:
    name = f"k{how.block_k}_w{how.num_warps}_s{how.num_stages}"
    found[f"cache_kernel_{name}"] = ("cache", functools.partial(
        attention.attend_written, causal=True, impl="pallas", launch_as=how,
        interpret=interpret))
    found[f"fused_kernel_{name}"] = ("fused", _fused(qkv_attention.fused, launch_as=how,
                                                     interpret=interpret))
  return found


def _fused(fn, **options):
  """``fn`` (``qkv_attention.fused`` or its reference) over ``fused_inputs``: the
  attention output alone."""
  def attend(products, cos, sin, q_norm, k_norm, keys, values, start):
    num_heads = products.shape[-1] // keys.shape[-1] - 2 * keys.shape[1]
    return fn(products, cos, sin, q_norm, k_norm, keys, values, start,
              num_heads=num_heads, eps=1e-6, causal=True, **options)[0]
  return attend


def fused_inputs(q, cache_k, cache_v, cache_len, key):
  """The fused kernel's inputs at the same point: a q/k/v product [B, T, (H + 2·Kv)·h]
  whose query part is ``q``, RoPE tables at the new tokens' positions, head norm weights
  near 1, the caches and their lengths."""
  batch, steps, heads, head_dim = q.shape
  kv_heads = cache_k.shape[1]
  keys = jax.random.split(key, 3)
  kv = jax.random.normal(keys[0], (batch, steps, 2 * kv_heads * head_dim), q.dtype)
  products = jnp.concatenate([q.reshape(batch, steps, -1), kv], axis=-1)
  positions = cache_len[:, None] + jnp.arange(steps)[None]
  cos, sin = numerics.rotation_tables(positions, head_dim, 1_000_000.0)
  q_norm, k_norm = ((1 + 0.1 * jax.random.normal(k, (head_dim,))).astype(q.dtype)
                    for k in keys[1:])
  return products, cos, sin, q_norm, k_norm, cache_k, cache_v, cache_len


def time_variant(fn, args, calls: int) -> tuple[dict, jax.Array]:
  run = jax.jit(fn)
  first = jax.block_until_ready(run(*args))
  with tempfile.TemporaryDirectory() as trace_dir:
    ops, by_name = traced_ops(run, args, calls, trace_dir)
  return {"busy_us": sum(e["dur"] for e in ops) / calls,
          "kernels_us": sum(e["dur"] for e in ops if e["name"].startswith(_KERNELS)) / calls,
          "ops_per_call": len(ops) / calls,
          "ops": {name: {"per_call": len(d) / calls, "median_us": statistics.median(d)}
                  for name, d in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))}}, first


# Each variant's output is compared with its inputs' XLA reference.
_REFERENCE = {"cache": "xla", "fused": "fused_reference"}


def point(batch: int, steps: int, context: int, *, heads: int, kv_heads: int,
          head_dim: int, calls: int, interpret: bool, splits: list[int],
          launches: list[cache_attention.Launch] = ()) -> list[dict]:
  width = attention.padded_cache_len(context + steps)
  keys = jax.random.split(jax.random.key(batch * 131 + steps), 4)
  q = jax.random.normal(keys[0], (batch, steps, heads, head_dim), jnp.bfloat16)
  cache_k, cache_v = (jax.random.normal(k, (batch, kv_heads, width, head_dim),
                                        jnp.bfloat16) for k in keys[1:3])
  cache_len = jnp.full((batch,), context, jnp.int32)
  inputs = {"cache": (q, cache_k, cache_v, cache_len),
            "fused": fused_inputs(q, cache_k, cache_v, cache_len, keys[3])}
  records, outputs, kinds = [], {}, {}
  for name, (kind, fn) in variants(interpret, splits, launches).items():
    record = dict(variant=name, batch=batch, new_tokens=steps, context=context,
                  cache_positions=width)
    try:
      timed, outputs[name] = time_variant(fn, inputs[kind], calls)
    except ValueError as error:   # a launch whose key block does not divide this split
      records.append(dict(record, skipped=str(error)))
      print(f"B={batch:3d} T={steps} {name:26s} skipped: {error}", file=sys.stderr)
      continue
    kinds[name] = kind
    records.append(dict(record, **timed))
    print(f"B={batch:3d} T={steps} {name:26s} {timed['busy_us']:8.1f} us/call, kernels "
          f"{timed['kernels_us']:8.1f} ({timed['ops_per_call']:.0f} ops)", file=sys.stderr,
          flush=True)
  for record in records:   # every variant's output beside its XLA reference's
    name = record["variant"]
    if name in outputs:
      reference = outputs[_REFERENCE[kinds[name]]]
      record["max_abs_diff_vs_xla"] = float(jnp.max(jnp.abs(
          outputs[name].astype(jnp.float32) - reference.astype(jnp.float32))))
  return records


def parse_launches(text: str) -> list[cache_attention.Launch] | None:
  """``--launches``: KEYSxWARPSxSTAGES items, comma-separated; None if one is not."""
  found = []
  for item in filter(None, text.split(",")):
    parts = item.split("x")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
      return None
    how = cache_attention.Launch(*map(int, parts))
    if (how.block_k not in cache_attention.KEY_BLOCKS or how.num_warps not in (1, 2, 4, 8, 16)
        or not 1 <= how.num_stages <= 6):
      return None
    found.append(how)
  return found


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="attention_bench",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--batches", default="1,4,16,64", help="rows (default 1,4,16,64)")
  parser.add_argument("--steps", default="1,8",
                      help="new tokens a row: 1 a decode step, k + 1 a verify pass "
                           "(default 1,8)")
  parser.add_argument("--context", type=int, default=512,
                      help="cached positions a row (default 512)")
  parser.add_argument("--shape", default="32,8,128",
                      help="query heads, kv heads, head dim (default Qwen3-4B/8B: 32,8,128)")
  parser.add_argument("--calls", type=int, default=50,
                      help="calls traced per variant (default 50)")
  parser.add_argument("--splits", default="1,2,4,8,16",
                      help="split counts the cache kernel also runs with, beside its own "
                           "choice (default 1,2,4,8,16; '' none)")
  parser.add_argument("--launches", default="",
                      help="the cache kernel's own split count also run with these "
                           "launches, KEYSxWARPSxSTAGES each (e.g. 64x4x2,64x4x3,128x8x2; "
                           "default '' none)")
  parser.add_argument("--interpret", action="store_true",
                      help="the kernels in Pallas interpret mode (a CPU smoke run)")
  parser.add_argument("--out", type=Path, default=Path("attention_bench.json"))
  args = parser.parse_args(argv)
  try:
    batches = [int(b) for b in args.batches.split(",")]
    steps = [int(t) for t in args.steps.split(",")]
    heads, kv_heads, head_dim = (int(x) for x in args.shape.split(","))
    splits = [int(p) for p in args.splits.split(",") if p]
  except ValueError:
    print(f"error: --batches {args.batches!r}, --steps {args.steps!r}, --shape "
          f"{args.shape!r} and --splits {args.splits!r} must be comma-separated integers",
          file=sys.stderr)
    return 2
  launches = parse_launches(args.launches)
  if launches is None:
    print(f"error: --launches {args.launches!r}: each KEYSxWARPSxSTAGES, keys one of "
          f"{', '.join(map(str, cache_attention.KEY_BLOCKS))}, warps one of 1, 2, 4, 8, "
          f"16, stages 1-6", file=sys.stderr)
    return 2
  if any(p not in (1, 2, 4, 8, cache_attention.MAX_SPLITS) for p in splits):
    print(f"error: --splits {args.splits!r}: each a power of two <= "
          f"{cache_attention.MAX_SPLITS}", file=sys.stderr)
    return 2
  if min(batches + steps) < 1 or args.context < 1 or args.calls < 1 or heads % kv_heads:
    print("error: batches, steps, --context and --calls must be >= 1 and the query heads "
          "a multiple of the kv heads", file=sys.stderr)
    return 2
  records = [r for b in batches for t in steps
             for r in point(b, t, args.context, heads=heads, kv_heads=kv_heads,
                            head_dim=head_dim, calls=args.calls, interpret=args.interpret,
                            splits=splits, launches=launches)]
  report = dict(tool="tools/attention_bench.py", device=jax.devices()[0].device_kind,
                jax_version=jax.__version__, shape=dict(heads=heads, kv_heads=kv_heads,
                                                        head_dim=head_dim),
                calls=args.calls, results=records)
  tmp = args.out.with_name(args.out.name + ".tmp")
  tmp.write_text(json.dumps(report, indent=1) + "\n")
  tmp.replace(args.out)
  print(f"wrote {args.out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
