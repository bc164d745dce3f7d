"""An int8 matrix widened to bf16 by a Pallas Triton kernel: the batched walk's int8 W2
when its WGMMAs meet it in bf16 (``BatchedPlan.w2_row_scale`` widened before the launch).

The values are exact in bf16 (|q| <= 128), so this is ``values.astype(jnp.bfloat16)``
bit for bit; it exists because XLA's convert fusion of an int8 array moved its bytes
about a third slower than this kernel (``docs/decisions.md``: the int8 W2's widening). The array is converted as one
flat run of elements (Triton's blocks are powers of two; a row of rank 192 is not), each
program ``ELEMENTS_PER_PROGRAM`` of them, or fewer where the total is not a multiple of
that (the largest power of two dividing it, so no block reaches past the array).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

ELEMENTS_PER_PROGRAM = 8192
NUM_WARPS = 4


def elements_per_program(elements: int, most: int = ELEMENTS_PER_PROGRAM) -> int:
  """The elements a program converts: ``most`` (a power of two), halved until it divides
  ``elements``."""
  if elements < 1:
    raise ValueError(f"elements={elements} must be >= 1")
  block = most
  while elements % block:
    block //= 2
  return block


def _widen_block(values_ref, out_ref):
  out_ref[...] = values_ref[...].astype(jnp.bfloat16)


@functools.partial(jax.jit,
                   static_argnames=("interpret", "most_per_program", "num_warps"))
def widen_to_bf16(values: jax.Array, *, interpret: bool = False,
                  most_per_program: int = ELEMENTS_PER_PROGRAM,
                  num_warps: int = NUM_WARPS) -> jax.Array:
  """``values`` ([rows, cols] int8) as bf16, by the Pallas Triton kernel
  (``most_per_program`` and ``num_warps``: the measured choices unless a
  microbenchmark sweeps them)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as pl_triton
  if values.ndim != 2 or values.dtype != jnp.int8:
    raise ValueError(f"widen_to_bf16 takes a 2-D int8 array, got {values.dtype} "
                     f"{values.shape}")
  flat = values.reshape(-1)
  block = elements_per_program(flat.shape[0], most_per_program)
  spec = pl.BlockSpec((block,), lambda i: (i,))
  widened = pl.pallas_call(
      _widen_block, out_shape=jax.ShapeDtypeStruct(flat.shape, jnp.bfloat16),
      grid=(flat.shape[0] // block,), in_specs=[spec], out_specs=spec, interpret=interpret,
      name="wts_widen_int8",
      compiler_params=pl_triton.CompilerParams(num_warps=num_warps, num_stages=1))(flat)
  return widened.reshape(values.shape)
