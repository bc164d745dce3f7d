"""``WalkConfig``: the options of the Weights-That-Stay kernel (frozen, validated)."""

from __future__ import annotations

import dataclasses
import numbers

RESIDENCY_MODES = ("auto", "full", "none")
BACKENDS = ("auto", "mosaic", "triton")
MOSAIC_GEMVS = ("auto", "registers", "wgmma")


@dataclasses.dataclass(frozen=True)
class WalkConfig:
  """Kernel options; the defaults pick everything from the device and the shapes.

  residency: how much of each program's W2 shard stays on chip for the whole walk:
    ``"auto"`` (the planner's choice), ``"full"`` (all of it, or an error if it does
    not fit), ``"none"`` (stream every step), a fraction in [0, 1], or a row count per
    program.
  num_programs: the persistent grid size (default: one program per SM).
  interpret: run the kernel's own code in Pallas interpret mode (CPU tests).
  sync_spin_limit: polls of the grid barrier before the kernel gives up and reports
    ``STATUS_SYNC_TIMEOUT`` instead of hanging.
  tile_rows, num_warps, num_stages: tuning overrides (None: the planner's choice);
    for the Mosaic GPU kernel ``num_stages`` is its TMA ring's slot count.
  backend: ``"mosaic"`` (the Mosaic GPU kernel: shared-memory residency and a TMA
    ring; the vanilla and gated heads, bf16 or int8 W2, B <= 4, no per-step logits),
    ``"triton"`` (the Triton kernel: every head and option), or ``"auto"`` (Mosaic for
    greedy B = 1 vanilla walks where it applies and not interpreting — measured faster
    there — else Triton).
  """

  residency: str | float | int = "auto"
  num_programs: int | None = None
  interpret: bool = False
  sync_spin_limit: int = 1 << 22
  tile_rows: int | None = None
  num_warps: int | None = None
  num_stages: int | None = None
  backend: str = "auto"
  # The gated/rnn serial update in the persistent Triton kernel: "split" over the
  # programs (a second grid barrier per step), "redundant" (every program computes all
  # of it), or "auto" (the planner's choice: split; see pallas.plan.serial_split).
  serial_update: str = "auto"
  # The Mosaic GPU kernel only: how a 64-row chunk meets z. "registers": an fp32 GEMV in
  # registers; "wgmma": a tensor-core WGMMA (64 x 8B x r, bf16 operands, fp32
  # accumulation), z copied from W1 into shared memory by TMA — exact for the vanilla
  # head, whose z is a bf16 row of W1; "auto": wgmma where it applies (measured faster,
  # NOTES.md "v5"), else registers.
  mosaic_gemv: str = "auto"
  # The Mosaic WGMMA GEMV only: how many chunks' WGMMAs are issued before one wait
  # (None: the planner's choice). A streamed group needs as many ring slots.
  mosaic_group: int | None = None
  # The Mosaic kernel only: stream odd steps' chunks in reverse, so each step starts on
  # what the last one read last (still in the L2); False streams every step forward.
  mosaic_snake: bool = True
  # The Mosaic kernel, int8 W2 with z as two int8 planes only: chunks of each block's
  # shard held in registers for the whole walk (the WGMMA's A operand), beside the
  # shared-memory resident ones.
  mosaic_register_chunks: int = 0
  # The Mosaic WGMMA GEMV only: on-chip chunks' WGMMAs issued before one wait (None: the
  # planner's choice).
  mosaic_resident_group: int | None = None

  def __post_init__(self):
    residency = self.residency
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
    if self.num_programs is not None and self.num_programs < 1:
      raise ValueError(f"num_programs={self.num_programs} must be >= 1")
    if self.tile_rows is not None and (self.tile_rows < 16 or
                                       self.tile_rows & (self.tile_rows - 1)):
      raise ValueError(f"tile_rows={self.tile_rows} must be a power of two >= 16")
    if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16, 32):
      raise ValueError(f"num_warps={self.num_warps} must be a power of two <= 32")
    if self.num_stages is not None and self.num_stages < 1:
      raise ValueError(f"num_stages={self.num_stages} must be >= 1")
    if self.backend not in BACKENDS:
      raise ValueError(f"backend={self.backend!r} must be one of {BACKENDS}")
    if self.sync_spin_limit < 1:
      raise ValueError(f"sync_spin_limit={self.sync_spin_limit} must be >= 1")
    if self.mosaic_gemv not in MOSAIC_GEMVS:
      raise ValueError(f"mosaic_gemv={self.mosaic_gemv!r} must be one of {MOSAIC_GEMVS}")
    if self.mosaic_resident_group is not None and self.mosaic_resident_group < 1:
      raise ValueError(f"mosaic_resident_group={self.mosaic_resident_group} must be >= 1")
    if self.mosaic_register_chunks < 0:
      raise ValueError(f"mosaic_register_chunks={self.mosaic_register_chunks} must be >= 0")
    if self.mosaic_group is not None and self.mosaic_group < 1:
      raise ValueError(f"mosaic_group={self.mosaic_group} must be >= 1")
    if self.serial_update not in ("auto", "split", "redundant"):
      raise ValueError(f"serial_update={self.serial_update!r} must be 'auto', 'split' "
                       "or 'redundant'")
