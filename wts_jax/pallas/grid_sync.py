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

== The Mosaic GPU kernel (``signal_and_poll``; ``mosaic_walk``) ==

One semaphore for the whole walk (``pl.get_global``: zero at launch) and two exchange
slot rows, used by parity: step ``k`` writes ``xv/xi[k % 2, b, block]``.

1. every block stores its (score, index) per batch row into parity ``k % 2``;
2. ``semaphore_signal(sem, 1)`` at GPU scope: a release, so (1) is visible to whoever
   acquires a later value;
3. poll ``semaphore_read(sem)`` until it reaches ``blocks · (k + 1)`` or ``spin_limit``
   polls have passed (then ``STATUS_SYNC_TIMEOUT``, never a hang);
4. read every block's pair of parity ``k % 2`` with unoptimised (uncached) loads and
   reduce.

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
