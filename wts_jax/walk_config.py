"""The kernels' options: ``TritonConfig`` and ``MosaicConfig`` (frozen, validated), and
``WalkConfig``, the older all-in-one spelling kept working on top of them.

``walk(..., impl=..., config=...)`` takes ``None`` (every option from the tuned table or
the planner), a backend's own config (which names that backend), or a ``WalkConfig``.
"""

from __future__ import annotations

import dataclasses
import numbers

RESIDENCY_MODES = ("auto", "full", "none")
BACKENDS = ("auto", "mosaic", "triton")
MOSAIC_GEMVS = ("auto", "registers", "wgmma")
MOSAIC_KERNELS = ("auto", "rows", "batched", "stacked")
# Where the batched kernel widens an int8 W2 that z meets in bf16 (``BatchedPlan``).
W2_WIDENINGS = ("xla", "registers", "smem")
MOSAIC_W2_WIDENINGS = ("auto",) + W2_WIDENINGS   # (a config's: "auto", the planner's)
# When the batched kernel refills a streamed W2 chunk's ring slot (``BatchedSpec``).
RING_REFILLS = ("after_epilogue", "before_epilogue")
SERIAL_UPDATES = ("auto", "split", "redundant", "table")
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


def _check_common(config) -> None:
  check_residency(config.residency)
  if config.sync_spin_limit < 1:
    raise ValueError(f"sync_spin_limit={config.sync_spin_limit} must be >= 1")
  if config.serial_update not in SERIAL_UPDATES:
    raise ValueError(f"serial_update={config.serial_update!r} must be one of "
                     f"{SERIAL_UPDATES}")


