"""The GPU's clock read from inside a compiled program, ordered after given arrays.

The decode loop times its own iterations (TableTune's live cost correction) without
leaving the device: a host callback every iteration would stall the GPU on the host and
time the callback too. ``stamp(*deps)`` is a one-thread Mosaic GPU kernel that reads the
global timer (``%globaltimer``, nanoseconds, the clock jax's Mosaic GPU profiler reads)
and takes ``deps`` as operands it never touches: XLA cannot run it before the kernels
that produce them, and on the GPU's one compute stream it runs before whatever comes
after it in the program. A loop stamps at the same point of every iteration, fed by what
the iteration produced, carries the stamp in its state, and
``elapsed_seconds(previous, current)`` is the iteration's device time, launch gaps
included.

The stamp is a pair of uint32 words (low, high) rather than one int64, so it needs no
``jax_enable_x64``. XLA may merge two stamps of the very same operands (the kernel
declares no side effect): give each stamp what its own work produced. Mosaic GPU only:
``available()`` is False elsewhere (the CPU, interpret mode), where a loop passes NaN
seconds; the GPU modules are imported when a stamp is built.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

STAMP_WORDS = 2    # (low, high) uint32 words of the nanosecond timer


def available() -> bool:
  """Whether ``stamp`` can run here: the default backend is a GPU and Mosaic GPU's Pallas
  frontend imports."""
  if jax.default_backend() != "gpu":
    return False
  try:
    from jax.experimental.pallas import mosaic_gpu  # noqa: F401
  except ImportError:
    return False
  return True


def _timer_kernel(*refs):
  """Thread 0 stores the global timer's 64 bits as two 32-bit words into ``refs[-1]``;
  the other refs (the dependencies) are never read."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from wts_jax.pallas.row_words import thread_and_addresses

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
  def read_timer(_, out):
    thread, _, (out_at,) = thread_and_addresses(global_refs=(out,))
    llvm.inline_asm(
        ir.Type.parse("!llvm.void"), [out_at, thread],
        "{ .reg .pred p; .reg .b64 t; .reg .b32 lo, hi;\n"
        "setp.eq.u32 p, $1, 0;\n"
        "mov.u64 t, %globaltimer;\n"
        "mov.b64 {lo, hi}, t;\n"
        "@p st.global.v2.u32 [$0], {lo, hi};\n}",
        "l,r", has_side_effects=True)
  read_timer(refs[-1])


def _operand(leaf) -> jax.Array:
  """A dependency as a kernel operand: at least one dimension, no booleans (a bool
  array's cast to int8 is computed from it, so the order holds)."""
  leaf = jnp.atleast_1d(jnp.asarray(leaf))
  return leaf.astype(jnp.int8) if leaf.dtype == jnp.bool_ else leaf


def stamp(*deps) -> jax.Array:
  """uint32 [2]: the GPU's global timer (ns; low word, high word), read after every array
  in ``deps`` (pytrees of arrays) has been computed. Inside ``jit`` / a ``while_loop``
  body; raises ValueError where ``available()`` is False."""
  if not available():
    raise ValueError(f"stamp: the device clock needs a GPU (default backend: "
                     f"{jax.default_backend()!r}); check device_clock.available() first")
  from jax.experimental.pallas import mosaic_gpu as plgpu
  operands = [_operand(leaf) for leaf in jax.tree.leaves(deps)]
  read = plgpu.kernel(
      _timer_kernel, out_type=jax.ShapeDtypeStruct((STAMP_WORDS,), jnp.uint32),
      kernel_name="device_clock_stamp",
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Lane))
  return read(*operands)


def stamp_between(*deps):
  """``(*deps, stamp)``: the clock read after ``deps`` are computed, and ``deps`` back
  through an optimization barrier with the stamp, so whatever uses the returned arrays
  runs after the read. (A bare ``stamp(x)`` only follows ``x``: XLA may schedule it as
  late as it likes, e.g. after later work that never reads it.)"""
  now = stamp(*deps)
  return jax.lax.optimization_barrier((*deps, now))


def elapsed_seconds(earlier, later) -> jax.Array:
  """float32: the seconds from stamp ``earlier`` to stamp ``later`` (either may be a
  batch of stamps, [..., 2]), to float32's precision (a nanosecond at 16 ms)."""
  earlier, later = jnp.asarray(earlier, jnp.uint32), jnp.asarray(later, jnp.uint32)
  low = later[..., 0] - earlier[..., 0]              # modulo 2^32
  borrow = (later[..., 0] < earlier[..., 0]).astype(jnp.uint32)
  high = later[..., 1] - earlier[..., 1] - borrow
  high = jax.lax.bitcast_convert_type(high, jnp.int32)
  signed_low = jax.lax.bitcast_convert_type(low, jnp.int32)
  # Within +-2.1 s the low word alone is the signed difference (no float32 sum of a
  # 2^32-sized term and a small one); beyond, the high word counts 2^32 ns.
  fits = high == jnp.where(signed_low < 0, -1, 0)
  nanoseconds = jnp.where(fits, signed_low.astype(jnp.float32),
                          high.astype(jnp.float32) * jnp.float32(2.0 ** 32)
                          + low.astype(jnp.float32))
  return nanoseconds * jnp.float32(1e-9)
