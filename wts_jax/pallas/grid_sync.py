"""The grid-wide exchange of the persistent kernels: both backends' protocols and their
invariants, in one place.

Both kernels end each step the same way: every program (block) publishes its best
(score, index) per batch row, all meet at a grid barrier, and every one reduces all the
published pairs to the same token (ties to the lowest index) — no broadcast. The
backends differ in how the barrier counts and how the published slots are reused.

== The Triton kernel (``arrive_and_wait``) ==

Protocol, per walk step ``k`` (one fresh counter and one fresh slot row per step, so no
slot or counter is ever reused within a walk and nothing needs a reset between steps):

1. every program stores its candidates for step ``k`` into ``slots[k, :, p, :]`` with
   ordinary stores;
2. ``debug_barrier`` (``bar.sync``): all threads of the program have issued their stores;
3. one ``atomic_add(counters[k], 1)`` with acquire-release semantics at GPU scope:
   release is cumulative, so the whole program's stores from (1) are visible to any
   thread that later acquires this counter value;
4. spin with ``atomic_add(counters[k], 0)`` (an acquiring read) until it reaches
   ``num_programs`` or ``spin_limit`` polls have passed; on timeout the program records
   ``STATUS_SYNC_TIMEOUT`` and goes on (never hangs);
5. read all programs' slots for step ``k`` with ``volatile`` loads (they bypass L1, which
   is not coherent across SMs and may hold a line of a neighbouring slot row).

The split serial update (``plan.serial_update == "split"``) runs the same protocol a
second time per step, before the shard scan: slices of ``z`` (and of the rnn state) in
``serial[k]`` instead of candidates in ``slots[k]``, counter ``counters[K + k]``
instead of ``counters[k]``.

Invariants:
- ``counters`` is zero at launch (a zero-filled input aliased to an output) and
  ``counters[k]`` only grows, to exactly ``num_programs``;
- a program reads ``slots[k]`` only after observing ``counters[k] == num_programs``, and
  every increment of ``counters[k]`` happens after that program's slot stores;
- every program reduces the same ``num_programs`` slots with the same arithmetic, so all
  programs agree on the token without a broadcast.

Co-residency: the grid is at most the SM count and one program fits on an SM, so all
programs run at once when the kernel has the GPU to itself; the bounded spin turns any
violation (e.g. another kernel holding SMs) into a reported error instead of a hang.

In interpret mode (CPU) programs run one after another, so the walk runs with a single
program; the barrier then has nothing to wait for and is compiled out (``num_programs ==
1``), while the slot store → reduce path is the same code.

== The Mosaic GPU kernel (``signal_and_poll``; the Mosaic kernels) ==

One semaphore for the whole walk (``pl.get_global``: zero at launch) and two exchange
slot rows, used by parity: step ``k`` writes ``xv/xi[k % 2, b, block]``.

1. every block stores its (score, index) per batch row into parity ``k % 2``;
2. ``semaphore_signal(sem, 1)`` at GPU scope: a release, so (1) is visible to whoever
   acquires a later value;
3. poll ``semaphore_read(sem)`` until it reaches ``blocks · (k + 1)`` or ``spin_limit``
   polls have passed (then ``STATUS_SYNC_TIMEOUT``, never a hang);
4. read every block's pair of parity ``k % 2`` and reduce: plain loads, after this
   thread's last poll — an acquire (``ld.acquire``) that observed every signal, so the
   loads see the released pairs (an acquire leaves no stale L1 line behind it).

Invariants:
- the semaphore only grows and each block signals exactly once per step, so
  ``sem >= blocks · (k + 1)`` holds exactly when every block has published step ``k``:
  no block passes barrier ``k`` before the slowest has signalled it, hence no block
  is ever more than one step ahead of another;
- two parities suffice: a block writes parity ``k % 2`` again at step ``k + 2``, after
  passing barrier ``k + 1``, i.e. after every block signalled step ``k + 1`` — which each
  does only after its reads of step ``k``'s slots;
- the base logits use the same parity double buffer in shared memory (``base_s``):
  step ``k`` reads buffer ``k % 2`` after its TMA barrier, and issues step ``k + 1``'s
  copy into the other buffer only after ``commit_smem`` (the last step's generic-proxy
  reads of it ordered before the TMA's write);
- a ring slot is refilled (TMA) only after its chunk was consumed: after ``commit_smem``
  where the chunk was read into registers; a WGMMA's shared-memory reads have completed
  once its accumulator was read.

Interpret mode runs one block owning every chunk; the barrier is compiled out.

== The batched Mosaic kernel's keys (``publish_keys`` / ``collect_keys``) ==

Each step's per-row winner is reduced by the L2's atomics instead of by every block
reading every block's column: a row's candidate is one 64-bit key,
``orderable(score) << 32 | (2^32 - 1 - index)``, whose unsigned order is the candidates'
(higher score first, then the lower index); every block ``red.max``es its key into the
row's slot of this step, signals, polls (as above), and reads the one winning key per
row with a relaxed gpu-scope load, which no stale L1 line can answer.

Invariants:
- the slots are a ``pl.get_global`` buffer, zero at every launch, one per (step, row):
  never reused within a walk, and zero is below every key (orderable(-inf) > 0);
- a block reads step ``k``'s slots only after observing every block's signal of step
  ``k``, each signal following that block's ``red``s (a CTA barrier, then the release);
- the buffer is the kernel's first global allocation, so its slots are 8-byte aligned.

== The batched Mosaic kernel's split update (``signal_and_poll`` on its own semaphore) ==

A block owning units stores their z (the rnn head: and its state) as a hi + lo bf16 pair
into this step's rows of a global buffer (ordinary stores), then a CTA barrier, then the
signal; every block polls, then ``global_writes_to_bulk_copies`` (a proxy fence: the
acquired generic-proxy writes ordered before the async proxy's reads) and bulk-copies
(TMA) the pair into its swizzled WGMMA tiles.

Invariants:
- one buffer row per step, never reused within a walk: no block writes a row another may
  still be copying;
- a block copies step ``k``'s rows only after observing every block's signal of step
  ``k``, each following that block's stores; the rnn owners copy step ``k - 1``'s state
  rows, whose signals they observed at the previous step's barrier.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as pl_triton


def arrive_and_wait(counters_ref, step, *, num_programs: int, spin_limit: int,
                    zero) -> jax.Array:
  """Steps 2–4 above. Returns a bool: True when the wait timed out."""
  pl_triton.debug_barrier()
  pl_triton.atomic_add(counters_ref, step, zero + 1)

  def not_done(carry):
    polls, seen = carry
    return (seen < num_programs) & (polls < spin_limit)

  def poll(carry):
    polls, _ = carry
    return polls + 1, pl_triton.atomic_add(counters_ref, step, zero)

  _, seen = lax.while_loop(not_done, poll,
                           (zero, pl_triton.atomic_add(counters_ref, step, zero)))
  return seen < num_programs


def signal_and_poll(sem, participants, step, spin_limit):
  """The Mosaic kernel's barrier of step ``step`` (steps 2–3 of its protocol above):
  release this block's published pairs, then poll — bounded — until all
  ``participants`` have signalled this step. Returns 1 when ``spin_limit`` polls ran
  out, else 0."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  plgpu.semaphore_signal(sem, 1, memory_scope="gpu")   # release our pairs
  # Invariant: the semaphore counts every block's signals since launch (never reset),
  # so all participants have signalled step `step` exactly when it reaches this.
  target = participants * (step + 1)

  def waiting(state):
    polls, seen = state
    return jnp.logical_and(seen < target, polls < spin_limit)

  def poll(state):
    polls, _ = state
    return polls + 1, pl.semaphore_read(sem)

  _, seen = lax.while_loop(waiting, poll, (jnp.int32(0), pl.semaphore_read(sem)))
  return jnp.where(seen < target, 1, 0)


