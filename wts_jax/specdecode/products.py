"""Weight products of the decode loop, ``y = x Wᵀ`` for a few rows, at the speed of HBM.

A decode step, a verify pass and the drafter's block multiply a handful of rows (1 to
128) by each weight matrix: the product is a stream of the weight from HBM, and all
that matters is how close to HBM bandwidth the stream runs. XLA's own GEMM for these
shapes streams too slowly (its tiles are made for many rows), and cuBLAS, where XLA
uses it, turns a one-row bf16 product into an fp32 GEMV over an fp32 copy of the
weight.

Two implementations, one contract (``IMPLS``):

- ``"xla"``: ``einsum`` with fp32 accumulation; the CPU path and the oracle.
- ``"pallas"``: a Pallas (Triton) kernel that cuts the weight into ``[rows, K / splits]``
  slabs, one program each, and streams each slab through tensor-core dots against the
  few rows of ``x`` (padded to 16), accumulating in fp32. Splitting K keeps every SM
  busy when the weight has few output rows (the key/value projections); the splits'
  fp32 partial sums are added by XLA (a few KB). Rows past ``MAX_ROWS`` go to XLA: there
  the product has enough work per weight byte for XLA's GEMM.

Both round once, from the fp32 sum to ``x``'s dtype; they differ only in the order of
the fp32 additions.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from wts_jax.specdecode.attention import precision

IMPLS = ("auto", "xla", "pallas")
# Rows the kernel serves: up to a verify pass of 16 rows x 8 positions. Past that a
# product reads each weight byte for enough rows that XLA's GEMM keeps up with HBM.
MAX_ROWS = 128
MIN_DOT_ROWS = 16
# Programs to aim for: two waves of an H200's 132 SMs.
TARGET_PROGRAMS = 264


@dataclasses.dataclass(frozen=True)
class ProductPlan:
  """How one ``[rows, K] x [N, K]ᵀ`` product is cut: ``block_n`` weight rows a program,
  ``splits`` parts of K, ``block_k`` columns a loaded tile."""

  padded_rows: int
  block_n: int
  block_k: int
  splits: int
  num_warps: int
  num_stages: int


def padded_rows(rows: int) -> int:
  """Rows of ``x`` as the kernel's dots take them: a power of two ≥ 16."""
  padded = MIN_DOT_ROWS
  while padded < rows:
    padded *= 2
  return padded


def plan_product(rows: int, n: int, k: int, *, block_n: int | None = None,
                 block_k: int = 128, splits: int | None = None, num_warps: int = 4,
                 num_stages: int = 4, target_programs: int = TARGET_PROGRAMS
                 ) -> ProductPlan | None:
  """The kernel's cut of a product, or None where the kernel does not serve it."""
  if rows > MAX_ROWS:
    return None
  padded = padded_rows(rows)
  if block_n is None:
    block_n = 64 if padded <= 64 else 128
  if n % block_n or k % block_k:
    return None
  tiles = k // block_k
  if splits is None:
    splits = 1
    for candidate in range(1, tiles + 1):
      if tiles % candidate == 0:
        splits = candidate
        if (n // block_n) * candidate >= target_programs:
          break
  if tiles % splits:
    return None
  return ProductPlan(padded, block_n, block_k, splits, num_warps, num_stages)


def _product_kernel(x_ref, w_ref, out_ref, *, plan: ProductPlan, tiles_per_split: int):
  block = pl.program_id(0)
  split = pl.program_id(1)
  weight_rows = pl.ds(block * plan.block_n, plan.block_n)

  def tile(i, acc):
    cols = pl.ds((split * tiles_per_split + i) * plan.block_k, plan.block_k)
    return acc + pl_triton.dot(x_ref[:, cols], w_ref[weight_rows, cols], trans_b=True)

  acc = lax.fori_loop(0, tiles_per_split, tile,
                      jnp.zeros((plan.padded_rows, plan.block_n), jnp.float32))
  out_ref[split, :, weight_rows] = acc


def product_pallas(x: jax.Array, weight: jax.Array, plan: ProductPlan, *,
                   interpret: bool = False) -> jax.Array:
  """``x [rows, K] · weight [N, K]ᵀ`` in fp32 through the kernel (rows ≤ padded rows)."""
  rows, k = x.shape
  n = weight.shape[0]
  x_padded = jnp.zeros((plan.padded_rows, k), weight.dtype).at[:rows].set(
      x.astype(weight.dtype))
  tiles_per_split = k // plan.block_k // plan.splits
  partial = pl.pallas_call(
      functools.partial(_product_kernel, plan=plan, tiles_per_split=tiles_per_split),
      out_shape=jax.ShapeDtypeStruct((plan.splits, plan.padded_rows, n), jnp.float32),
      grid=(n // plan.block_n, plan.splits),
      interpret=interpret,
      compiler_params=pl_triton.CompilerParams(num_warps=plan.num_warps,
                                               num_stages=plan.num_stages),
      name="wts_weight_product",
  )(x_padded, weight)
  return jnp.sum(partial, axis=0)[:rows]


def resolve(impl: str) -> str:
  """``"auto"`` → ``"pallas"`` on a GPU, else ``"xla"``."""
  if impl not in IMPLS:
    raise ValueError(f"products_impl={impl!r} must be one of {IMPLS}")
  if impl != "auto":
    return impl
  return "pallas" if jax.default_backend() == "gpu" else "xla"


def linear(x: jax.Array, weight: jax.Array, impl: str = "xla") -> jax.Array:
  """``x Wᵀ`` for a ``[out, in]`` weight, in ``x``'s dtype with fp32 accumulation.
  ``impl="pallas"`` runs the kernel where it serves the product (bf16 operands, rows ≤
  ``MAX_ROWS``, a cut that divides the weight), interpreted off a GPU; else XLA."""
  if impl == "pallas" and x.dtype == weight.dtype == jnp.bfloat16:
    rows = math.prod(x.shape[:-1])
    n, k = weight.shape
    plan = plan_product(rows, n, k)
    if plan is not None:
      y = product_pallas(x.reshape(rows, k), weight, plan,
                         interpret=jax.default_backend() != "gpu")
      return y.astype(x.dtype).reshape(*x.shape[:-1], n)
  y = jnp.einsum("...i,oi->...o", x, weight.astype(x.dtype),
                 preferred_element_type=jnp.float32, precision=precision(x.dtype))
  return y.astype(x.dtype)
