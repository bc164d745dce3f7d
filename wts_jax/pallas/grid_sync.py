"""The grid-wide exchange of the persistent kernel (Pallas Triton backend).

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
"""

from __future__ import annotations

import jax
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
