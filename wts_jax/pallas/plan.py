"""The residency plan: how the vocabulary is sharded over the persistent grid, and how
much of each shard stays on chip for the whole walk.

Program ``p`` owns rows ``[p·S, (p+1)·S)`` of W2 (``S = rows_per_program``, a multiple of
``tile_rows``; rows ≥ V are masked). The first ``resident_tiles`` tiles of the shard are
loaded once at walk start and kept on chip; the other ``streamed_tiles`` are re-read every
step (from L2 when the streamed set fits there).

The serial update of the gated and recurrent heads (``G_e e``; ``J_s s + J_e e``) is
either recomputed by every program (``redundant``) or ``split``: program ``p`` computes
the output columns ``[p·w, (p+1)·w)`` of the new ``z`` (and rnn state) from its own
slice of the serial weights, kept on chip for the whole walk, publishes them, and all
programs meet at a second grid barrier before reading the full ``z`` (``triton_walk``).

The plan is a frozen dataclass: ``plan_walk(...)`` computes it from the device and the
shapes, ``WalkPlan.describe()`` prints it, and the Triton backend launches exactly it.
"""

from __future__ import annotations

import dataclasses
import math

from wts_jax import device as device_facts
from wts_jax.device import DeviceFacts
from wts_jax.walk_config import TritonConfig, resident_units

MAX_SLICE_COLS = 16               # serial-update columns per slice (split)
SERIAL_RESIDENT_BYTES = 16 * 1024  # serial-weight slices kept on chip per program (split)


