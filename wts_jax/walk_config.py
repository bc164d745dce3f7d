"""The kernels' options: one frozen, validated config a kernel (``TritonConfig``,
``MosaicRowConfig``, ``MosaicBatchedConfig``, ``MosaicStackedConfig``).

``walk(..., impl=..., config=...)`` takes ``None`` (every option from the device's tuned
table, else the kernel's planner) or one kernel's config, which names that kernel. A
field left ``None`` (or ``"auto"``) is the planner's choice.
"""

from __future__ import annotations

import dataclasses
import numbers

RESIDENCY_MODES = ("auto", "full", "none")
MOSAIC_GEMVS = ("auto", "registers", "wgmma")
# Where the batched kernel widens an int8 W2 that z meets in bf16 (``BatchedPlan``).
W2_WIDENINGS = ("xla", "registers", "smem")
MOSAIC_W2_WIDENINGS = ("auto",) + W2_WIDENINGS   # (a config's: "auto", the planner's)
# When the batched kernel refills a streamed W2 chunk's ring slot (``BatchedSpec``).
RING_REFILLS = ("after_epilogue", "before_epilogue")
TRITON_SERIAL_UPDATES = ("auto", "split", "redundant")
BATCHED_SERIAL_UPDATES = ("auto", "split", "redundant", "table")
STATUS_FORMS = (None, "flags", "kernel")
DEFAULT_SPIN_LIMIT = 1 << 22


def check_residency(residency) -> None:
  if isinstance(residency, str):
    if residency not in RESIDENCY_MODES:
      raise ValueError(f"residency={residency!r} must be one of {RESIDENCY_MODES}, "
                       "a fraction in [0, 1] or a row count")
  elif isinstance(residency, bool) or not isinstance(residency, numbers.Real):
    raise TypeError(f"residency={residency!r} must be a mode, a fraction or a row count")
  elif isinstance(residency, numbers.Integral):
    if residency < 0:
      raise ValueError(f"residency={residency} rows must be >= 0")
  elif not 0.0 <= float(residency) <= 1.0:
    raise ValueError(f"residency={residency} as a fraction must be in [0, 1]")


