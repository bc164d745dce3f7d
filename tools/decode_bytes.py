"""Bytes the decode loop's parts move on an H200, beside the bytes they must read.

Compiles, for the H200 without a GPU (``hlo_traffic``; needs ``jax[cuda12]``), the same
steps that ``wts-e2e-bench`` times (``wts_jax.specdecode.timing.loop_pieces``): a verify pass
(the target over k + 1 tokens, the acceptance rule, the cache write), an
autoregressive step (one token), and a drafter pass (its block, the context keys and
values of the k + 1 verified positions and their write), at the Qwen3-4B and 8B shapes,
for each batch size, with the XLA options the loop's executable gets at that batch size
(``specdecode.loop.compiler_options``). For each it writes the bytes its optimized HLO
moves (the byte model of ``hlo_traffic``), the bytes it must read (the weights it uses,
once, and the rows' cached keys and values at ``prompt_len``), their ratio, and the
bytes written by copies of a weight (0 when every weight is read where it lies) and of
a cache layer (0 when every cache is written in place), its kernels (``operations``) and
how many of them are the cache-attention kernels.

  python tools/decode_bytes.py --out bench/results/h200_decode_bytes.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hlo_traffic  # noqa: E402

PHASES = ("verify", "autoregressive", "drafter")


def _param_bytes(state) -> int:
  import jax
  return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(state))


def must_read(model, *, batch: int, prompt_len: int) -> int:
  """The weights a forward reads (every parameter but the embedding table, which it
  gathers a few rows of, unless the table is also the output projection) plus the rows'
  cached keys and values at ``prompt_len``."""
  from flax import nnx
  c = model.config if hasattr(model.config, "num_kv_heads") else model.config.layers
  weights = _param_bytes(nnx.state(model))
  table = model.embed_tokens.weight
  if getattr(model, "lm_head", None) is not None:
    weights -= table.size * table.dtype.itemsize
  head = getattr(model, "head", None)
  if head is not None:   # the serial head is the walk's, not the backbone's
    weights -= _param_bytes(nnx.state(head))
  kv = 2 * c.num_layers * batch * prompt_len * c.num_kv_heads * c.head_dim * 2
  return int(weights + kv)


def weight_shapes(model) -> set[str]:
  from flax import nnx
  import jax
  return {hlo_traffic.hlo_shape(leaf.dtype, leaf.shape)
          for leaf in jax.tree.leaves(nnx.state(model)) if leaf.ndim == 2}


def phase_bytes(target, drafter, *, batch: int, draft_len: int, prompt_len: int,
                phases: tuple[str, ...] = PHASES) -> dict:
  """``{phase: summary}`` for one batch size (abstract models: nothing allocated)."""
  import jax
  from flax import nnx
  from wts_jax.specdecode import attention, cache_attention, loop, qkv_attention, timing
  sharding = hlo_traffic.h200_sharding()
  steps = {"verify": timing.loop_pieces(target, drafter, batch=batch, draft_len=draft_len,
                                        prompt_len=prompt_len, attention_impl="pallas",
                                        walk_impl="xla"),
           "autoregressive": timing.loop_pieces(target, drafter, batch=batch, draft_len=0,
                                                prompt_len=prompt_len,
                                                attention_impl="pallas")}
  pieces = {"verify": steps["verify"]["verify"],
            # the loop's K = 0 step: the target over one position per row
            "autoregressive": steps["autoregressive"]["verify"],
            "drafter": steps["verify"]["drafter"]}
  cache_len = attention.padded_cache_len(prompt_len + max(draft_len, 1) + 2)
  # the options the loop's executable is compiled with at this batch size on a GPU
  options = loop.gpu_compiler_options(cublas_products=loop.cublas_products(batch))
  out = {}
  for phase in phases:
    piece = pieces[phase]
    model = drafter if phase == "drafter" else target
    graph, state = nnx.split(model)

    # Each piece reads one model; the other is not an operand.
    def step(weights, carry, piece=piece, phase=phase, graph=graph):
      this = nnx.merge(graph, weights)
      return (piece.step(None, this, carry) if phase == "drafter"
              else piece.step(this, None, carry))

    carry = hlo_traffic.abstract(jax.eval_shape(piece.carry), sharding)
    text = hlo_traffic.compile_hlo(jax.jit(step, donate_argnums=1, compiler_options=options),
                                   hlo_traffic.abstract(state, sharding), carry)
    caches = {hlo_traffic.hlo_shape(leaf.dtype, leaf.shape)
              for leaf in jax.tree.leaves(jax.eval_shape(piece.carry)) if leaf.ndim == 4}
    summary = hlo_traffic.summary(text, cache_fraction=prompt_len / cache_len,
                                  weight_shapes=weight_shapes(model), cache_shapes=caches)
    need = must_read(model, batch=batch, prompt_len=prompt_len)
    attention_kernels = sum(
        1 for line in text.splitlines()
        if "custom-call(" in line and re.search(
            rf'op_name="[^"]*({cache_attention.KERNEL_NAME}|{qkv_attention.KERNEL_NAME}|'
            rf'{cache_attention.MERGE_KERNEL_NAME})/pallas_call', line))
    out[phase] = dict(moved_bytes=summary["moved_bytes"], must_read_bytes=need,
                      moved_over_must_read=summary["moved_bytes"] / need,
                      weight_copy_bytes=summary["weight_copy_bytes"],
                      cache_copy_bytes=summary["cache_copy_bytes"],
                      roofline_s_at_4p8_tbps=need / 4.8e12,
                      operations=summary["operations"],
                      attention_kernels=attention_kernels,
                      top_kinds={k: v for k, v in list(summary["by_kind"].items())[:8]})
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="decode_bytes", description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="qwen3_4b,qwen3_8b")
  parser.add_argument("--batches", default="1,4,16,64")
  parser.add_argument("--prompt-len", type=int, default=512)
  parser.add_argument("--draft-len", type=int, default=7)
  parser.add_argument("--out", type=Path, default=Path("decode_bytes.json"))
  args = parser.parse_args(argv)
  if not hlo_traffic.cuda_available():
    print("error: compiling for the H200 needs jax's CUDA plugin: pip install "
          "\"jax[cuda12]==<this jax>\"", file=sys.stderr)
    return 2
  import jax
  from flax import nnx
  from wts_jax.specdecode.bench_e2e import model_configs
  from wts_jax.specdecode.dspark import DSparkDrafter
  from wts_jax.specdecode.qwen3 import Qwen3
  records = []
  began = time.perf_counter()
  for name in args.models.split(","):
    target_config, drafter_config = model_configs(name, "vanilla")
    target = nnx.eval_shape(lambda: Qwen3(target_config, rngs=nnx.Rngs(0)))
    drafter = nnx.eval_shape(lambda: DSparkDrafter(drafter_config, rngs=nnx.Rngs(1)))
    for batch in map(int, args.batches.split(",")):
      phases = phase_bytes(target, drafter, batch=batch, draft_len=args.draft_len,
                           prompt_len=args.prompt_len)
      for phase, record in phases.items():
        records.append(dict(model=name, batch=batch, phase=phase, **record))
        print(f"[{time.perf_counter() - began:6.0f}s] {name} B={batch} {phase}: moved "
              f"{record['moved_bytes'] / 1e9:.2f} GB, must read "
              f"{record['must_read_bytes'] / 1e9:.2f} GB "
              f"({record['moved_over_must_read']:.2f}x), weight copies "
              f"{record['weight_copy_bytes'] / 1e6:.1f} MB, cache copies "
              f"{record['cache_copy_bytes'] / 1e6:.1f} MB", file=sys.stderr, flush=True)
  report = dict(tool="tools/decode_bytes.py", target_device="NVIDIA H200 (compiled "
                "without a GPU from tools/h200_device.txtpb)", jax_version=jax.__version__,
                prompt_len=args.prompt_len, draft_len=args.draft_len,
                byte_model=hlo_traffic.__doc__.split("The byte model", 1)[1].strip(),
                results=records)
  args.out.write_text(json.dumps(report, indent=1) + "\n")
  print(f"wrote {args.out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
