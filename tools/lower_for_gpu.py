"""Lower the Pallas kernels for CUDA on a CPU-only machine (no GPU needed).

Catches Pallas→Triton/Mosaic lowering errors before spending device time. Usage:
  python tools/lower_for_gpu.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback

import jax
import jax.numpy as jnp

import wts_jax
from wts_jax import validation
from wts_jax.heads import HeadConfig
from wts_jax.pallas import backend


def verify_triton_modules():
  """Run the MLIR verifier on every Triton module Pallas builds: type errors that the GPU
  compiler would reject (e.g. an i1 operand of an i32 ``arith.ori``) fail here."""
  from jax._src.pallas.triton import lowering

  original = lowering.lower_jaxpr_to_triton_module
  if getattr(original, "verifies", False):
    return

  def lower_and_verify(*args, **kwargs):
    result = original(*args, **kwargs)
    result.module.operation.verify()
    return result

  lower_and_verify.verifies = True
  lowering.lower_jaxpr_to_triton_module = lower_and_verify


def cuda_target():
  """jax >= 0.11 needs an abstract GPU to lower Triton kernels without one."""
  try:
    from jax._src.mesh import AbstractDevice, AbstractMesh
  except ImportError:
    return contextlib.nullcontext()
  if jax.__version_info__ < (0, 11):
    return contextlib.nullcontext()
  mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
      device_kind="NVIDIA H200", num_cores=132, platform="gpu"))
  return jax.sharding.use_abstract_mesh(mesh)


def lower_walk(head_type, batch, steps, *, temperature=0.0, logits=False, logprobs=False,
               quantize=None, config=None, stepwise=False, rank=None,
               base_dtype=jnp.bfloat16):
  """The walk's StableHLO for CUDA at the Qwen3-4B shape (``rank`` another), planned as
  on the H200 with ``config`` (None: the planners' choice among the kernels), over base
  logits and hidden states of ``base_dtype``."""
  head_config = (HeadConfig.qwen3_4b(head_type) if rank is None
                 else HeadConfig.qwen3_4b(head_type, rank=rank))
  head = jax.eval_shape(lambda: wts_jax.make_head(head_config))
  if quantize:
    from wts_jax.quantize import quantize_w2
    # "int8p": an int8 W2 that z meets as two int8 planes.
    head = jax.eval_shape(lambda h: quantize_w2(h, "int8", state="planes")
                          if quantize == "int8p" else quantize_w2(h, quantize), head)
  v, d = head_config.vocab_size, head_config.hidden_size
  base = jax.ShapeDtypeStruct((batch, steps, v), base_dtype)
  first = jax.ShapeDtypeStruct((batch,), jnp.int32)
  hidden = jax.ShapeDtypeStruct((batch, steps, d), base_dtype)

  def run(head, base, first, hidden):
    mode = validation.make_sampling(temperature, jax.random.key(0) if temperature else None,
                                    batch)
    if stepwise:
      from wts_jax.pallas.stepwise import stepwise_walk
      return stepwise_walk(head, base, first, hidden, mode, return_logits=logits,
                           return_logprobs=logprobs)
    shapes = backend.WalkShapes.of(base, mode.greedy, return_logits=logits,
                                   return_logprobs=logprobs)
    choice = backend.choose(head, shapes, "pallas", config, require_gpu=False)
    return choice.launch(backend.WalkOperands(head, base, first, hidden, mode))

  verify_triton_modules()
  with cuda_target():
    return jax.jit(run).trace(head, base, first, hidden).lower(
        lowering_platforms=("cuda",)).as_text()


CASES = [
    dict(head_type="vanilla", batch=1, steps=7),
    dict(head_type="vanilla", batch=64, steps=7),
    dict(head_type="gated", batch=1, steps=7, temperature=0.8, logprobs=True),
    dict(head_type="rnn", batch=16, steps=7, logits=True),
    dict(head_type="vanilla", batch=4, steps=16, temperature=1.0, logits=True,
         logprobs=True),
    dict(head_type="vanilla", batch=1, steps=7, quantize="int8"),
    dict(head_type="vanilla", batch=1, steps=7, stepwise=True),
    dict(head_type="rnn", batch=16, steps=7, stepwise=True, temperature=1.0,
         logprobs=True),
]


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args(argv)
  failures = 0
  for case in CASES[:2] if args.quick else CASES:
    try:
      text = lower_walk(**case)
      print(f"ok   {case}  ({text.count('custom_call')} custom calls)")
    except Exception:  # report every case, then fail
      failures += 1
      print(f"FAIL {case}\n{traceback.format_exc()[-3000:]}")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
