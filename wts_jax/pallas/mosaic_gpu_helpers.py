"""Small helpers every Mosaic GPU kernel here shares: loads and stores as every supported
jax lowers them, Python-or-traced conditions (a plan often fixes a branch statically),
the WGMMA layouts, the W2 tiles' shared-memory transforms, a rolled chunk loop's kinds,
and the interpret mode's parameters.
"""

from __future__ import annotations

import functools
import inspect

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas.mosaic_plan import row_swizzle

WGMMA = plgpu.Layout.WGMMA
ROW_VECTOR = WGMMA.reduce(1)   # one value per row of a [64, n] WGMMA tile
COL_VECTOR = WGMMA.reduce(0)   # one value per column, broadcast over the rows
BIG_INDEX = 1 << 30            # an index past any vocabulary: loses every tie
NEG_INF = float("-inf")

# jax 0.10.2's ``plgpu.load`` takes the index as a required positional argument; 0.11
# makes it optional (deprecated) and 0.12 drops it.
_LOAD_INDEX_PARAMETER = inspect.signature(plgpu.load).parameters.get("idx")
_LOAD_NEEDS_INDEX = (_LOAD_INDEX_PARAMETER is not None
                     and _LOAD_INDEX_PARAMETER.default is inspect.Parameter.empty)
# jax 0.12 plans every register-to-memory store for coalescing (global memory) or for no
# bank conflicts (shared memory), and refuses one it cannot prove; earlier versions store
# untiled refs as given. ``plgpu.store(optimized=False)`` (jax >= 0.12) is that store.
_HAS_STORE = hasattr(plgpu, "store")
# jax 0.12.1's ``plgpu.RefType`` says whether inline code writes a ref (by default it
# may), and a kernel that may write an input passed as an array is refused; earlier
# versions take the transforms only.
_REF_TYPE_HAS_WRITE = "write" in getattr(plgpu.RefType, "__dataclass_fields__", {})


def read_ref(transforms=()):
  """``plgpu.RefType`` of a ref that inline Mosaic code only reads (the kernel's inputs:
  read-only where the jax can say so)."""
  if _REF_TYPE_HAS_WRITE:
    return plgpu.RefType(transforms=transforms, write=False)
  return plgpu.RefType(transforms=transforms)


def load(ref, layout, **kwargs):
  """``plgpu.load(ref, layout=layout)`` on every supported jax."""
  if _LOAD_NEEDS_INDEX:
    return plgpu.load(ref, (), layout=layout, **kwargs)
  return plgpu.load(ref, layout=layout, **kwargs)


def store(ref, value, index=...):
  """``ref[index] = value`` lowered as jax 0.10 and 0.11 lower it, on every version: for
  a few words a row in global memory, or a tile whose transfer has no conflict-free
  plan."""
  if _HAS_STORE:
    plgpu.store(ref if index is Ellipsis else ref.at[index], value, optimized=False)
  else:
    ref[index] = value


def select(condition, when_true, when_false):
  """``when_true`` or ``when_false()``: chosen in Python for a static condition (a plan
  without resident or without streamed chunks knows every chunk's kind), else by
  ``jnp.where``."""
  if isinstance(condition, bool):
    return when_true if condition else when_false()
  return jnp.where(condition, when_true, when_false())


def when(condition, body):
  """``body()`` where ``condition`` holds: in Python for a static one, else
  ``pl.when``."""
  if isinstance(condition, bool):
    if condition:
      body()
  else:
    pl.when(condition)(body)


def not_(condition):
  return (not condition) if isinstance(condition, bool) else jnp.logical_not(condition)


def and_(a, b):
  if isinstance(a, bool) and isinstance(b, bool):
    return a and b
  if isinstance(a, bool):
    return b if a else False
  if isinstance(b, bool):
    return a if b else False
  return jnp.logical_and(a, b)


def rem(a, b):
  return a % b if isinstance(a, int) else lax.rem(a, b)


def div(a, b):
  if isinstance(a, int) and isinstance(b, int):
    return a // b
  return lax.div(jnp.asarray(a, jnp.int32), jnp.asarray(b, jnp.int32))


def chunk_kind(position, order):
  """(resident?, its resident index, its streamed index) of the chunk at a rolled chunk
  loop's ``position`` in ``order`` (``chunk_schedule``'s, one chunk a group; the i-th
  resident position holds resident chunk i). Python values where the plan fixes them
  (no resident or no streamed chunks), scalars otherwise."""
  resident_positions = [p for p, (kind, _) in enumerate(order) if kind == "resident"]
  if len(resident_positions) == len(order):
    return True, position, 0
  if not resident_positions:
    return False, 0, position
  hits = [position == p for p in resident_positions]
  resident = functools.reduce(jnp.logical_or, hits)
  index = sum((jnp.where(hit, i, 0) for i, hit in enumerate(hits)), jnp.int32(0))
  before = sum((jnp.where(p < position, 1, 0) for p in resident_positions), jnp.int32(0))
  return resident, index, position - before


def w2_transforms(itemsize: int, rank: int = 256):
  """A W2 tile's (or z's) shared-memory transforms: 8-row tiles one swizzle wide."""
  swizzle = row_swizzle(rank, itemsize)
  return (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))


def interpret_params():
  """Mosaic GPU's interpret mode (CPU), through its one private entry point."""
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
  return InterpretGPUParams()


def compiler_params(profile_space: int = 0, profile_dir: str | None = None):
  """Every kernel's compiler parameters: lane semantics, and Mosaic's on-device profiler
  where a lab overlay names a directory for its traces."""
  profile = (dict(profile_space=profile_space, profile_dir=profile_dir) if profile_dir
             else {})
  return plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane, **profile)