def _check_at_least_one(**values) -> None:
  for name, value in values.items():
    if value is not None and value < 1:
      raise ValueError(f"{name}={value} must be >= 1")


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
    _check_common(self)
    _check_at_least_one(num_programs=self.num_programs, num_stages=self.num_stages)
    if self.tile_rows is not None and (self.tile_rows < 16 or
                                       self.tile_rows & (self.tile_rows - 1)):
      raise ValueError(f"tile_rows={self.tile_rows} must be a power of two >= 16")
    if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16, 32):
      raise ValueError(f"num_warps={self.num_warps} must be a power of two <= 32")


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
  """The Mosaic GPU kernel's options (``impl="mosaic"``); None: the planner's choice.

  residency: how many of each block's 64-row W2 chunks stay in shared memory
    (``"auto"``: all when they fit, else the measured split of 2 resident chunks beside
    a 2-slot ring; otherwise as for ``TritonConfig``).
  num_blocks: the persistent grid (default: one block per SM).
  interpret, sync_spin_limit: as for ``TritonConfig``.
  ring_stages: slots of the TMA ring that streams the other chunks (None: the planner's;
    the batched kernel's vanilla and gated heads take up to 4 before any chunk stays
    resident).
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
  kernel: "rows" (W2 rows on the WGMMA's M, the batch on N: up to 4 rows), "batched"
    (up to 64 rows a launch, ``mosaic_batched_walk``) or "auto" (batched, except rows
    at one row for the vanilla head, and up to 4 rows where the batched kernel cannot
    run the walk or a row-kernel option — gemv, group, resident_group, register_chunks
    — is set); "stacked" (``stacked_walk``: an int8 W2 that z meets as two int8 planes,
    the vanilla head, greedy, bf16 base logits; z's planes stacked on the WGMMA's M from
    registers, four warpgroups; up to 64 rows a launch — "auto"'s choice for such walks
    from 2 rows on the GPU, where no other kernel's option is set).
  base_stages: the batched kernel's base-logit ring slots (at most a warpgroup's
    chunks; None: the planner's — 3, or 1 on M with two computing warpgroups, but 3 for
    the gated head's int8 W2 widened before the launch).
  batch_axis: the batched kernel's orientation: "m" (the batch on the WGMMA's M, a chunk
    the B operand), "n" (a chunk the A operand, the batch on N; jax >= 0.11) or None
    (the planner's: N up to 32 rows where it lowers, else M; int8 planes at r < 128
    always M).
  warpgroups: the batched kernel's warpgroups a block (1 or 2; None: the planner's —
    two for sampling, for int8 planes and for bf16 greedy walks of 17-32 rows (on N);
    the gated head two for sampling past 16 rows or on M; the gated and rnn heads two on
    M for sampling and for greedy walks past 32 rows of a bf16 W2; one where the second
    does not fit), each computing its own half of the block's chunks.
  serial_update: the batched kernel's gated and rnn heads: "split" (each block a slice of
    the update's units, published to the others through global memory and a second grid
    barrier a step), "redundant" (gated only: every block computes the whole gate from
    G_e streamed through its ring), "table" (the batch on N: each row's gate term
    gathered from the gated head's gate table, ``wts_jax.with_gate_table``, or the rnn
    head's J_e e from its joint table, ``wts_jax.with_joint_table``, up to 16 rows, one
    warpgroup: no second barrier) or "auto" (the gate table where the head has one and
    the batch goes on N, the joint table up to 4 rows, else split).
  producer: one more warpgroup in the batched kernel that issues every W2 and base
    refill once the computing warpgroups release the slot (None: the planner's — beside
    two computing warpgroups for greedy walks of the vanilla head).
  merge_tiles: the batched kernel with two computing warpgroups on N: the second hands
    its per-element bests to the first unreduced, which reduces both once a step (None:
    the planner's — on N up to 16 rows for the vanilla head).
  w2_widening: the batched kernel with an int8 W2 that z meets in bf16 (quantized
    without planes): "xla" (a bf16 copy of W2 before each launch), "registers" (the int8
    chunk streamed and converted into the WGMMA's A operand; the batch on N),
    "smem" (converted into a bf16 tile in shared memory the WGMMA reads; either axis;
    what interpret mode runs) or "auto" (the planner's: "registers" up to 16 rows where
    it lowers, else "xla"; ``mosaic_batched_plan.auto_w2_widening``).
  status: where the stacked and batched kernels reduce the walk's status: "flags" (a
    word a warpgroup, OR-reduced by an XLA op after the launch) or "kernel" (in the
    kernel, through a zeroed global counter a status bit: no op after the launch); None:
    the planner's ("kernel" for the stacked kernel and the batched one, but "flags" for
    the batched kernel's int8 planes). The row kernel reduces after the launch.
  ring_refill: when the batched kernel refills (or releases to its producer) a streamed
    W2 chunk's ring slot: "after_epilogue" (once the chunk's logits are folded) or
    "before_epilogue" (as soon as its accumulator is read, so the copy runs beside the
    epilogue; not with an int8 W2 widened in the kernel, whose threads read the slot);
    None: the planner's ("before_epilogue" for a 1-slot ring, else "after_epilogue";
    ``mosaic_batched_plan.auto_ring_refill``).
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
  kernel: str = "auto"
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
    _check_common(self)
    if self.status not in (None, "flags", "kernel"):
      raise ValueError(f"status={self.status!r} must be 'flags', 'kernel' or None")
    if self.ring_refill not in (None,) + RING_REFILLS:
      raise ValueError(f"ring_refill={self.ring_refill!r} must be one of {RING_REFILLS} "
                       "or None")
    if self.w2_widening not in MOSAIC_W2_WIDENINGS:
      raise ValueError(f"w2_widening={self.w2_widening!r} must be one of "
                       f"{MOSAIC_W2_WIDENINGS}")
    if self.warpgroups not in (None, 1, 2):
      raise ValueError(f"warpgroups={self.warpgroups} must be 1 or 2")
    if self.kernel not in MOSAIC_KERNELS:
      raise ValueError(f"kernel={self.kernel!r} must be one of {MOSAIC_KERNELS}")
    if self.batch_axis not in (None, "m", "n"):
      raise ValueError(f"batch_axis={self.batch_axis!r} must be 'm' or 'n'")
    if self.merge_tiles not in (None, True, False):
      raise ValueError(f"merge_tiles={self.merge_tiles!r} must be True, False or None")
    if self.base_stages is not None and self.base_stages < 1:
      raise ValueError(f"base_stages={self.base_stages} must be >= 1")
    _check_at_least_one(num_blocks=self.num_blocks, group=self.group,
                        resident_group=self.resident_group)
    if self.register_chunks < 0:
      raise ValueError(f"register_chunks={self.register_chunks} must be >= 0")
    if self.ring_stages is not None and self.ring_stages < 0:
      raise ValueError(f"ring_stages={self.ring_stages} must be >= 0")
    if self.gemv not in MOSAIC_GEMVS:
      raise ValueError(f"gemv={self.gemv!r} must be one of {MOSAIC_GEMVS}")


BACKEND_CONFIGS = {"triton": TritonConfig, "mosaic": MosaicConfig}


@dataclasses.dataclass(frozen=True)
class WalkConfig(TritonConfig):
  """The all-in-one spelling of the kernels' options (kept working; new code passes a
  ``TritonConfig`` or ``MosaicConfig`` and names the backend with ``impl``).

  ``backend`` ("auto", "mosaic" or "triton") restricts the kernels ``impl="pallas"`` or
  ``"auto"`` may choose from; the fields map onto the two backends' configs
  (``triton()``, ``mosaic()``): ``num_programs`` -> ``num_blocks``, ``num_stages`` ->
  ``ring_stages``, ``mosaic_gemv`` / ``mosaic_group`` / ``mosaic_snake`` /
  ``mosaic_resident_group`` / ``mosaic_register_chunks`` / ``mosaic_kernel`` /
  ``mosaic_base_stages`` / ``mosaic_batch_axis`` / ``mosaic_warpgroups`` /
  ``mosaic_producer`` / ``mosaic_w2_widening`` -> ``gemv`` / ``group`` / ``snake`` /
  ``resident_group`` / ``register_chunks`` / ``kernel`` / ``base_stages`` /
  ``batch_axis`` / ``warpgroups`` / ``producer`` / ``w2_widening``.
  """

  backend: str = "auto"
  mosaic_gemv: str = "auto"
  mosaic_group: int | None = None
  mosaic_snake: bool = True
  mosaic_resident_group: int | None = None
  mosaic_register_chunks: int = 0
  mosaic_kernel: str = "auto"
  mosaic_base_stages: int | None = None
  mosaic_batch_axis: str | None = None
  mosaic_warpgroups: int | None = None
  mosaic_producer: bool | None = None
  mosaic_w2_widening: str = "auto"

  def __post_init__(self):
    super().__post_init__()
    if self.backend not in BACKENDS:
      raise ValueError(f"backend={self.backend!r} must be one of {BACKENDS}")
    if self.mosaic_gemv not in MOSAIC_GEMVS:
      raise ValueError(f"mosaic_gemv={self.mosaic_gemv!r} must be one of {MOSAIC_GEMVS}")
    if self.mosaic_group is not None and self.mosaic_group < 1:
      raise ValueError(f"mosaic_group={self.mosaic_group} must be >= 1")
    if self.mosaic_w2_widening not in MOSAIC_W2_WIDENINGS:
      raise ValueError(f"mosaic_w2_widening={self.mosaic_w2_widening!r} must be one of "
                       f"{MOSAIC_W2_WIDENINGS}")

  def triton(self) -> TritonConfig:
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(TritonConfig)}
    return TritonConfig(**fields)

  def mosaic(self) -> MosaicConfig:
    return MosaicConfig(residency=self.residency, num_blocks=self.num_programs,
                        interpret=self.interpret, sync_spin_limit=self.sync_spin_limit,
                        ring_stages=self.num_stages, gemv=self.mosaic_gemv,
                        group=self.mosaic_group, snake=self.mosaic_snake,
                        resident_group=self.mosaic_resident_group,
                        register_chunks=self.mosaic_register_chunks,
                        kernel=self.mosaic_kernel,
                        base_stages=self.mosaic_base_stages,
                        batch_axis=self.mosaic_batch_axis,
                        warpgroups=self.mosaic_warpgroups,
                        producer=self.mosaic_producer,
                        serial_update=self.serial_update,
                        w2_widening=self.mosaic_w2_widening)

  def for_backend(self, name: str):
    return {"triton": self.triton, "mosaic": self.mosaic}[name]()
