"""The stacked kernel's launch description (``StackedSpec``), its lab overlay
(``StackedLab``, set only by tools/), the operands in the order it reads them, and a
walk's rows cut into launches of at most 64."""

from __future__ import annotations

import dataclasses

from wts_jax.int8_state import thread_rows_ordered
from wts_jax.pallas.stacked.plan import MAX_BATCH, StackedPlan, plan_stacked
from wts_jax.pallas.stacked.threads import TILE


@dataclasses.dataclass(frozen=True)
class StackedLab:
  """What only tools/ set on a stacked launch (``tools/stacked_probe.py``).

  profile_dir, profile_space: Mosaic GPU's profiler over the kernel's named regions.
  timing_ablation (timing only; the tokens are wrong): "fold", a tile's fold cut to its
    first column pair; "base", no base logits loaded (with base slots: none copied, the
    fold reads the slots as they are); "mma", no WGMMA issued (the accumulators stay
    zero); "narrow_mma" (GPU), each tile's WGMMA on its first ``NARROW_MMA_ROWS`` rows
    only and only their logits folded: the same chain of WGMMAs a tile on the same
    gathered z, a quarter of the tensor cores' work. What a walk would gain were that
    work free.
  prefetch_base: each step's base logits (the block's columns of every request)
    prefetched into the L2 a step ahead by the last warpgroup
    (``operands.prefetch_base``; faster alone at B 16, slower at B 64:
    ``docs/decisions.md``).
  base_vector_reads: with ``w2_order="thread_rows"`` and the threads' async base copies,
    the fold reads a thread's 32 bytes of base logits as two 16-byte loads, not eight
    4-byte ones (TMA slots always read them so). Not measured.
  dependent_launch (GPU, jax >= 0.11): the kernel starts with ``griddepcontrol.wait``,
    so XLA launches it as a programmatic dependent launch (its blocks placed while the
    op before it ends, waiting there before reading any operand). Not measured.
  """
  profile_dir: str = ""
  profile_space: int = 0
  timing_ablation: str = ""
  prefetch_base: bool = False
  base_vector_reads: bool = False
  dependent_launch: bool = False

  def __post_init__(self):
    if self.timing_ablation not in ("", "fold", "base", "mma", "narrow_mma"):
      raise ValueError(f"timing_ablation={self.timing_ablation!r} must be one of '', "
                       "'fold', 'base', 'mma', 'narrow_mma'")


@dataclasses.dataclass(frozen=True)
class StackedSpec:
  plan: StackedPlan
  batch: int
  steps: int
  smem_per_block: int = 227 * 1024   # what the plan was made for (a part's replanned)
  ring_stages: int | None = None     # the caller's ring slots (None: the planner's)
  spin_limit: int = 1 << 22
  interpret: bool = False
  # A sampled walk (Gumbel-max; ``launch.stacked_walk``'s ``sampling`` operands) or greedy;
  # ``row_offset``: this launch's first row in the walk (the noise's row index).
  greedy: bool = True
  row_offset: int = 0
  # W1's planes as given ("rows") or ``int8_state.fragment_ordered`` ("fragments": a
  # thread's share of a row by 16-byte loads; GPU only; ``W1Planes.fragments``).
  w1_order: str = "rows"
  # W2 as given ("rows") or ``int8_state.thread_rows_ordered`` ("thread_rows", V a
  # multiple of 64, the base logits in slots on the GPU): a thread's 16 columns of a tile
  # are 16 consecutive rows, so its base logits are two 16-byte copies, not eight of 4
  # bytes (by TMA: one copy a tile as before, the fold's reads two 16-byte loads).
  w2_order: str = "rows"
  # GPU only. ``rotate_warps``: warp w of warpgroup g serves the requests of warp
  # (w + g) % 4 of a block of 32 (``threads.request_warp``), so a partly filled
  # block's live requests fall on every warp scheduler, not the first ones of each
  # warpgroup; ``skip_idle_warps``: a warp whose 8 requests are all past the batch folds
  # nothing.
  rotate_warps: bool = False
  skip_idle_warps: bool = False
  # The walk's status: "flags", a word a warpgroup, OR-reduced by an XLA op after the
  # launch; "kernel", reduced in the kernel: before its last step's grid signal each
  # block adds one to a zeroed global counter a status bit it holds
  # (``output.KERNEL_STATUS_BITS``), and block 0, past that step's barrier, ORs the
  # counters' bits into its own status and writes the one word. No op after the kernel.
  # (A block's own time-out in the last step's wait is block 0's to report only: the
  # tokens are block 0's.)
  status: str = "flags"
  # Measurement and profiling options that only tools/ set.
  lab: StackedLab = StackedLab()

  def __post_init__(self):
    for name, allowed in (("w1_order", ("rows", "fragments")),
                          ("w2_order", ("rows", "thread_rows")),
                          ("status", ("flags", "kernel"))):
      value = getattr(self, name)
      if value not in allowed:
        raise ValueError(f"{name}={value!r} must be one of {', '.join(map(repr, allowed))}")
    if self.interpret and self.w1_order != "rows":
      raise ValueError(f"w1_order={self.w1_order!r}: the interpreted gather reads W1's rows")
    if self.w2_order == "thread_rows" and (
        self.plan.vocab_size % TILE or (not self.interpret and not self.plan.base_slots)):
      raise ValueError("w2_order='thread_rows': V a multiple of 64 (V="
                       f"{self.plan.vocab_size}) and on the GPU the base logits in slots")
    if self.lab.base_vector_reads and self.w2_order != "thread_rows":
      raise ValueError("base_vector_reads: W2 in its threads' rows")
    if self.interpret and self.lab.timing_ablation == "narrow_mma":
      raise ValueError("timing_ablation='narrow_mma': GPU only")
    if self.interpret and (self.rotate_warps or self.skip_idle_warps):
      raise ValueError("rotate_warps, skip_idle_warps: GPU only (the interpreted walk "
                       "has no warps)")


def w2_operand(spec: StackedSpec, operands: dict):
  """W2 in the order ``spec`` reads it (``thread_rows``: made here when the operands
  lack ``w2_thread_rows``: a copy of W2)."""
  if spec.w2_order == "thread_rows":
    return (operands["w2_thread_rows"] if "w2_thread_rows" in operands
            else thread_rows_ordered(operands["w2"]))
  return operands["w2"]


def w1_planes_operand(spec: StackedSpec, operands: dict):
  """W1's planes in the order ``spec`` reads them, from ``head_operands.serial_operands``
  (the head carries the rows and the fragment order)."""
  return operands["w1_fragments" if spec.w1_order == "fragments" else "w1_planes"]


def row_launches(spec: StackedSpec) -> list[tuple[slice, StackedSpec]]:
  """The walk's rows a launch each, at most 64 (the rows of a walk are independent),
  each part planned for its own rows."""
  parts = []
  for first in range(0, spec.batch, MAX_BATCH):
    rows = min(MAX_BATCH, spec.batch - first)
    plan = plan_stacked(vocab_size=spec.plan.vocab_size, rank=spec.plan.rank, batch=rows,
                        num_blocks=spec.plan.num_blocks, smem_per_block=spec.smem_per_block,
                        ring_stages=spec.ring_stages, base_slots=spec.plan.base_slots,
                        base_copies=spec.plan.base_copies)
    parts.append((slice(first, first + rows),
                  dataclasses.replace(spec, plan=plan, batch=rows,
                                      row_offset=spec.row_offset + first)))
  return parts