KEY_ROW_WORDS = 8   # 32 bits each: one 32-byte sector a row's slot, so rows spread over L2


def orderable_key(value, index):
  """(high, low) 32-bit words of a candidate's exchange key: unsigned order = higher
  ``value`` first, then the lower ``index`` (a NaN value is never a winner's)."""
  bits = jax.lax.bitcast_convert_type(value, jnp.uint32)
  high = jnp.where(bits >= jnp.uint32(1 << 31), ~bits, bits | jnp.uint32(1 << 31))
  return high, jnp.uint32(0xFFFFFFFF) - index.astype(jnp.uint32)


def key_index(low):
  """The index a key's low word holds."""
  return (jnp.uint32(0xFFFFFFFF) - low).astype(jnp.int32)


def row_slot_asm(body: str, keys_s, slots_g, rows: int,
                  slot_bytes: int = 4 * KEY_ROW_WORDS):
  """Inline PTX run by threads [0, rows) of the warpgroup, one row each: ``$0`` the row's
  high key word in shared memory (its low word one ``keys_s`` row on), ``$1`` the global
  buffer, ``g`` the row's slot in it (``slot_bytes`` a row)."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  from wts_jax.pallas.row_words import thread_and_addresses
  thread, (shared,), (slots,) = thread_and_addresses((keys_s,), (slots_g,))
  llvm.inline_asm(
      ir.Type.parse("!llvm.void"), [shared, slots, thread],
      "{ .reg .pred p; .reg .b32 hi, lo, sa; .reg .b64 key, g, off;\n"
      f"setp.lt.u32 p, $2, {rows};\n"
      "shl.b32 sa, $2, 2; add.u32 sa, sa, $0;\n"
      f"mul.wide.u32 off, $2, {slot_bytes}; add.u64 g, $1, off;\n"
      + body.format(low_offset=4 * ir.MemRefType(keys_s.type).shape[1]) + "}",
      "r,l,r", has_side_effects=True)


def publish_keys(keys_s, slots_g, rows: int):
  """``red.max`` the key of each of the first ``rows`` rows (``keys_s`` [2, >= rows] u32:
  high words, low words) into its slot of ``slots_g`` (this step's slots, KEY_ROW_WORDS
  words a row)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
  def publish(_, keys, slots):
    row_slot_asm("@p ld.shared.b32 hi, [sa]; @p ld.shared.b32 lo, [sa+{low_offset}];\n"
                  "mov.b64 key, {{lo, hi}};\n"
                  "@p red.relaxed.gpu.global.max.u64 [g], key;\n", keys, slots, rows)
  publish(keys_s, slots_g)


