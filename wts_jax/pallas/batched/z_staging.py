"""z's way into the batched kernel's WGMMAs: the gather (one bulk copy per batch row of
its token's W1 row, or of its table row, into a staging tile), then once per step a
register round trip into the swizzled WGMMA tile(s), where the head's update
(``head_update``) turns what was gathered into z.

Why the round trip: a bulk copy writes a row linearly, while the WGMMA reads a swizzled
tile, and a tensor-map copy cannot write one row of an 8-row swizzle tile. On N only the
batch rows are staged (``plan.staged_rows``), moved by Mosaic's shared-to-global copy
layout; on M the WGMMA layout's 64 rows. Warpgroup 0 (the leader) stages z and hands the
tile to warpgroup 1 through an mbarrier (``za_bar``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas import row_words

_WARPS = 4   # warps a warpgroup


class ZStaging:
  """The staging's part of ``kernel.BatchedWalk`` (a mixin over
  ``context.WalkContext``; ``self.update`` is the head's ``head_update.HeadUpdate``)."""

  def gather_z(self):
    """One bulk copy per row: W1 row ``tok_s[b]`` (int8 planes: the token's two planes,
    side by side) into staging row b. Rows >= B of a padded batch walk along on their
    own tokens; rows past ``rows`` stay zero. With ``plan.warp_gather`` warp w issues
    rows w, w + 4, ... (copies in warp semantics meet no warpgroup barrier). int8 planes:
    then each row's s_lo into ``row_scale_s``, by a thread of its own (interpreted, by
    scalar loads)."""
    refs = self.refs
    def gather_row(b):
      token = refs.tok_s[b]
      plgpu.copy_gmem_to_smem(refs.w1_g.at[pl.ds(token, 1)],
                              refs.z_s.at[pl.ds(b, 1), pl.ds(0, self.z_width)], refs.z_bar,
                              oob_mode=plgpu.OOBFillMode.PROMISE_IN_BOUNDS)
    if not self.plan.warp_gather:
      for b in range(self.gathered_rows):
        gather_row(b)
    else:
      @plgpu.warp_map
      def _(warp):
        for b in range(self.gathered_rows):
          gpu.when(warp == b % _WARPS, functools.partial(gather_row, b))
    if not self.planes:
      return
    if not self.spec.interpret:
      # After the copies' issue, so the loads' latency runs beside the copies'; stored
      # by their own threads (the staging's barrier orders them before its reads).
      row_words.load_row_words(refs.tok_s, refs.w1_scale_g, refs.row_scale_s, self.rows)
    else:
      self.store_row_scales([refs.w1_scale_g[refs.tok_s[b]] for b in range(self.rows)])

  def store_row_scales(self, scales):
    """Interpreted: each row's s_lo by scalar loads of its token's scale, stored for
    every warpgroup's ``row_plane_scale``."""
    per_row = None
    for b, scale in enumerate(scales):
      per_row = jnp.where(self.row_ids == b, scale, 0.0 if per_row is None else per_row)
    self.refs.row_scale_s[pl.ds(0, self.batch_width)] = per_row

  def row_plane_scale(self):
    """Each row's s_lo, as ``gather_z`` stored them."""
    return gpu.load(self.refs.row_scale_s.at[pl.ds(0, self.batch_width)],
                    self.per_batch_row, optimized=False)

  def zero_staging(self):
    """The leader's prologue: the staging rows no gather writes, the row scales no gather
    loads, and a split update's WGMMA tiles (the rows past the batch that no copy back
    writes) zeroed."""
    refs, plan = self.refs, self.plan
    if refs.z_s is not None:
      refs.z_s[:, pl.ds(0, self.z_width)] = jnp.zeros((plan.staged_rows, self.z_width),
                                                      refs.z_s.dtype)
    if self.planes:
      refs.row_scale_s[pl.ds(0, self.batch_width)] = plgpu.layout_cast(
          jnp.zeros((self.batch_width,), jnp.float32), self.per_batch_row)
    if plan.split:
      self.zero_tile(refs.za_s.at[0])
      self.zero_tile(refs.za_s.at[1])

  def first_z(self, given_first):
    """The leader's prologue: the first tokens (clamped) and the first gather."""
    first_tokens = jnp.clip(given_first, 0, self.vocab - 1)
    self.refs.tok_s[pl.ds(0, self.batch_width)] = first_tokens
    if self.planes:
      plgpu.commit_smem()   # each row's token stored before its own thread reads it
    self.gather_z()

  def stage_z(self, step):
    """The leader's start of a step: the gather awaited, the staged rows into the
    swizzled WGMMA tile(s) (``self.update.staging_tiles``), the head's update, ordered
    before the WGMMAs' async-proxy reads and handed to warpgroup 1."""
    refs = self.refs
    # (Loaded before the gather is waited for, so the latencies overlap.)
    preloaded = self.update.preload(step)
    plgpu.barrier_wait(refs.z_bar)
    for plane, tile_ref in enumerate(self.update.staging_tiles()):
      tile_ref[...] = gpu.load(refs.z_s.at[:, pl.ds(plane * self.rank, self.rank)],
                               self.z_layout)
    with jax.named_scope("update"):
      self.update.from_staging(step, preloaded)
    plgpu.commit_smem()
    with jax.named_scope("update"):
      self.update.from_tiles(step)
    if self.wgs > 1:
      plgpu.barrier_arrive(refs.za_bar)

  def staged_z(self, step):
    """z of the step in its WGMMA tile(s) for this warpgroup; int8 planes: each row's s_lo
    over the accumulator tile, else None."""
    with jax.named_scope("z_wait"):
      if self.wgs > 1:
        pl.when(self.leader)(functools.partial(self.stage_z, step))
        pl.when(jnp.logical_not(self.leader))(
            lambda: plgpu.barrier_wait(self.refs.za_bar))
      else:
        self.stage_z(step)
      if self.planes:
        return lax.broadcast_in_dim(self.row_plane_scale(), self.tile, (self.batch_axis,))
    return None
