"""The Mosaic GPU backend (``impl="mosaic"``): from a head and validated inputs to one
launch of the kernel of ``mosaic_walk``.

``plan`` refuses what the kernel cannot run (its scope: ``mosaic_walk``'s docstring) and
makes the shared-memory plan (``mosaic_plan``); ``launch`` launches exactly it, then
computes the confidence logits from the drafted tokens (an exact identity: they read
only ``e_k = W1[x_{k-1}]`` and hoisted terms).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from wts_jax.device import DeviceFacts
from wts_jax.gate_table import table_of
from wts_jax.joint_table import joint_table_of
from wts_jax.pallas import widen
from wts_jax.pallas.backend import Refusal, WalkOperands, WalkShapes
from wts_jax.pallas.head_operands import serial_operands
from wts_jax.pallas.mosaic_batched_plan import (BATCH_TILE,
                                                AUTO_JOINT_TABLE_MAX_ROWS,
                                                GATE_TABLE_MAX_ROWS, JOINT_TABLE_MAX_ROWS,
                                                auto_base_stages,
                                                auto_batch_axis, auto_merge_tiles,
                                                auto_overlap_chunks, auto_plane_scales,
                                                auto_producer, auto_warp_gather,
                                                auto_ring_preference, auto_ring_refill,
                                                auto_w2_widening,
                                                auto_warpgroups, plan_batched,
                                                warpgroup_chunks)
from wts_jax.pallas.mosaic_plan import (AUTO_MAX_BATCH, CHUNK_ROWS, MAX_BATCH,
                                        launch_facts, make_plan)
from wts_jax.walk_config import MosaicConfig

# jax 0.10's Mosaic GPU cannot lower the batch-on-N kernel's transposed base-tile load.
BATCH_ON_N_LOWERS = jax.__version_info__ >= (0, 11)

HEAD_TYPES = ("vanilla", "gated")   # the head types the row kernel has an ``advance`` for
# The batched kernel's (the rnn head's update split over the blocks, on request).
BATCHED_HEAD_TYPES = ("vanilla", "gated", "rnn")


def _interpret_blocks_refusal(config: MosaicConfig) -> str | None:
  """Every Mosaic kernel's: interpret mode has one block (a grid exchange needs them all
  at once)."""
  if config.interpret and (config.num_blocks or 1) > 1:
    return ("interpret mode runs blocks one after another and has no semaphores: "
            "use num_blocks=1")
  return None


def _stacked_refusal(head, shapes: WalkShapes, config: MosaicConfig) -> str | None:
  """What ``kernel="stacked"`` (``stacked_walk``) runs, and what it does not."""
  serial = head.markov_head
  if head.config.head_type != "vanilla" or not serial.z_as_int8_planes:
    return ("kernel='stacked' runs the vanilla head with an int8 W2 that z meets as two "
            "int8 planes (quantize_w2(head, 'int8', state='planes'))")
  if shapes.base_itemsize != 2:
    return "kernel='stacked' needs bf16 base logits"
  vocab, rank = head.config.vocab_size, head.config.rank
  if vocab % 2 or vocab < 64 or rank % 32:
    return (f"kernel='stacked' needs an even V of at least 64 and r a multiple of 32 "
            f"(V={vocab}, r={rank})")
  return _interpret_blocks_refusal(config)


# The stacked kernel's base logits by TMA copies above this many rows (one block of 32
# requests), by the threads' async copies up to it (measured: NOTES v32).
STACKED_TMA_BASE_ABOVE = 32


def _stacked_plan(head, shapes: WalkShapes, config: MosaicConfig, device: DeviceFacts):
  from wts_jax.pallas.stacked_walk import MAX_BATCH, StackedSpec, plan_stacked
  num_sms, smem = launch_facts(config, device)
  rows = min(shapes.batch, MAX_BATCH)
  vocab = head.config.vocab_size
  gpu = not config.interpret
  try:
    plan = plan_stacked(vocab_size=vocab, rank=head.config.rank, batch=rows,
                        num_blocks=config.num_blocks or num_sms, smem_per_block=smem,
                        ring_stages=config.ring_stages, base_slots=2 if gpu else 0,
                        base_copies=("tma" if gpu and rows > STACKED_TMA_BASE_ABOVE
                                     and vocab % 8 == 0 else "threads"))
  except ValueError as err:
    return Refusal(str(err))
  # W1's planes in the threads' load order (the head carries them: ``W1Planes``); the
  # interpreted gather reads rows. The base logits copied into shared memory a tile
  # ahead (``base_slots``; not prefetched into the L2 a step ahead: slower at B 64,
  # NOTES v31), by TMA above one block of requests (NOTES v32). The warps' requests
  # rotated and the warps past the batch idle in the fold (NOTES v32). The status
  # reduced in the kernel (``StackedSpec.status``): no op after the launch; faster at
  # every B in one run with the reduce op beside it (NOTES v34). W2 in its threads' row
  # order where the head holds it and the plan has base slots: faster at B 1-32 with
  # the threads' async copies (NOTES v35), no slower with TMA slots (NOTES v36).
  thread_rows = (gpu and plan.base_slots
                 and hasattr(head.markov_head.markov_w2, "thread_rows"))
  return StackedSpec(plan=plan, batch=shapes.batch, steps=shapes.steps, smem_per_block=smem,
                     ring_stages=config.ring_stages, spin_limit=config.sync_spin_limit,
                     interpret=config.interpret, greedy=shapes.greedy,
                     w1_order="fragments" if gpu else "rows",
                     w2_order="thread_rows" if thread_rows else "rows",
                     rotate_warps=gpu, skip_idle_warps=gpu,
                     status=config.status or "kernel")


def _refusal(head, shapes: WalkShapes, config: MosaicConfig) -> str | None:
  serial = head.markov_head
  head_type = head.config.head_type
  if uses_stacked_kernel(head, shapes, config):
    return _stacked_refusal(head, shapes, config)
  if head_type not in HEAD_TYPES and not (head_type in BATCHED_HEAD_TYPES
                                         and uses_batched_kernel(head, shapes, config)):
    return (f"the Mosaic row kernel runs the vanilla and gated heads (not {head_type!r}; "
            "the batched kernel runs the rnn head: kernel='batched' or 'auto')")
  if head_type == "gated":
    gate_dtype = jnp.dtype(serial.gate_proj.weight.dtype)
    if gate_dtype != jnp.dtype(jnp.bfloat16):
      return f"the Mosaic kernel's gated head needs a bf16 gate_proj (got {gate_dtype})"
  weight = serial.markov_w2.weight
  dtype = jnp.dtype(weight.dtype)
  if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int8)):
    return f"the Mosaic kernel needs a bf16 or int8 W2 (got {dtype})"
  if dtype == jnp.dtype(jnp.int8) and getattr(serial.markov_w2, "scale", None) is None:
    return "an int8 W2 needs per-row scales (use wts_jax.quantize_w2)"
  if uses_batched_kernel(head, shapes, config):
    return _batched_refusal(head, shapes, config)
  if config.serial_update == "table":
    return _table_refusal(head, shapes, config) or (
        "serial_update='table' runs on the batched kernel (kernel='batched' or 'auto')")
  if config.status == "kernel":
    return ("status='kernel': the stacked and batched kernels reduce their status in the "
            "kernel; the row kernel reduces it after the launch (status=None or 'flags')")
  if shapes.batch > MAX_BATCH:
    return (f"the Mosaic row kernel runs up to {MAX_BATCH} rows (B={shapes.batch}); "
            "kernel='batched' or 'auto' runs more")
  w1_dtype = jnp.dtype(serial.markov_w1.weight.dtype)
  planes = serial.z_as_int8_planes
  if planes and (config.gemv == "registers" or head_type != "vanilla"):
    return ("an int8 W2 whose z meets it as two int8 planes runs on the WGMMA GEMV, "
            "vanilla head (gemv='auto' or 'wgmma')")
  if (config.gemv == "wgmma" and not planes
      and w1_dtype != jnp.dtype(jnp.bfloat16)):
    return f"the WGMMA GEMV needs a bf16 W1 (got {w1_dtype})"
  return _interpret_blocks_refusal(config)


def _batched_launch_refusal(config: MosaicConfig) -> str | None:
  """What any launch of the batched kernel needs of the config and of jax."""
  reason = _interpret_blocks_refusal(config)
  if reason is not None:
    return reason
  if config.batch_axis == "n" and not BATCH_ON_N_LOWERS:
    return ("batch_axis='n' needs jax >= 0.11 (jax 0.10's Mosaic GPU cannot lower its "
            "transposed base-tile load)")
  return None


# From this many rows ``kernel="auto"`` takes the stacked kernel where it runs the walk
# (measured faster than the batched kernel at 2-5 and 12-64 rows, level at 8, and than
# the row kernel at one row: NOTES v30, v31).
STACKED_MIN_BATCH = 1
# Whether ``"auto"`` gives the stacked kernel sampled walks too (``kernel="stacked"``
# runs them either way).
STACKED_TAKES_SAMPLED = False
# What the stacked kernel takes from a ``MosaicConfig``; any other field set names
# another kernel's option.
STACKED_CONFIG_FIELDS = ("kernel", "num_blocks", "interpret", "sync_spin_limit")


def uses_stacked_kernel(head, shapes: WalkShapes, config: MosaicConfig) -> bool:
  """``kernel="stacked"``, or ``"auto"`` where the stacked kernel runs the walk (the
  vanilla head's greedy walk of an int8-planes W2, bf16 base logits) from
  ``STACKED_MIN_BATCH`` rows on the GPU, and the config names no other kernel's option.
  (Interpret mode keeps the batched kernel: jax 0.10's interpreter cannot run this one.)"""
  if config.kernel != "auto":
    return config.kernel == "stacked"
  defaults = MosaicConfig()
  other_options = any(getattr(config, field.name) != getattr(defaults, field.name)
                      for field in dataclasses.fields(config)
                      if field.name not in STACKED_CONFIG_FIELDS)
  return (not config.interpret and not other_options
          and shapes.batch >= STACKED_MIN_BATCH
          and (shapes.greedy or STACKED_TAKES_SAMPLED)
          and _stacked_refusal(head, shapes, config) is None)


def uses_batched_kernel(head, shapes: WalkShapes, config: MosaicConfig) -> bool:
  """``kernel="auto"``: past the row kernel's rows, and where the batched kernel runs
  the walk and the config names no row-kernel option: past ``AUTO_MAX_BATCH`` rows, at
  any batch for the gated and rnn heads (their update split over the blocks), and for a
  greedy walk whose int8 W2 the batched kernel widens in registers."""
  if config.kernel != "auto":
    return config.kernel == "batched"
  if shapes.batch > MAX_BATCH:
    return True
  row_options = (config.gemv != "auto" or config.register_chunks or config.group
                 or config.resident_group)
  split_head = head.config.head_type in ("gated", "rnn")
  # (A greedy walk of an int8 W2 widened in registers measured faster on the batched
  # kernel from one row; sampled, the row kernel's one row, NOTES v21.)
  widened_greedy = shapes.greedy and w2_widening(head, shapes, config) == "registers"
  return ((shapes.batch > AUTO_MAX_BATCH or split_head or widened_greedy)
          and not row_options and _batched_refusal(head, shapes, config) is None)


def _batched_refusal(head, shapes: WalkShapes, config: MosaicConfig) -> str | None:
  serial = head.markov_head
  head_type = head.config.head_type
  if head_type not in BATCHED_HEAD_TYPES:
    return ("the batched Mosaic kernel runs the vanilla, gated and rnn heads (not "
            f"{head_type!r})")
  if head_type == "rnn":
    joint = jnp.dtype(serial.joint_proj.weight.dtype)
    if (config.serial_update == "redundant" or config.producer
        or joint != jnp.dtype(jnp.bfloat16)):
      return ("the batched Mosaic kernel runs the rnn head with its update split over the "
              "blocks or from its joint table (serial_update 'split', 'table' or 'auto', "
              "no producer, a bf16 joint_proj); "
              f"got serial_update={config.serial_update!r}, producer={config.producer}, "
              f"joint_proj {joint}")
  w1, w2 = (jnp.dtype(serial.markov_w1.weight.dtype),
            jnp.dtype(serial.markov_w2.weight.dtype))
  bf16 = jnp.dtype(jnp.bfloat16)
  # An int8 W2 (with its per-row scales, checked in ``_refusal``) that z does not meet as
  # planes goes to the kernel widened to bf16, scaled in the epilogue (``w2_row_scale``).
  w2_as_bf16 = w2 in (bf16, jnp.dtype(jnp.int8)) and not serial.z_as_int8_planes
  if head_type != "vanilla" and (w1 != bf16 or not w2_as_bf16):
    return (f"the batched Mosaic kernel's {head_type} head needs a bf16 W1 and a bf16 or "
            f"int8 W2 (its fp32 z meets W2 as a hi + lo bf16 pair); got {w1}, {w2}")
  table = gate_table_walk(head, shapes, config)
  if config.serial_update == "table":
    reason = _table_refusal(head, shapes, config)
    if reason is not None:
      return reason
  if head_type == "gated" and config.producer and not table:
    return ("the batched Mosaic kernel's gated head runs without a producer warpgroup "
            "unless its gate comes from its table (serial_update='table')")
  if w2_widened(head) and config.w2_widening == "registers":
    reason = _in_registers_refusal(config)
    if reason is not None:
      return reason
  if not serial.z_as_int8_planes and (w1 != bf16 or not w2_as_bf16):
    return ("the batched Mosaic kernel needs a bf16 W1 with a bf16 or int8 W2, or an int8 "
            "W2 that z meets as two int8 planes (quantize_w2(head, 'int8', "
            f"state='planes')); got {w1}, {w2}")
  return _batched_launch_refusal(config)


def _table_refusal(head, shapes: WalkShapes, config: MosaicConfig) -> str | None:
  """Why ``serial_update="table"`` cannot run this walk, or None."""
  if head.config.head_type == "rnn":
    return _joint_table_refusal(head, shapes, config)
  if head.config.head_type != "gated" or table_of(head.markov_head) is None:
    return ("serial_update='table' needs a gated head with its gate table "
            "(wts_jax.with_gate_table(head)) or an rnn head with its joint table "
            "(wts_jax.with_joint_table(head))")
  reason = _table_axis_refusal(config)
  if reason is not None:
    return reason
  if shapes.batch > GATE_TABLE_MAX_ROWS:
    return (f"serial_update='table' runs up to {GATE_TABLE_MAX_ROWS} rows, the batch on N "
            f"(B={shapes.batch}; 'split' runs more)")
  return None


def _joint_table_refusal(head, shapes: WalkShapes, config: MosaicConfig) -> str | None:
  """Why ``serial_update="table"`` cannot run this rnn walk, or None."""
  if joint_table_of(head.markov_head) is None:
    return ("serial_update='table' needs an rnn head with its joint table "
            "(wts_jax.with_joint_table(head))")
  if shapes.batch > JOINT_TABLE_MAX_ROWS:
    return (f"serial_update='table' runs the rnn head up to {JOINT_TABLE_MAX_ROWS} rows "
            f"(B={shapes.batch}; 'split' runs more)")
  if config.warpgroups == 2 or config.producer:
    return ("serial_update='table' runs the rnn head on one warpgroup, no producer (got "
            f"warpgroups={config.warpgroups}, producer={config.producer})")
  return _table_axis_refusal(config)


def _table_axis_refusal(config: MosaicConfig) -> str | None:
  """Why ``serial_update="table"`` (either table) cannot put this walk's batch on N, or
  None."""
  if config.batch_axis == "m" or not BATCH_ON_N_LOWERS:
    return ("serial_update='table' needs the batch on N (batch_axis 'n' or None) and "
            "jax >= 0.11")
  return None


def joint_table_walk(head, shapes: WalkShapes, config: MosaicConfig) -> bool:
  """Whether the batched kernel takes this rnn head's J_e e from its joint table: asked
  for (``serial_update="table"``), or under "auto" where the head has one, the walk is
  one the table runs (``_joint_table_refusal``) and has at most
  ``AUTO_JOINT_TABLE_MAX_ROWS`` rows."""
  if head.config.head_type != "rnn" or joint_table_of(head.markov_head) is None:
    return False
  if config.serial_update == "table":
    return True
  return (config.serial_update == "auto" and shapes.batch <= AUTO_JOINT_TABLE_MAX_ROWS
          and _joint_table_refusal(head, shapes, config) is None)


def gate_table_walk(head, shapes: WalkShapes, config: MosaicConfig) -> bool:
  """Whether the batched kernel takes this gated head's gate from its table: asked for
  (``serial_update="table"``), or under "auto" where the head has one, the batch goes on
  N (the planner's axis) and is at most ``GATE_TABLE_MAX_ROWS`` rows."""
  if head.config.head_type != "gated" or table_of(head.markov_head) is None:
    return False
  if config.serial_update == "table":
    return True
  rows = min(shapes.batch, BATCH_TILE)
  return (config.serial_update == "auto" and BATCH_ON_N_LOWERS
          and shapes.batch <= GATE_TABLE_MAX_ROWS
          and (config.batch_axis or auto_batch_axis(rows, int8_state=False,
                                                    greedy=shapes.greedy)) == "n")


def w2_widened(head) -> bool:
  """Whether the batched kernel meets this head's W2 widened to bf16 with its row scales
  (an int8 W2 that z does not meet as two int8 planes)."""
  serial = head.markov_head
  return (jnp.dtype(serial.markov_w2.weight.dtype) == jnp.dtype(jnp.int8)
          and not serial.z_as_int8_planes)


def _in_registers_refusal(config: MosaicConfig) -> str | None:
  """Why this config cannot widen an int8 W2 in registers, or None: the one condition that
  refuses an explicit ``w2_widening="registers"`` and that ``auto`` checks before
  choosing it."""
  if config.interpret:
    return ("w2_widening='registers' runs on the GPU only (Pallas interpret mode's WGMMA "
            "reads its A operand from shared memory: w2_widening='smem')")
  if not BATCH_ON_N_LOWERS or config.batch_axis == "m":
    return ("w2_widening='registers' needs the batch on N (the chunk is the WGMMA's A "
            "operand) and jax >= 0.11")
  return None


def w2_widening(head, shapes: WalkShapes, config: MosaicConfig) -> str:
  """Where the batched kernel widens this head's W2 (``BatchedPlan.w2_widening``): "xla"
  for a W2 that needs no widening; else the config's choice, or under "auto" the
  planner's (``auto_w2_widening``)."""
  if not w2_widened(head):
    return "xla"
  if config.w2_widening != "auto":
    return config.w2_widening
  return auto_w2_widening(
      min(shapes.batch, BATCH_TILE), batch_axis=config.batch_axis,
      gate_split=head.config.head_type != "gated" or config.serial_update != "redundant",
      in_registers_lowers=_in_registers_refusal(config) is None,
      recurrent=head.config.head_type == "rnn", greedy=shapes.greedy)


def _batched_plan(head, shapes: WalkShapes, config: MosaicConfig, device: DeviceFacts):
  from wts_jax.pallas.mosaic_batched_walk import BatchedSpec
  from wts_jax.walk_config import resident_units
  num_sms, smem = launch_facts(config, device)
  vocab, rank = head.config.vocab_size, head.config.rank
  blocks = config.num_blocks or num_sms
  rows = min(shapes.batch, BATCH_TILE)
  planes = head.markov_head.z_as_int8_planes
  w2_row_scale = w2_widened(head)
  gated = head.config.head_type == "gated"
  recurrent = head.config.head_type == "rnn"
  table = gate_table_walk(head, shapes, config)
  joint = joint_table_walk(head, shapes, config)
  widening = w2_widening(head, shapes, config)
  # (Widened into registers the chunk is the WGMMA's A operand: the batch goes on N; a
  # table gate and a joint table are staged on N.)
  axis = config.batch_axis or ("n" if widening == "registers" or table or joint
                               else auto_batch_axis(
      rows, int8_state=planes, greedy=shapes.greedy, batch_on_n_lowers=BATCH_ON_N_LOWERS,
      rank=rank))
  # (A table gate's walk is the vanilla head's but for the elementwise gate: the planner's
  # vanilla choices, NOTES v27.)
  # (A joint table's walk runs one warpgroup: ``_joint_table_refusal``.)
  wgs = 1 if joint else config.warpgroups or auto_warpgroups(
      axis, int8_state=planes, greedy=shapes.greedy, gated=gated and not table, batch=rows,
      w2_in_registers=widening == "registers", recurrent=recurrent,
      w2_row_scale=w2_row_scale)
  update_head = (gated and not table) or recurrent   # (the auto_* functions' ``gated``)

  def planned(wgs: int):
    producer = (config.producer if config.producer is not None else
                auto_producer(axis, wgs, int8_state=planes, greedy=shapes.greedy,
                              gated=update_head))
    merge_tiles = (config.merge_tiles if config.merge_tiles is not None else
                   auto_merge_tiles(axis, wgs, rows, gated=update_head))
    base_stages = (config.base_stages if config.base_stages is not None else
                   auto_base_stages(axis, wgs, gated=update_head, recurrent=recurrent,
                                    w2_row_scale=w2_row_scale))
    wg_chunks = warpgroup_chunks(vocab, blocks, wgs)
    return plan_batched(
        vocab_size=vocab, rank=rank, batch=rows,
        num_sms=num_sms, smem_per_block=smem, num_blocks=blocks, warpgroups=wgs,
        # A row count is the block's, shared by its warpgroups.
        resident_chunks=resident_units(config.residency, wg_chunks, CHUNK_ROWS * wgs),
        ring_stages=config.ring_stages, base_stages=base_stages,
        base_itemsize=shapes.base_itemsize, snake=config.snake,
        w2_itemsize=(2 if w2_row_scale and widening == "xla" else
                     jnp.dtype(head.markov_head.markov_w2.weight.dtype).itemsize),
        int8_state=planes, w2_row_scale=w2_row_scale, w2_widening=widening,
        batch_axis=axis, producer=producer,
        gated=gated,
        gate_split=gated and not table and config.serial_update != "redundant",
        gate_table=table,
        recurrent=recurrent, joint_table=joint, merge_tiles=merge_tiles,
        overlap_chunks=auto_overlap_chunks(axis, rows, greedy=shapes.greedy,
                                           gated=update_head,
                                           widened_in_kernel=widening != "xla"),
        warp_gather=auto_warp_gather(axis, int8_state=planes),
        plane_scales=auto_plane_scales(int8_state=planes),
        ring_preference=auto_ring_preference(
            recurrent=recurrent, joint_table=joint,
            redundant_gate=gated and not table and config.serial_update == "redundant"))

  try:
    batched = planned(wgs)
  except ValueError as err:
    if config.warpgroups or wgs == 1:
      return Refusal(str(err))
    # The planner's second warpgroup does not fit beside what this walk stages (say a
    # W2 widened through a bf16 tile a warpgroup): one warpgroup, not another kernel.
    try:
      batched = planned(1)
    except ValueError:
      return Refusal(str(err))
  # The status reduced in the kernel (no reduce op after the launch) where it measured
  # faster: bf16 and int8 W2, every head; with int8 planes after the launch (slower in
  # the kernel for their sampled walks on N, NOTES v36).
  status = config.status or ("flags" if batched.int8_state else "kernel")
  ring_refill = config.ring_refill or auto_ring_refill(
      batched.ring_stages, widened_in_kernel=batched.widened_in_kernel)
  if ring_refill == "before_epilogue" and batched.widened_in_kernel:
    return Refusal("ring_refill='before_epilogue' needs W2 slots that only WGMMAs read "
                   f"(this plan widens its int8 W2 in the kernel: "
                   f"w2_widening={batched.w2_widening!r})")
  # A split update reads its hoisted terms as the hoist gives them, [rows, K, n]: no
  # transpose op before the launch (NOTES v37).
  return BatchedSpec(plan=batched, batch=shapes.batch, steps=shapes.steps,
                     greedy=shapes.greedy, spin_limit=config.sync_spin_limit,
                     interpret=config.interpret, status=status,
                     hoisted_rows=batched.split, ring_refill=ring_refill)


@dataclasses.dataclass(frozen=True)
class WithLogits:
  """A walk whose caller asked for its logits or log-probabilities: the kernels select
  without writing them, so they are computed from the drafted tokens after the launch
  (``reference.logits_of_tokens``)."""
  inner: object   # the kernel's spec
  logits: bool
  logprobs: bool


def plan(head, shapes: WalkShapes, config: MosaicConfig, device: DeviceFacts):
  """The kernel build of this walk (a ``MosaicSpec`` or ``BatchedSpec``, in a
  ``WithLogits`` when logits or log-probabilities are asked for), or why Mosaic cannot
  run it."""
  spec = _kernel_plan(head, shapes, config, device)
  if isinstance(spec, Refusal) or not (shapes.return_logits or shapes.return_logprobs):
    return spec
  return WithLogits(spec, shapes.return_logits, shapes.return_logprobs)


def _kernel_plan(head, shapes: WalkShapes, config: MosaicConfig, device: DeviceFacts):
  from wts_jax.pallas.mosaic_walk import MosaicSpec
  reason = _refusal(head, shapes, config)
  if reason is not None:
    return Refusal(reason)
  if uses_stacked_kernel(head, shapes, config):
    return _stacked_plan(head, shapes, config, device)
  if uses_batched_kernel(head, shapes, config):
    return _batched_plan(head, shapes, config, device)
  try:
    mosaic_plan = make_plan(head, config, device, batch=shapes.batch,
                            base_itemsize=shapes.base_itemsize)
  except ValueError as err:
    return Refusal(str(err))
  return MosaicSpec(plan=mosaic_plan, batch=shapes.batch, steps=shapes.steps,
                    greedy=shapes.greedy, spin_limit=config.sync_spin_limit,
                    interpret=config.interpret)


def launch(spec, operands: WalkOperands):
  mode = operands.mode
  if isinstance(spec, WithLogits):
    from wts_jax.reference import logits_of_tokens
    output = launch(spec.inner, operands)
    logits, logprobs = logits_of_tokens(
        operands.head, operands.base_logits, operands.first_tokens, output.tokens,
        operands.hidden, mode.score_scale, return_logits=spec.logits,
        return_logprobs=spec.logprobs)
    return dataclasses.replace(output, logits=logits, logprobs=logprobs)
  from wts_jax.pallas.mosaic_batched_walk import BatchedSpec
  from wts_jax.pallas.stacked_walk import StackedSpec
  if isinstance(spec, StackedSpec):
    return _launch_stacked(spec, operands.head, operands.base_logits,
                           operands.first_tokens, operands.hidden, mode.score_scale,
                           mode.noise_on, mode.seed)
  if isinstance(spec, BatchedSpec):
    return _launch_batched(spec, operands.head, operands.base_logits,
                           operands.first_tokens, operands.hidden, mode.score_scale,
                           mode.noise_on, mode.seed)
  return _launch(spec, operands.head, operands.base_logits, operands.first_tokens,
                 operands.hidden, mode.score_scale, mode.noise_on, mode.seed)


@functools.partial(jax.jit, static_argnames=("spec",))
def _launch(spec: MosaicSpec, head, base_logits, first_tokens, hidden, score_scale,
            noise_on, seed):
  from wts_jax.output import WalkOutput
  from wts_jax.pallas.mosaic_walk import mosaic_walk
  first, status = _first_tokens(head, first_tokens, spec.plan.vocab_size)
  operands = serial_operands(head, hidden)
  w1 = operands["w1"]
  gate = ({} if not spec.plan.gated else
          dict(gate_weight=operands["gate_weight"], gate_hoisted=operands["gate_hoisted"]))
  z_source = dict(w1=w1)
  if spec.plan.int8_state:   # the z tile holds W1's interleaved int8 planes
    z_source = dict(w1=operands["w1_planes"], w1_scale=operands["w1_plane_scale"])
  tokens, kernel_status = mosaic_walk(spec, operands["w2"], base_logits,
                                      first_tokens=first, seed=seed,
                                      score_scale=score_scale, noise_on=noise_on,
                                      w2_scale=operands.get("w2_scale"),
                                      **z_source, **gate)
  return WalkOutput(tokens=tokens, status=status | kernel_status,
                    confidence=confidence_logits(head, hidden, first, tokens, w1))


def _first_tokens(head, first_tokens, vocab):
  """(the first tokens, the status they set). The Mosaic kernels clamp the first tokens
  and report those outside [0, V) themselves, so without a confidence head they go in
  as given, with no op before the launch; the confidence logits read the W1 rows of
  the clamped ids, so with one they are clamped here too."""
  if head.confidence_head is None:
    return first_tokens.astype(jnp.int32), jnp.int32(0)
  from wts_jax.reference import clamp_first_tokens
  return clamp_first_tokens(first_tokens, vocab)


def confidence_logits(head, hidden, first, tokens, w1):
  """The confidence logits from the drafted tokens, or None without a confidence head:
  c_k reads e_k = W1[x_{k-1}], so the tokens give all K of them at once."""
  conf_head = head.confidence_head
  if conf_head is None:
    return None
  from wts_jax.reference import previous_tokens
  previous = previous_tokens(first, tokens)
  return (conf_head.hoist(hidden) + jax.vmap(conf_head.serial, in_axes=1,
                                             out_axes=1)(w1[previous]))


@functools.partial(jax.jit, static_argnames=("spec",))
def _launch_stacked(spec, head, base_logits, first_tokens, hidden, score_scale, noise_on,
                    seed):
  """The stacked kernel, one launch per 64 rows."""
  from wts_jax.output import WalkOutput
  from wts_jax.pallas.stacked_walk import (row_launches, stacked_walk, w1_planes_operand,
                                           w2_operand)
  first, status = _first_tokens(head, first_tokens, spec.plan.vocab_size)
  operands = serial_operands(head, hidden)
  tokens = []
  for rows, part in row_launches(spec):
    sampling = None if spec.greedy else (score_scale[rows], noise_on[rows], seed)
    part_tokens, part_status = stacked_walk(
        part, w2_operand(part, operands), base_logits[rows], w1_planes_operand(part, operands),
        first[rows], operands["w2_scale"], operands["w1_plane_scale"], sampling=sampling)
    tokens.append(part_tokens)
    status = status | part_status
  tokens = tokens[0] if len(tokens) == 1 else jnp.concatenate(tokens, axis=0)
  return WalkOutput(tokens=tokens, status=status,
                    confidence=confidence_logits(head, hidden, first, tokens,
                                                 operands["w1"]))


@functools.partial(jax.jit, static_argnames=("spec",))
def _launch_batched(spec, head, base_logits, first_tokens, hidden, score_scale, noise_on,
                    seed):
  """The batched kernel, one launch per 64 rows (the rows of a walk are independent)."""
  from wts_jax.output import WalkOutput
  from wts_jax.pallas.mosaic_batched_walk import batched_walk, row_launches
  first, status = _first_tokens(head, first_tokens, spec.plan.vocab_size)
  operands = serial_operands(head, hidden)
  w1 = operands["w1"]
  weights = dict(w2=operands["w2"], w1=w1)
  if spec.plan.scaled:   # an int8 W2's per-row scales
    weights["w2_scale"] = operands["w2_scale"]
  if spec.plan.int8_state:
    weights.update(w1=operands["w1_planes"], w1_scale=operands["w1_plane_scale"])
  if spec.plan.gate_table:   # each token's e and G_e e, gathered as one row
    weights["w1"] = operands["gate_rows"]
  if spec.plan.joint_table:   # each token's J_e e, gathered as one row
    weights["w1"] = operands["joint_rows"]
  if spec.plan.w2_row_scale and not spec.plan.widened_in_kernel:
    # int8 values are exact in bf16; the scales come after
    weights["w2"] = widen.widen(operands["w2"], spec.widen_op, interpret=spec.interpret)
  tokens, kernel_status = [], status
  for rows, part in row_launches(spec, spec.batch):
    sampled = {} if spec.greedy else dict(seed=seed, score_scale=score_scale[rows],
                                           noise_on=noise_on[rows])
    update = {}   # the head's own update weights and hoisted terms
    if spec.plan.gated:
      update = dict(gate_weight=operands["gate_weight"],
                    gate_hoisted=operands["gate_hoisted"][rows])
    elif spec.plan.recurrent:
      update = dict(joint_weight=operands["joint_weight"],
                    joint_hoisted=operands["joint_hoisted"][rows])
    part_tokens, part_status = batched_walk(part, base_logits=base_logits[rows],
                                            first_tokens=first[rows], **weights, **sampled,
                                            **update)
    tokens.append(part_tokens)
    kernel_status = kernel_status | part_status
  tokens = tokens[0] if len(tokens) == 1 else jnp.concatenate(tokens, axis=0)
  return WalkOutput(tokens=tokens, status=kernel_status,
                    confidence=confidence_logits(head, hidden, first, tokens, w1))
