"""The head's update in the batched kernel: how the leader turns each step's gathered rows
into z in the WGMMA tile(s). This base class is the vanilla head's (z = e, a W1 row, or
its two int8 planes, copied into the tiles as gathered); each other head's strategy is a
module of its own:

- ``update_redundant_gate``: the gated head, every block computing the whole gate from
  G_e streamed through the leader's W2 ring;
- ``update_gate_table``: the gated head from its gate table (each token's e and G_e e
  gathered), elementwise;
- ``update_joint_table``: the rnn head from its joint table (each token's J_e e
  gathered), the state kept in fp32 by every block, J_s s published by its owners;
- ``update_split``: the gated or rnn head's update split over the blocks by units, z (and
  the rnn state) published and read back after a second grid barrier.

``kernel.head_update`` picks the strategy a plan asks for.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import mosaic_gpu as plgpu


class HeadUpdate:
  """The vanilla head's update: none (z = e). Each method is a hook of
  ``z_staging.ZStaging.stage_z`` or of the prologue."""

  # Whether the leader copies rows of the head's weights into shared memory once, in the
  # prologue (``resident_rows``).
  has_resident_rows = False

  def __init__(self, walk):
    self.walk = walk

  def staging_tiles(self):
    """The WGMMA tiles the staged rows are copied into, a rank-wide slice each."""
    walk = self.walk
    return walk.plane_tiles() if walk.planes else [walk.refs.za_s]

  def preload(self, step):
    """What the update loads before the gather is waited for (its latency overlaps)."""
    del step
    return None

  def from_staging(self, step, preloaded):
    """The update's elementwise part, from the staged rows (before the tiles are ordered
    for the WGMMAs)."""
    del step, preloaded

  def from_tiles(self, step):
    """The update's WGMMA part, from the staged tiles."""
    del step

  def copy_resident_rows(self, first_unit):
    """The prologue's copies of this block's rows of the head's weights (units
    [first_unit, first_unit + update_units)), arriving on ``update_w_bar``."""
    del first_unit

  def resident_rows(self):
    """The leader's prologue: this block's rows of the update's weights (clamped: a
    block owning none reads the last ones), awaited."""
    walk = self.walk
    plan, refs = walk.plan, walk.refs
    units = plan.update_units
    first_unit = jnp.minimum(walk.block * units, walk.rank - units)
    self.copy_resident_rows(first_unit)
    if plan.split:
      refs.update_flag_s[0] = jnp.int32(0)
    plgpu.barrier_wait(refs.update_w_bar)

