"""The L2 flush step of the timed chains: between two walks of a cold-L2 chain, a write
over a buffer larger than the L2 evicts W2; a warm chain runs the same step on
``FLUSH_HEAD`` elements only, so both chains do the same launches (``timing.METHOD``).
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable

import jax
import jax.numpy as jnp

FLUSH_BYTES_GPU = 256 << 20
FLUSH_IMPLS = ("kernel", "cond", "static")
FLUSH_BLOCK = 16384   # int32 elements per program of the flush kernel (64 KB)
FLUSH_HEAD = 128      # elements every flush step adds to, cold or warm (flush[0] included)
FLUSH_KERNEL_NAME = "wts_bench_l2_flush"   # the flush kernel's name in a device trace


# --- the flush step ----------------------------------------------------------------------

def default_flush_bytes() -> int:
  return FLUSH_BYTES_GPU if jax.default_backend() == "gpu" else 4 << 20


def default_flush_impl() -> str:
  """"kernel" on the GPU; "static" elsewhere (on the CPU a conditional flush step puts a
  systematic ~1 ms per walk on the empty-walk sanity line, the static chains do not)."""
  return "kernel" if jax.default_backend() == "gpu" else "static"


def flush_elements(nbytes: int) -> int:
  """int32 elements of a flush buffer of at least ``nbytes``: whole kernel blocks."""
  blocks = max(1, -(-int(nbytes) // (4 * FLUSH_BLOCK)))
  return blocks * FLUSH_BLOCK


def make_jax_flush_buffer(nbytes: int) -> jax.Array:
  return jnp.zeros((flush_elements(nbytes),), jnp.int32)


def _flush_kernel(params_ref, x_ref, o_ref, *, block: int):
  """Adds params[1] to x[:128] always and to each block below params[0] elements."""
  from jax.experimental import pallas as pl
  program = pl.program_id(0)
  start = pl.multiple_of(program * block, block)
  bump = params_ref[1]

  @pl.when(program == 0)
  def _head():
    o_ref[pl.ds(0, FLUSH_HEAD)] = x_ref[pl.ds(0, FLUSH_HEAD)] + bump

  @pl.when(start < params_ref[0])
  def _block():
    o_ref[pl.ds(start, block)] = x_ref[pl.ds(start, block)] + bump


def kernel_flush(flush: jax.Array, bump: jax.Array, flush_elems: jax.Array, *,
                 interpret: bool | None = None) -> jax.Array:
  """The flush step as one Pallas kernel: ``flush + bump`` over the first
  ``flush_elems`` elements (whole blocks) and the first 128. The other elements of the
  result are left unwritten: only the traffic and flush[0] matter."""
  from jax.experimental import pallas as pl
  size = flush.shape[0]
  if flush.dtype != jnp.int32 or flush.ndim != 1 or size % FLUSH_BLOCK:
    raise ValueError(f"the flush buffer must be int32 of whole {FLUSH_BLOCK}-element "
                     f"blocks; got {flush.dtype}{list(flush.shape)}")
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  params = jnp.stack([jnp.asarray(flush_elems, jnp.int32).reshape(()),
                      jnp.asarray(bump, jnp.int32).reshape(())])
  options = {}
  if not interpret:
    from jax.experimental.pallas import triton as pl_triton
    options["compiler_params"] = pl_triton.CompilerParams(num_warps=8)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # "Pallas Triton is deprecated"
    return pl.pallas_call(
        functools.partial(_flush_kernel, block=FLUSH_BLOCK), grid=(size // FLUSH_BLOCK,),
        out_shape=jax.ShapeDtypeStruct(flush.shape, flush.dtype), interpret=interpret,
        name=FLUSH_KERNEL_NAME, **options)(params, flush)


def cond_flush(flush: jax.Array, bump: jax.Array, flush_elems: jax.Array) -> jax.Array:
  """The flush step as a ``lax.cond`` on the size: all of the buffer, or its head."""
  return jax.lax.cond(flush_elems > 0, lambda f: f + bump,
                      lambda f: f.at[:FLUSH_HEAD].add(bump), flush)


def flush_step(flush_impl: str) -> Callable:
  if flush_impl == "kernel":
    return kernel_flush
  if flush_impl == "cond":
    return cond_flush
  raise ValueError(f"flush_impl={flush_impl!r} must be one of {FLUSH_IMPLS}")


def flush_elems_for(flush: jax.Array, l2: str) -> jax.Array:
  """The executable's flush-size argument: the whole buffer (cold) or nothing (warm)."""
  return jnp.asarray(flush.shape[0] if is_cold(l2) else 0, jnp.int32)


def check_flush_impl(flush: jax.Array, flush_impl: str) -> str | None:
  """Run one cold and one warm flush step on ``flush``; None if the cold one added to
  every element and the warm one to the head, else what went wrong."""
  if flush_impl == "static":
    return None
  step = jax.jit(lambda x, elems: flush_step(flush_impl)(x, jnp.int32(1), elems))
  try:
    cold = step(flush, flush_elems_for(flush, "cold"))
    if not bool(jnp.all(cold == flush + 1)):
      return f"flush_impl {flush_impl}: the cold flush missed elements"
    warm = step(flush, flush_elems_for(flush, "warm"))
    if not bool(jnp.all(warm[:FLUSH_HEAD] == flush[:FLUSH_HEAD] + 1)):
      return f"flush_impl {flush_impl}: the warm flush did not add to the head"
  except Exception as err:  # noqa: BLE001 - the caller falls back and records why
    return f"flush_impl {flush_impl}: {type(err).__name__}: {err}"[:500]
  return None


def make_torch_flush_buffer(nbytes: int, device):
  import torch
  return torch.zeros(max(1, nbytes // 4), dtype=torch.int32, device=device)



def is_cold(l2: str) -> bool:
  if l2 not in ("cold", "warm"):
    raise ValueError(f"l2={l2!r} must be 'cold' or 'warm'")
  return l2 == "cold"
