"""The row kernel's launch description."""

from __future__ import annotations

import dataclasses

from wts_jax.pallas.mosaic_plan import MosaicPlan


@dataclasses.dataclass(frozen=True)
class RowSpec:
  plan: MosaicPlan
  batch: int
  steps: int
  greedy: bool
  spin_limit: int
  interpret: bool
  # Developer profiling (tools/profile_mosaic.py): when set, Mosaic's on-device profiler
  # records the kernel's named regions (``jax.named_scope``) into ``profile_dir``, with
  # room for ``profile_space`` regions per warpgroup (taken from shared memory).
  profile_dir: str = ""
  profile_space: int = 0
