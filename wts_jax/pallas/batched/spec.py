"""The batched kernel's launch description (``BatchedSpec``: its plan, rows, steps and
mode), its refs by name (``BatchedRefs``), and a walk's rows cut into launches of at most
64 (``row_launches``)."""

from __future__ import annotations

import dataclasses

from wts_jax.pallas.batched.plan import BATCH_TILE, BatchedPlan, padded_batch
from wts_jax.walk_config import RING_REFILLS

# Registers a thread with a producer beside two consumers (384 threads start at 168): the
# producer keeps what issuing copies needs, the consumers take the rest (multiples of 8,
# 128 · (2 · 232 + 40) <= 64 K).
PRODUCER_REGISTERS = 40
CONSUMER_REGISTERS = 232


@dataclasses.dataclass(frozen=True)
class BatchedLab:
  """What only tools/ set on a batched launch: Mosaic GPU's profiler over the kernel's
  named regions (``profile_dir``, ``profile_space``), and for the profile a warpgroup
  barrier (region "skew") before each chunk's WGMMA, which separates the warps' arrival
  spread from the WGMMA's issue (``probe_skew``)."""
  profile_dir: str = ""
  profile_space: int = 0
  probe_skew: bool = False


@dataclasses.dataclass(frozen=True)
class BatchedSpec:
  plan: BatchedPlan
  batch: int          # the caller's rows (<= plan.batch_rows)
  steps: int
  greedy: bool
  spin_limit: int
  interpret: bool
  row_offset: int = 0   # the first row's index in the whole walk (its noise streams)
  # Measurement and profiling options that only tools/ set (``BatchedLab``).
  lab: BatchedLab = BatchedLab()
  # The walk's status: "flags", a word a warpgroup, OR-reduced by an XLA op after the
  # launch; "kernel", reduced in the kernel (as ``stacked_walk``'s): before its last
  # step's grid signal each block's leader adds one to a zeroed global counter a status
  # bit its block holds (warpgroup 1's NaN handed over with its bests, a split update's
  # time-out read then), and block 0's leader, past that step's barrier, writes the one
  # word. No op after the kernel. (The API's choice: ``mosaic_batched_backend.resolve``.)
  status: str = "flags"
  # When a streamed chunk's W2 ring slot is refilled (or released to the producer):
  # "after_epilogue", once the chunk's logits are folded; "before_epilogue", as soon as
  # its accumulator is read (its WGMMA's reads of the slot are complete then), so the
  # refill's copy runs beside the epilogue — the whole of a 1-slot ring's latency
  # otherwise. Not with an int8 W2 widened in the kernel (its threads read the slot).
  ring_refill: str = "after_epilogue"

  def __post_init__(self):
    if self.status not in ("flags", "kernel"):
      raise ValueError(f"status={self.status!r} must be 'flags' or 'kernel'")
    if self.ring_refill not in RING_REFILLS:
      raise ValueError(f"ring_refill={self.ring_refill!r} must be one of {RING_REFILLS}")
    if self.ring_refill == "before_epilogue" and self.plan.widened_in_kernel:
      raise ValueError("ring_refill='before_epilogue' needs W2 slots that only WGMMAs "
                       "read (an int8 W2 widened in the kernel is read by its threads)")


@dataclasses.dataclass(frozen=True)
class BatchedRefs:
  """The kernel's refs by name (``_g`` global, ``_s`` shared, ``_bar`` barriers)."""
  w2_g: object
  base_g: object
  tok_g: object
  flag_g: object
  w_s: object
  base_s: object
  tok_s: object
  keys_s: object
  res_bar: object
  ring_bar: object
  base_bar: object
  base_free_bar: object
  za_s: object = None            # z's WGMMA tile(s)
  z_bar: object = None           # the staging's copies
  seed_g: object = None
  scale_g: object = None
  noise_g: object = None
  w2_scale_g: object = None   # int8 W2: per-row scales, in shared memory once
  w2_scale_s: object = None
  w2_scale_bar: object = None
  w1_scale_g: object = None   # int8 planes: s_lo of each token [V]
  row_scale_s: object = None     # int8 planes: each row's s_lo [64] f32
  ring_free_bar: object = None   # producer: a W2 ring slot read by its consumer
  za_bar: object = None          # warpgroups: the WGMMA tile of z is staged
  merge_bar: object = None       # warpgroups: warpgroup 1's best per row is stored
  merge_flag_s: object = None    # status in the kernel: warpgroup 1's NaN flag, handed over
  merge_value_s: object = None
  merge_index_s: object = None
  merge_tile_value_s: object = None   # ``merge_tiles``: warpgroup 1's unreduced bests
  merge_tile_index_s: object = None
  merge_tile_nan_s: object = None
  widen_s: object = None   # ``w2_widening="smem"``: each warpgroup's bf16 chunk tile
  w1_g: object = None            # W1 and the first tokens
  first_g: object = None
  z_s: object = None             # z staging
  gate_w_g: object = None        # gated head: gate_proj.weight (G_e its last r columns)
  gate_hoisted_g: object = None  # gated head: hoisted_k, [K, r / 64, 64 rows, 64] f32
                                 # ([64 rows, K, r] with a split gate, as the hoist
                                 # gives them; [K, 2, rows, r] int16 halves of its
                                 # fp32 bits with a gate table)
  update_w_s: object = None      # split update: this block's rows of G_e (or [J_s, J_e],
                                 # each the rnn head's gate, candidate, output rows)
  update_w_bar: object = None
  update_flag_s: object = None   # split update: its barrier's timeout, for the leader's flags
  zpub_g: object = None          # split update: z of every row and step as a hi + lo
                                 # bf16 pair [K, 2, 64, r]
  spub_g: object = None          # the rnn head: its state, likewise
  pub_bar: object = None         # split update: the published z pair copied in
  state_bar: object = None       # the rnn head: a published state half copied in
  state_s: object = None         # the rnn head: its own units' state, fp32 [64, units]
  joint_w_g: object = None       # the rnn head: joint_proj.weight [3r, 2r + d]
  ppub_g: object = None          # joint table: J_s s_{k-1} of every row for step k, as
                                 # int16 halves of its fp32 bits [K, 2, 3 parts, 64, r]
  state_tile_s: object = None    # joint table: s_k's hi or lo half, the owners' WGMMA
                                 # operand [64, r] bf16


def row_launches(spec: BatchedSpec, batch: int) -> list[tuple[slice, BatchedSpec]]:
  """A walk's rows cut into launches of at most 64 (the rows of a walk are independent):
  (the rows, the launch's spec — its rows padded to whole 8-row tiles, its first row's
  index for the noise streams)."""
  launches = []
  for start in range(0, batch, BATCH_TILE):
    count = min(BATCH_TILE, batch - start)
    launches.append((slice(start, start + count), dataclasses.replace(
        spec, batch=count, row_offset=start,
        plan=dataclasses.replace(spec.plan, batch_rows=padded_batch(count)))))
  return launches


def gathered_z_rows(spec: BatchedSpec) -> int:
  """The staging rows each step's gather copies: the batch's only (the plan's padded
  rows keep the prologue's zeros, which no batch row reads)."""
  return spec.batch