@dataclasses.dataclass(frozen=True)
class WalkPlan:
  """A launch of the persistent walk kernel (all sizes static)."""

  num_programs: int          # persistent grid size (co-resident: <= SM count)
  rows_per_program: int      # S: the W2 shard of one program
  tile_rows: int             # rows per GEMV tile (power of two)
  resident_tiles: int        # tiles of the shard kept on chip for all K steps
  padded_batch: int          # batch rows inside the kernel (power of two)
  num_warps: int
  vocab_size: int
  rank: int
  w2_itemsize: int
  resident_budget_bytes: int  # on-chip bytes per program the planner allowed for W2
  # The gated/rnn serial update: "split" over programs (slices of ``serial_slice_cols``
  # output columns, ``serial_slice_rounds`` slices per program, the weight slices kept
  # on chip when ``serial_weights_resident``) or "redundant" (every program, all of it).
  serial_update: str = "redundant"
  serial_slice_cols: int = 0
  serial_weights_resident: bool = False

  @property
  def tiles_per_program(self) -> int:
    return self.rows_per_program // self.tile_rows

  @property
  def streamed_tiles(self) -> int:
    return self.tiles_per_program - self.resident_tiles

  @property
  def resident_rows(self) -> int:
    return self.resident_tiles * self.tile_rows

  @property
  def resident_bytes_per_program(self) -> int:
    return self.resident_rows * self.rank * self.w2_itemsize

  @property
  def resident_fraction(self) -> float:
    rows = min(self.vocab_size, self.num_programs * self.resident_rows)
    return rows / self.vocab_size

  @property
  def streamed_bytes_per_step(self) -> int:
    """W2 bytes re-read per step (all programs): the non-resident rows."""
    rows = max(0, self.vocab_size - self.num_programs * self.resident_rows)
    return rows * self.rank * self.w2_itemsize

  @property
  def serial_slices(self) -> int:
    """Slices of the split serial update (0 when redundant)."""
    return self.rank // self.serial_slice_cols if self.serial_update == "split" else 0

  @property
  def serial_slice_rounds(self) -> int:
    """Slices per program: program ``p`` computes slices ``p + i·G`` (those < count)."""
    return -(-self.serial_slices // self.num_programs)

  def describe(self) -> str:
    serial = (f"serial update split in {self.serial_slices} slices of "
              f"{self.serial_slice_cols} columns"
              + ("" if self.serial_weights_resident else " (weights streamed)")
              if self.serial_update == "split" else "serial update redundant")
    return (f"grid={self.num_programs} programs x {self.rows_per_program} rows "
            f"({self.tiles_per_program} tiles of {self.tile_rows}); resident "
            f"{self.resident_tiles} tiles/program = "
            f"{self.resident_bytes_per_program / 1024:.0f} KiB/program, "
            f"{self.resident_fraction:.0%} of W2 on chip; streamed "
            f"{self.streamed_bytes_per_step / 2**20:.1f} MiB/step; batch padded to "
            f"{self.padded_batch}; {self.num_warps} warps; {serial}")


def next_power_of_two(n: int) -> int:
  return 1 << max(0, math.ceil(math.log2(max(1, n))))


def padded_batch(batch: int) -> int:
  """B=1 runs GEMVs on CUDA cores; B>1 runs tensor-core dots, which need >= 16 rows."""
  return 1 if batch == 1 else max(16, next_power_of_two(batch))


def plan_walk(*, vocab_size: int, rank: int, batch: int, w2_itemsize: int,
              config: TritonConfig, device: DeviceFacts | None = None,
              register_budget_bytes: int | None = None) -> WalkPlan:
  """Shard the vocabulary over the grid and choose the resident tiles.

  The Triton backend keeps resident tiles in registers (values live across the step
  loop), so the budget is a quarter of the register file: the streamed tile in flight,
  the lane candidates and the products need the rest. (On the H200, four resident
  64-row bf16 tiles ran slower than two.) ``device``: the device's
  facts (default: read now; not read in interpret mode).
  """
  if register_budget_bytes is None:
    register_budget_bytes = (device or device_facts.H200).register_file_bytes // 4
  if config.interpret:
    # Interpret mode runs programs one after another: a cross-program barrier could
    # never complete, so one program owns every shard (the per-step code is the same).
    num_programs = 1
  else:
    device = device_facts.current() if device is None else device
    num_programs = config.num_programs or device.num_sms
    if num_programs > device.num_sms:
      raise ValueError(
          f"num_programs={num_programs} exceeds the {device.num_sms} SMs of "
          f"{device.kind}: the persistent grid must be co-resident or its barrier hangs")
  if rank & (rank - 1):
    raise ValueError(f"rank={rank} must be a power of two for the Pallas kernel")
  tile_rows = config.tile_rows or (64 if vocab_size >= 64 * num_programs * 4 else 32)
  rows_per_program = -(-vocab_size // num_programs)
  rows_per_program = -(-rows_per_program // tile_rows) * tile_rows
  tiles = rows_per_program // tile_rows
  tile_bytes = tile_rows * rank * w2_itemsize
  budget_tiles = register_budget_bytes // tile_bytes

  residency = config.residency
  resident = resident_units(residency, tiles, tile_rows)
  if resident is None:   # "auto": as many as the register budget holds
    resident = min(tiles, budget_tiles)
  elif residency == "full" and tiles > budget_tiles and not config.interpret:
    raise ValueError(
        f"residency='full' needs {tiles * tile_bytes // 1024} KiB of W2 per program "
        f"but the on-chip budget is {budget_tiles * tile_bytes // 1024} KiB "
        f"(V={vocab_size}, r={rank}, {w2_itemsize}-byte W2, {num_programs} programs); "
        "use residency='auto', a quantized W2, or a smaller rank")
  if resident > budget_tiles and not config.interpret:
    raise ValueError(f"residency={residency!r} asks for {resident} resident tiles; "
                     f"only {budget_tiles} fit on chip per program")
  serial_update, slice_cols = serial_split(rank, num_programs, config)
  return WalkPlan(num_programs=num_programs, rows_per_program=rows_per_program,
                  tile_rows=tile_rows, resident_tiles=int(resident),
                  padded_batch=padded_batch(batch), num_warps=config.num_warps or 8,
                  vocab_size=vocab_size,
                  rank=rank, w2_itemsize=w2_itemsize,
                  resident_budget_bytes=int(budget_tiles * tile_bytes),
                  serial_update=serial_update, serial_slice_cols=slice_cols,
                  serial_weights_resident=(serial_update == "split" and
                                           serial_slice_bytes(rank, num_programs,
                                                              slice_cols)
                                           <= SERIAL_RESIDENT_BYTES))


def serial_split(rank: int, num_programs: int, config: TritonConfig) -> tuple[str, int]:
  """(mode, slice columns) of the gated/rnn serial update; ignored by the vanilla head.

  ``auto`` splits: the redundant update costs every program the whole serial matvec per
  step (rnn: 3r x 2r weights from L2 per program and step), the split one a second grid
  barrier. Slices are as narrow as the grid allows: r=256 over 132
  programs gives 128 slices of 2 columns (one per program, 4 programs idle)."""
  if config.serial_update == "redundant":
    return "redundant", 0
  return "split", min(MAX_SLICE_COLS, rank, next_power_of_two(-(-rank // num_programs)))


def serial_slice_bytes(rank: int, num_programs: int, slice_cols: int) -> int:
  """Serial-weight bytes one program's slices need (the rnn's: for each of its slices,
  3 output groups x ``slice_cols`` rows x 2r inputs of bf16)."""
  rounds = -(-(rank // slice_cols) // num_programs)
  return rounds * 3 * slice_cols * 2 * rank * 2
