"""A phase of the stacked kernel: the warpgroups serving one block of requests over one
share of the block's W2 tiles (every ``phases``-th). Its resident tiles stay in shared
memory for the walk, the rest stream through its own ring (FIFO across steps), streamed
and resident tiles alternating; per tile one WGMMA of the stacked planes against the
tile, the next tile's base logits fetched under it, then the fold into each request's
running best; per step the bests to shared memory and (phase 0's leader) the exchange."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas.stacked import bests, fold, operands
from wts_jax.pallas.stacked.plan import NARROW_MMA_ROWS, WARPGROUPS
from wts_jax.pallas.stacked.threads import REQUESTS, TILE, row_array


class Phase:
  """Phase ``p`` of ``walk`` (a ``kernel.StackedWalk``), built inside its warpgroups'
  branch."""

  def __init__(self, walk, p: int):
    plan = walk.plan
    self.walk, self.p = walk, p
    self.order = plan.order(p)
    self.res, self.streamed, self.base_slot = plan.resident[p], plan.streamed(p), plan.slot_base(p)
    self.issuer = walk.wg == p   # the phase's warpgroup of request block 0 issues its copies
    self.shared_ring = plan.request_blocks > 1
    self.count = len(self.order)
    # The base logits' L2 prefetch (``prefetch_base``): by the last warpgroup.
    self.prefetches = walk.lab.prefetch_base and not walk.interpret and p == walk.phases - 1

  def ring_slot(self, entry):
    stages = self.walk.stages
    return lax.rem(entry, stages) if stages > 1 else 0

  def streamed_before(self, position):
    """Streamed tiles among the phase's first ``position`` (``plan.order``'s rule)."""
    if not self.streamed:
      return 0
    return jnp.where(position == 0, 0, ((position - 1) * self.streamed) // self.count + 1)

  def position_of(self, j):
    """The position of the phase's j-th streamed tile."""
    return (j * self.count + self.streamed - 1) // self.streamed

  def copy_entry(self, entry):
    """Ring entry ``entry`` (its slot ``entry % stages``): the phase's
    ``entry % streamed``-th streamed tile (of step ``entry // streamed``)."""
    walk = self.walk
    slot = self.ring_slot(entry)
    walk.copy_tile(self.p + self.position_of(entry % self.streamed) * walk.phases,
                   self.base_slot + self.res + slot, walk.ring_bar.at[self.p * walk.stages + slot])

  def prologue(self):
    """The issuer's: the resident tiles and the ring's first entries."""
    walk = self.walk
    for k, (tile, _, _) in enumerate(t for t in self.order if not t[1]):
      walk.copy_tile(tile, self.base_slot + k, walk.res_bar.at[self.base_slot + k])
    for entry in range(min(walk.stages, self.streamed * walk.steps)):
      self.copy_entry(entry)

  def prefetch(self, step, due=None):
    walk = self.walk
    mine = walk.wg == WARPGROUPS - 1
    pl.when(mine if due is None else jnp.logical_and(mine, due))(
        lambda: operands.prefetch_base(walk.base_g, step, walk.block, tiles=walk.tiles,
                                       vocab=walk.vocab, batch=walk.batch))

  def base_of(self, ordinal):
    """The base logits of the phase's ``ordinal``-th tile of the walk (past the walk, of
    its last step: a valid, unused load; by TMA: none): loaded, or (async copies) copied
    into that ordinal's slot, the slot returned."""
    walk, count, phases = self.walk, self.count, self.walk.phases
    base_slots, steps = walk.base_slots, walk.steps
    step = jnp.minimum(lax.div(ordinal, count), steps - 1)   # (ordinal >= 0)
    tile = self.p + lax.rem(ordinal, count) * phases
    with jax.named_scope("base"):
      if base_slots and walk.no_base:   # (timing only: the slots read as they are)
        return None if walk.by_tma else row_array(lax.rem(ordinal, base_slots))
      if walk.by_tma:
        slot = walk.wg * base_slots + lax.rem(ordinal, base_slots)
        start_at = walk.start(tile)
        for rb in range(walk.plan.request_blocks):   # (each block's live rows, static)
          rows = min(REQUESTS, walk.batch - rb * REQUESTS)
          due = jnp.logical_and(ordinal < steps * count, lax.div(walk.wg, phases) == rb)
          pl.when(due)(functools.partial(
              plgpu.copy_gmem_to_smem,
              walk.base_g.at[pl.ds(rb * REQUESTS, rows), step, pl.ds(start_at, TILE)],
              walk.base_s.at[slot, pl.ds(0, rows)], walk.base_bar.at[slot]))
        return None
      if base_slots:
        return operands.copy_base(walk.base_g, walk.base_s, lax.rem(ordinal, base_slots), step,
                                  walk.block, tile, tiles=walk.tiles, vocab=walk.vocab,
                                  batch=walk.batch, phases=phases, slots=base_slots,
                                  rotate=walk.rotate,
                                  thread_rows=walk.spec.w2_order == "thread_rows")
      return operands.load_base(walk.base_g, step, walk.block, tile, tiles=walk.tiles,
                                vocab=walk.vocab, batch=walk.batch, phases=phases, wg=walk.wg,
                                interpret=walk.interpret, loads=not walk.no_base,
                                rotate=walk.rotate)

  def run(self):
    """The phase's walk: its prologue, the first tiles' base logits (async copies:
    ``copies_ahead`` of them), every step, the status."""
    walk = self.walk

    @pl.when(self.issuer)
    @jax.named_scope("prologue")
    def _():
      self.prologue()

    if self.prefetches:
      self.prefetch(0)
    if walk.by_tma and walk.partly_filled:
      operands.zero_unread_rows(walk.base_s, batch=walk.batch, phases=walk.phases,
                                slots=walk.base_slots, rotate=walk.rotate)
    first = self.base_of(0)
    for ordinal in range(1, walk.copies_ahead):
      self.base_of(ordinal)
    flags, _ = lax.fori_loop(0, walk.steps, self.step,
                             (jnp.int32(0), row_array(0) if walk.by_tma else first))
    if walk.base_slots and not walk.by_tma:   # (copies issued past the walk land before exit)
      operands.wait_copies()
    walk.write_status(flags)

  def step(self, step, carry):
    """One step: the tokens awaited, z's planes gathered, every tile of the phase, the
    bests stored, and (phase 0) the exchange. ``pending``: the base logits of the
    step's first tile, loaded (into registers) before the last step's exchange; each
    tile's next are loaded under its WGMMA."""
    walk = self.walk
    spec, wg = walk.spec, walk.wg
    flags, pending = carry
    with jax.named_scope("tok_wait"):
      @pl.when(jnp.logical_not(walk.leader))
      def _():
        plgpu.barrier_wait(walk.tok_bar)
    if self.prefetches:
      self.prefetch(step + 1, step + 1 < walk.steps)
    with jax.named_scope("gather"):
      a, s_lo = operands.gather(walk.tok_s, walk.w1_g, walk.s_lo_g, rank=walk.rank,
                                phases=walk.phases, wg=wg, interpret=walk.interpret,
                                fragment_order=spec.w1_order == "fragments",
                                rotate=walk.rotate)
    if walk.interpret:   # (interpreted, a WGMMA reads no registers: the tile)
      walk.interpreted[0][wg] = a
      a = walk.interpreted[0].at[wg]
    sampled = None if spec.greedy else fold.sampling_state(
        *walk.sampling_g, step, rows=walk.batch, row_offset=spec.row_offset,
        phases=walk.phases, wg=wg, interpret=walk.interpret, rotate=walk.rotate)

    @pl.when(step == 0)
    @jax.named_scope("first_wait")
    def _():
      plgpu.barrier_wait(walk.scale_bar)
      for k in range(self.res):   # (a barrier a resident tile: phases hold unequal counts)
        plgpu.barrier_wait(walk.res_bar.at[self.base_slot + k])

    best, pending = lax.fori_loop(
        0, self.count, functools.partial(self.tile, step, a, s_lo, sampled),
        (fold.initial_best(walk.interpret), pending))
    with jax.named_scope("bests"):
      bests.store_bests(best, walk.best_value_s, walk.best_index_s, walk.best_nan_s, wg=wg,
                        interpret=walk.interpret, rotate=walk.rotate)
    plgpu.barrier_arrive(walk.step_bar)
    if self.p:
      return flags, pending
    with jax.named_scope("exchange"):
      flags = lax.cond(walk.leader, functools.partial(walk.exchange, step), lambda f: f,
                       flags)
    return flags, pending

  def tile(self, step, a, s_lo, sampled, position, carry):
    """One tile: its WGMMA, the next tile's base logits loaded under it, its streamed
    slot refilled, its logits folded into the running best."""
    walk, p, streamed = self.walk, self.p, self.streamed
    stages, base_slots, by_tma = walk.stages, walk.base_slots, walk.by_tma
    best, pending = carry
    before = self.streamed_before(position)
    tile = p + position * walk.phases
    entry = step * streamed + before
    slot = self.ring_slot(entry)
    if streamed:
      is_streamed = self.streamed_before(position + 1) > before
      with jax.named_scope("ring_wait"):
        pl.when(is_streamed)(lambda: plgpu.barrier_wait(walk.ring_bar.at[p * stages + slot]))
      w_index = jnp.where(is_streamed, self.base_slot + self.res + slot,
                          self.base_slot + position - before)
    else:
      w_index = self.base_slot + position

    def product(acc_ref):
      if walk.lab.timing_ablation != "mma":
        with jax.named_scope("mma"):
          tile_rows = (walk.w_s.at[w_index, pl.ds(0, NARROW_MMA_ROWS)] if walk.narrow
                       else walk.w_s.at[w_index])
          plgpu.wgmma(acc_ref, a, tile_rows.T)
      # The next tile's (the next step's first after the last), or with async copies
      # the one ``copies_ahead`` on (by TMA: once the WGMMA is done).
      upcoming = None if by_tma else self.base_of(step * self.count + position
                                                  + walk.copies_ahead)
      with jax.named_scope("mma_wait"):
        return plgpu.wgmma_accumulator_load(acc_ref), upcoming
    acc, upcoming = pl.run_scoped(
        product, plgpu.ACC((2 * REQUESTS, NARROW_MMA_ROWS if walk.narrow else TILE),
                           jnp.int32))
    if by_tma:
      self.base_of(step * self.count + position + walk.copies_ahead)
    if streamed:   # the slot read (its WGMMA waited for): refill it
      self.refill_after(entry, slot, is_streamed)
    pending = self.tile_base(step, position, pending)
    with jax.named_scope("fold"):
      best = fold.fold_tile(
          acc, pending, s_lo, walk.scale_s.at[tile], best, walk.start(tile),
          interpret=walk.interpret,
          column_pairs=1 if walk.lab.timing_ablation == "fold" else None,
          base_s=walk.base_s, slots=base_slots, copies_pending=walk.copies_ahead,
          tma_slots=by_tma, rotate=walk.rotate, live_rows=walk.live_rows,
          phases=walk.phases, sampled=sampled,
          pairs=(0, NARROW_MMA_ROWS // 8) if walk.narrow else (0, TILE // 8),
          thread_rows=walk.spec.w2_order == "thread_rows",
          vector_reads=walk.lab.base_vector_reads)
    return best, pending if by_tma else upcoming

  def refill_after(self, entry, slot, is_streamed):
    """A streamed tile's slot read (its WGMMA waited for): released by this warpgroup
    where two share the ring, refilled by the issuer with the entry ``stages`` on."""
    walk, p, stages = self.walk, self.p, self.walk.stages
    total = walk.steps * self.streamed
    refill_due = jnp.logical_and(is_streamed, entry + stages < total)
    refill_now = jnp.logical_and(
        is_streamed, jnp.logical_and(entry >= 0, entry + stages < total))

    def refill():
      if self.shared_ring:
        with jax.named_scope("free_wait"):
          plgpu.barrier_wait(walk.free_bar.at[p * stages + self.ring_slot(entry)])
      self.copy_entry(entry + stages)
    if self.shared_ring:   # (only where a refill follows: no arrival left unobserved)
      pl.when(refill_due)(functools.partial(
          plgpu.barrier_arrive, walk.free_bar.at[p * stages + slot]))
    with jax.named_scope("refill"):
      pl.when(jnp.logical_and(self.issuer, refill_now))(refill)

  def tile_base(self, step, position, pending):
    """The tile's base logits for the fold: its slot (by TMA: its copy waited for), or
    without slots the registers loaded a tile ahead."""
    walk, base_slots = self.walk, self.walk.base_slots
    if not base_slots:
      return pending
    slot_now = lax.rem(step * self.count + position, base_slots)
    slot_base = row_array(slot_now)
    if walk.by_tma and not walk.no_base:
      with jax.named_scope("base_wait"):
        plgpu.barrier_wait(walk.base_bar.at[walk.wg * base_slots + slot_now])
    return slot_base