def resident_units(residency, units: int, unit_rows: int) -> int | None:
  """The one translation of ``residency`` into a count of resident units (Triton tiles,
  Mosaic chunks) out of a program's ``units`` of ``unit_rows`` rows each; None for
  ``"auto"``, which each planner fills with its own measured default."""
  if residency == "auto":
    return None
  if residency == "full":
    return units
  if residency == "none":
    return 0
  if isinstance(residency, float):
    return int(round(residency * units))
  return min(units, -(-int(residency) // unit_rows))   # a row count per program


def _check_launch(config) -> None:
  """What every kernel's config shares: the persistent grid and the barrier's bound."""
  if config.sync_spin_limit < 1:
    raise ValueError(f"sync_spin_limit={config.sync_spin_limit} must be >= 1")
  blocks = getattr(config, "num_blocks", getattr(config, "num_programs", None))
  if blocks is not None and blocks < 1:
    name = "num_blocks" if hasattr(config, "num_blocks") else "num_programs"
    raise ValueError(f"{name}={blocks} must be >= 1")


def _check_one_of(**values) -> None:
  """Each ``name=(value, allowed)`` named when ``value`` is not one of ``allowed``."""
  for name, (value, allowed) in values.items():
    if value not in allowed:
      raise ValueError(f"{name}={value!r} must be one of {allowed}")


def _check_at_least(least: int, **values) -> None:
  for name, value in values.items():
    if value is not None and value < least:
      raise ValueError(f"{name}={value} must be >= {least}")


@dataclasses.dataclass(frozen=True)
class TritonConfig:
  """The Triton kernel's options (``impl="triton"``); None: the planner's choice.

  residency: how much of each program's W2 shard stays in registers for the whole walk:
    ``"auto"`` (as much as the register budget holds), ``"full"`` (all of it, or an
    error), ``"none"`` (stream every step), a fraction in [0, 1], or a row count.
  num_programs: the persistent grid (default: one program per SM).
  interpret: run the kernel's code in Pallas interpret mode (CPU tests).
  sync_spin_limit: polls of the grid barrier before the kernel reports
    ``STATUS_SYNC_TIMEOUT`` instead of hanging.
  tile_rows, num_warps, num_stages: the GEMV tile, warps per program, pipeline stages.
  serial_update: the gated/rnn serial update "split" over the programs (a second grid
    barrier per step), "redundant" (every program computes all of it), or "auto"
    (split; see ``pallas.plan.serial_split``).
  """

  residency: str | float | int = "auto"
  num_programs: int | None = None
  interpret: bool = False
  sync_spin_limit: int = DEFAULT_SPIN_LIMIT
  tile_rows: int | None = None
  num_warps: int | None = None
  num_stages: int | None = None
  serial_update: str = "auto"

  def __post_init__(self):
    check_residency(self.residency)
    _check_launch(self)
    _check_one_of(serial_update=(self.serial_update, TRITON_SERIAL_UPDATES))
    _check_at_least(1, num_stages=self.num_stages)
    if self.tile_rows is not None and (self.tile_rows < 16 or
                                       self.tile_rows & (self.tile_rows - 1)):
      raise ValueError(f"tile_rows={self.tile_rows} must be a power of two >= 16")
    if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16, 32):
      raise ValueError(f"num_warps={self.num_warps} must be a power of two <= 32")


@dataclasses.dataclass(frozen=True)
class MosaicRowConfig:
  """The Mosaic row kernel's options (``impl="mosaic_row"``, ``pallas/row``: 64 W2 rows
  on the WGMMA's M, up to 4 batch rows on N); None: the planner's choice.

  residency: how many of each block's 64-row W2 chunks stay in shared memory
    (``"auto"``: all when they fit, else the measured split of 2 resident chunks beside
    a 2-slot ring; otherwise as for ``TritonConfig``).
  num_blocks: the persistent grid (default: one block per SM).
  interpret, sync_spin_limit: as for ``TritonConfig``.
  ring_stages: slots of the TMA ring that streams the other chunks.
  gemv: how a chunk meets z: "registers" (an fp32 GEMV in registers), "wgmma" (a
    tensor-core WGMMA, 64 x 8B x r, bf16 operands, fp32 accumulation; exact for the
    vanilla head, whose z is a bf16 row of W1), or "auto" (wgmma where it applies).
  group: with the WGMMA GEMV, chunks whose WGMMAs are issued before one wait (a
    streamed group needs as many ring slots).
  snake: stream odd steps' chunks in reverse, so each step starts on what the last one
    read last (still in the L2); False streams every step forward.
  resident_group: with the WGMMA GEMV, on-chip chunks whose WGMMAs are issued before
    one wait (they hold no ring slot).
  register_chunks: an int8 W2 whose z meets it as two int8 planes only: chunks of each
    block's shard held in registers for the whole walk (the WGMMA's A operand).
  """

  residency: str | float | int = "auto"
  num_blocks: int | None = None
  interpret: bool = False
  sync_spin_limit: int = DEFAULT_SPIN_LIMIT
  ring_stages: int | None = None
  gemv: str = "auto"
  group: int | None = None
  snake: bool = True
  resident_group: int | None = None
  register_chunks: int = 0

  def __post_init__(self):
    check_residency(self.residency)
    _check_launch(self)
    _check_one_of(gemv=(self.gemv, MOSAIC_GEMVS))
    _check_at_least(1, group=self.group, resident_group=self.resident_group)
    _check_at_least(0, register_chunks=self.register_chunks, ring_stages=self.ring_stages)


@dataclasses.dataclass(frozen=True)
class MosaicBatchedConfig:
  """The Mosaic batched kernel's options (``impl="mosaic_batched"``,
  ``pallas/batched``: up to 64 batch rows a launch on the WGMMA's M or N, every
  head); None or "auto": the planner's choice (``batched/auto``'s ``auto_*``).

  residency, num_blocks, interpret, sync_spin_limit, ring_stages, snake: as for
    ``MosaicRowConfig`` (the counts a warpgroup's).
  base_stages: the base-logit ring's slots (at most a warpgroup's chunks).
  batch_axis: "m" (the batch on the WGMMA's M, a chunk the B operand), "n" (a chunk the
    A operand, the batch on N; jax >= 0.11).
  warpgroups: computing warpgroups a block (1 or 2), each its own half of the chunks.
  producer: one more warpgroup that issues every W2 and base refill once the computing
    warpgroups release the slot.
  serial_update: the gated and rnn heads' update: "split" (each block a slice of the
    update's units, published to the others through global memory and a second grid
    barrier a step), "redundant" (gated only: every block computes the whole gate from
    G_e streamed through its ring), "table" (the batch on N: each row's gate term
    gathered from the gated head's gate table, ``wts_jax.with_gate_table``, or the rnn
    head's J_e e from its joint table, ``wts_jax.with_joint_table``, up to 16 rows, one
    warpgroup: no second barrier) or "auto".
  merge_tiles: two computing warpgroups on N: the second hands its per-element bests to
    the first unreduced, which reduces both once a step.
  w2_widening: an int8 W2 that z meets in bf16 (quantized without planes): "xla" (a
    bf16 copy before each launch), "registers" (the int8 chunk streamed and converted
    into the WGMMA's A operand; the batch on N), "smem" (converted into a bf16 tile in
    shared memory the WGMMA reads; either axis; what interpret mode runs) or "auto".
  status: where the walk's status is reduced: "flags" (a word a warpgroup, OR-reduced
    by an XLA op after the launch) or "kernel" (in the kernel, through a zeroed global
    counter a status bit: no op after the launch).
  ring_refill: when a streamed W2 chunk's ring slot is refilled (or released to the
    producer): "after_epilogue" (once the chunk's logits are folded) or
    "before_epilogue" (as soon as its accumulator is read; not with an int8 W2 widened
    in the kernel, whose threads read the slot).
  """

  residency: str | float | int = "auto"
  num_blocks: int | None = None
  interpret: bool = False
  sync_spin_limit: int = DEFAULT_SPIN_LIMIT
  ring_stages: int | None = None
  snake: bool = True
  base_stages: int | None = None
  batch_axis: str | None = None
  warpgroups: int | None = None
  producer: bool | None = None
  serial_update: str = "auto"
  merge_tiles: bool | None = None
  w2_widening: str = "auto"
  status: str | None = None
  ring_refill: str | None = None

  def __post_init__(self):
    check_residency(self.residency)
    _check_launch(self)
    _check_one_of(batch_axis=(self.batch_axis, (None, "m", "n")),
                  warpgroups=(self.warpgroups, (None, 1, 2)),
                  producer=(self.producer, (None, True, False)),
                  merge_tiles=(self.merge_tiles, (None, True, False)),
                  serial_update=(self.serial_update, BATCHED_SERIAL_UPDATES),
                  w2_widening=(self.w2_widening, MOSAIC_W2_WIDENINGS),
                  status=(self.status, STATUS_FORMS),
                  ring_refill=(self.ring_refill, (None,) + RING_REFILLS))
    _check_at_least(1, base_stages=self.base_stages)
    _check_at_least(0, ring_stages=self.ring_stages)


@dataclasses.dataclass(frozen=True)
class MosaicStackedConfig:
  """The Mosaic stacked kernel's options (``impl="mosaic_stacked"``, ``stacked_walk``:
  the vanilla head's int8 W2 met by z as two int8 planes stacked on the WGMMA's M, up to
  64 rows a launch); None: the planner's choice.

  num_blocks, interpret, sync_spin_limit: as for ``MosaicRowConfig``.
  ring_stages: slots a phase's ring (None: one at B <= 32, else two, or one with the
    base logits by TMA).
  status: as for ``MosaicBatchedConfig`` (None: "kernel").
  """

  num_blocks: int | None = None
  interpret: bool = False
  sync_spin_limit: int = DEFAULT_SPIN_LIMIT
  ring_stages: int | None = None
  status: str | None = None

  def __post_init__(self):
    _check_launch(self)
    _check_one_of(status=(self.status, STATUS_FORMS))
    _check_at_least(0, ring_stages=self.ring_stages)


# The configs a walk takes (``walk(..., config=...)``), one a kernel.
KERNEL_CONFIGS = (TritonConfig, MosaicRowConfig, MosaicBatchedConfig, MosaicStackedConfig)
KernelConfig = TritonConfig | MosaicRowConfig | MosaicBatchedConfig | MosaicStackedConfig