def collect_keys(slots_g, keys_s, rows: int):
  """Each row's winning key from its slot into ``keys_s`` (as ``publish_keys`` lays it
  out); a CTA barrier must follow before other threads read it."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
  def collect(_, keys, slots):
    row_slot_asm("@p ld.relaxed.gpu.global.b64 key, [g];\n"
                  "mov.b64 {{lo, hi}}, key;\n"
                  "@p st.shared.b32 [sa], hi; @p st.shared.b32 [sa+{low_offset}], lo;\n",
                  keys, slots, rows)
  collect(keys_s, slots_g)


def prefetch_candidate_rows(keys_s, table_g, rows: int, *, row_bytes: int, num_rows: int,
                            window: int = 1):
  """``cp.async.bulk.prefetch.L2`` of the ``table_g`` rows ([num_rows, row_bytes]) that
  each of the first ``rows`` candidates in ``keys_s`` (as ``publish_keys`` reads it)
  names: its row, or the ``window`` rows (a power of two) holding it, starting at a
  multiple of ``window`` and clamped into the table. The block holding a row's winner
  has what the next step gathers on its way to L2 while the grid barrier runs. A hint
  only: nothing waits for it."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  if row_bytes * window % 16 or window & (window - 1) or num_rows < window:
    raise ValueError(f"a bulk prefetch of {window} rows of {row_bytes} bytes from "
                     f"{num_rows}: whole 16 bytes and a power-of-two window within the "
                     "table")

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
  def prefetch(_, keys, table):
    row_slot_asm("@p ld.shared.b32 lo, [sa+{low_offset}];\n"
                  "not.b32 hi, lo;\n"
                  f"and.b32 hi, hi, 0x{-window & 0xFFFFFFFF:08X};\n"
                  f"min.u32 hi, hi, {num_rows - window};\n"
                  f"mul.wide.u32 off, hi, {row_bytes}; add.u64 g, $1, off;\n"
                  f"mov.b32 lo, {row_bytes * window};\n"
                  "@p cp.async.bulk.prefetch.L2.global [g], lo;\n",
                  keys, table, rows, slot_bytes=0)
  prefetch(keys_s, table_g)


def global_writes_to_bulk_copies():
  """``fence.proxy.async.global``: the global writes this thread has observed (its own,
  and other blocks' acquired at the barrier) ordered before its later bulk copies (TMA,
  the async proxy) read the same addresses — the split update's published pairs."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.inline_mgpu()
  def fence(_):
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [], "fence.proxy.async.global;", "",
                    has_side_effects=True)
  fence()
