"""The Mosaic batched kernel's backend (``impl="mosaic_batched"``): from a head and
validated inputs to the launches of ``pallas/batched`` (up to 64 batch rows a
launch, on the WGMMA's M or N; the vanilla, gated and rnn heads).

``resolve`` fills every choice a ``MosaicBatchedConfig`` leaves to the planner (the
``auto_*`` rules of ``batched/auto``, measured on the H200): what a tuned table
writes out as data. ``plan`` refuses what the kernel cannot run and plans the resolved
config; ``launch`` launches exactly it, one launch per 64 rows.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from wts_jax.device import DeviceFacts
from wts_jax.gate_table import has_gate_table
from wts_jax.joint_table import has_joint_table
from wts_jax.pallas import mosaic_launch, widen
from wts_jax.pallas.protocol import Refusal, WalkOperands, WalkShapes
from wts_jax.pallas.head_operands import serial_operands
from wts_jax.pallas.batched.auto import (AUTO_JOINT_TABLE_MAX_ROWS, auto_base_stages,
                                         auto_batch_axis, auto_merge_tiles,
                                         auto_overlap_chunks, auto_producer,
                                         auto_ring_preference, auto_ring_refill,
                                         auto_w2_widening, auto_warp_gather,
                                         auto_warpgroups)
from wts_jax.pallas.batched.plan import (BATCH_TILE, GATE_TABLE_MAX_ROWS,
                                         JOINT_TABLE_MAX_ROWS, plan_batched,
                                         warpgroup_chunks)
from wts_jax.pallas.mosaic_launch import BATCH_ON_N_LOWERS
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS, launch_facts
from wts_jax.walk_config import MosaicBatchedConfig, resident_units

HEAD_TYPES = ("vanilla", "gated", "rnn")

supported_on = mosaic_launch.supported_on


def refusal(head, shapes: WalkShapes, config: MosaicBatchedConfig) -> str | None:
  """Why the batched kernel cannot run this walk, or None."""
  serial = head.markov_head
  head_type = head.config.head_type
  if head_type not in HEAD_TYPES:
    return ("the batched Mosaic kernel runs the vanilla, gated and rnn heads (not "
            f"{head_type!r})")
  reason = mosaic_launch.weights_refusal(head)
  if reason is not None:
    return reason
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
  # An int8 W2 (with its per-row scales) that z does not meet as planes goes to the
  # kernel widened to bf16, scaled in the epilogue (``w2_row_scale``).
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
    reason = _in_registers_refusal(shapes, config)
    if reason is not None:
      return reason
  if not serial.z_as_int8_planes and (w1 != bf16 or not w2_as_bf16):
    return ("the batched Mosaic kernel needs a bf16 W1 with a bf16 or int8 W2, or an int8 "
            "W2 that z meets as two int8 planes (quantize_w2(head, 'int8', "
            f"state='planes')); got {w1}, {w2}")
  reason = mosaic_launch.interpret_blocks_refusal(config)
  if reason is not None:
    return reason
  on_n = _batch_on_n_refusal(shapes)
  if config.batch_axis == "n" and on_n is not None:
    return f"batch_axis='n' needs {on_n}"
  return None


def _batch_on_n_refusal(shapes: WalkShapes) -> str | None:
  """What the batch on N needs that this walk lacks (its base tile is loaded transposed),
  or None."""
  if not BATCH_ON_N_LOWERS:
    return "jax >= 0.11 (jax 0.10's Mosaic GPU cannot lower the transposed base-tile load)"
  if shapes.base_itemsize != 2:
    return ("bf16 base logits (Mosaic GPU cannot lower the transposed load of a "
            f"{shapes.base_itemsize}-byte base tile)")
  return None


def _table_refusal(head, shapes: WalkShapes, config: MosaicBatchedConfig) -> str | None:
  """Why ``serial_update="table"`` cannot run this walk, or None."""
  if head.config.head_type == "rnn":
    return _joint_table_refusal(head, shapes, config)
  if head.config.head_type != "gated" or not has_gate_table(head.markov_head):
    return ("serial_update='table' needs a gated head with its gate table "
            "(wts_jax.with_gate_table(head)) or an rnn head with its joint table "
            "(wts_jax.with_joint_table(head))")
  reason = _table_axis_refusal(shapes, config)
  if reason is not None:
    return reason
  if shapes.batch > GATE_TABLE_MAX_ROWS:
    return (f"serial_update='table' runs up to {GATE_TABLE_MAX_ROWS} rows, the batch on N "
            f"(B={shapes.batch}; 'split' runs more)")
  return None


def _joint_table_refusal(head, shapes: WalkShapes,
                         config: MosaicBatchedConfig) -> str | None:
  """Why ``serial_update="table"`` cannot run this rnn walk, or None."""
  if not has_joint_table(head.markov_head):
    return ("serial_update='table' needs an rnn head with its joint table "
            "(wts_jax.with_joint_table(head))")
  if shapes.batch > JOINT_TABLE_MAX_ROWS:
    return (f"serial_update='table' runs the rnn head up to {JOINT_TABLE_MAX_ROWS} rows "
            f"(B={shapes.batch}; 'split' runs more)")
  if config.warpgroups == 2 or config.producer:
    return ("serial_update='table' runs the rnn head on one warpgroup, no producer (got "
            f"warpgroups={config.warpgroups}, producer={config.producer})")
  return _table_axis_refusal(shapes, config)


def _table_axis_refusal(shapes: WalkShapes, config: MosaicBatchedConfig) -> str | None:
  """Why ``serial_update="table"`` (either table) cannot put this walk's batch on N, or
  None."""
  if config.batch_axis == "m":
    return "serial_update='table' needs the batch on N (batch_axis 'n' or None)"
  reason = _batch_on_n_refusal(shapes)
  if reason is not None:
    return f"serial_update='table' needs the batch on N, which needs {reason}"
  return None


def joint_table_walk(head, shapes: WalkShapes, config: MosaicBatchedConfig) -> bool:
  """Whether the kernel takes this rnn head's J_e e from its joint table: asked for
  (``serial_update="table"``), or under "auto" where the head has one, the walk is one
  the table runs (``_joint_table_refusal``) and has at most
  ``AUTO_JOINT_TABLE_MAX_ROWS`` rows."""
  if head.config.head_type != "rnn" or not has_joint_table(head.markov_head):
    return False
  if config.serial_update == "table":
    return True
  return (config.serial_update == "auto" and shapes.batch <= AUTO_JOINT_TABLE_MAX_ROWS
          and _joint_table_refusal(head, shapes, config) is None)


def gate_table_walk(head, shapes: WalkShapes, config: MosaicBatchedConfig) -> bool:
  """Whether the kernel takes this gated head's gate from its table: asked for
  (``serial_update="table"``), or under "auto" where the head has one, the batch goes on
  N (the planner's axis) and is at most ``GATE_TABLE_MAX_ROWS`` rows."""
  if head.config.head_type != "gated" or not has_gate_table(head.markov_head):
    return False
  if config.serial_update == "table":
    return True
  rows = min(shapes.batch, BATCH_TILE)
  return (config.serial_update == "auto" and _batch_on_n_refusal(shapes) is None
          and shapes.batch <= GATE_TABLE_MAX_ROWS
          and (config.batch_axis or auto_batch_axis(rows, int8_state=False,
                                                    greedy=shapes.greedy)) == "n")


def w2_widened(head) -> bool:
  """Whether the kernel meets this head's W2 widened to bf16 with its row scales (an
  int8 W2 that z does not meet as two int8 planes)."""
  serial = head.markov_head
  return (jnp.dtype(serial.markov_w2.weight.dtype) == jnp.dtype(jnp.int8)
          and not serial.z_as_int8_planes)


def _in_registers_refusal(shapes: WalkShapes, config: MosaicBatchedConfig) -> str | None:
  """Why this config cannot widen an int8 W2 in registers, or None: the one condition that
  refuses an explicit ``w2_widening="registers"`` and that ``auto`` checks before
  choosing it."""
  if config.interpret:
    return ("w2_widening='registers' runs on the GPU only (Pallas interpret mode's WGMMA "
            "reads its A operand from shared memory: w2_widening='smem')")
  if config.batch_axis == "m":
    return ("w2_widening='registers' needs the batch on N (the chunk is the WGMMA's A "
            "operand: batch_axis 'n' or None)")
  reason = _batch_on_n_refusal(shapes)
  if reason is not None:
    return f"w2_widening='registers' needs the batch on N, which needs {reason}"
  return None


def w2_widening(head, shapes: WalkShapes, config: MosaicBatchedConfig) -> str:
  """Where the kernel widens this head's W2 (``BatchedPlan.w2_widening``): "xla" for a W2
  that needs no widening; else the config's choice, or under "auto" the planner's
  (``auto_w2_widening``)."""
  if not w2_widened(head):
    return "xla"
  if config.w2_widening != "auto":
    return config.w2_widening
  return auto_w2_widening(
      min(shapes.batch, BATCH_TILE), batch_axis=config.batch_axis,
      gate_split=head.config.head_type != "gated" or config.serial_update != "redundant",
      in_registers_lowers=_in_registers_refusal(shapes, config) is None,
      recurrent=head.config.head_type == "rnn", greedy=shapes.greedy)


def _serial_update(head, table: bool, joint: bool, config: MosaicBatchedConfig) -> str:
  """The head's update as the plan runs it: "table", "redundant", "split", or "auto"
  for the vanilla head (which has none)."""
  if table or joint:
    return "table"
  if head.config.head_type == "vanilla":
    return config.serial_update
  return "redundant" if config.serial_update == "redundant" else "split"


def resolve(head, shapes: WalkShapes, config: MosaicBatchedConfig,
            device: DeviceFacts):
  """``(config with every planner choice written out, its plan)``, or a ``Refusal``.
  The choices: the batch axis, the update's form, the W2's widening, the computing
  warpgroups (the planner's second one dropped where it does not fit), the producer,
  the merged tiles, the base ring, the status and the ring's refill."""
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
      rows, int8_state=planes, greedy=shapes.greedy,
      batch_on_n_lowers=_batch_on_n_refusal(shapes) is None, rank=rank))
  # (A table gate's walk is the vanilla head's but for the elementwise gate: the planner's
  # vanilla choices. A joint table's walk runs one warpgroup: ``_joint_table_refusal``.)
  wgs = 1 if joint else config.warpgroups or auto_warpgroups(
      axis, int8_state=planes, greedy=shapes.greedy, gated=gated and not table, batch=rows,
      w2_in_registers=widening == "registers", recurrent=recurrent,
      w2_row_scale=w2_row_scale)
  update_head = (gated and not table) or recurrent   # (the auto_* functions' ``gated``)

  def planned(wgs: int):
    chosen = dataclasses.replace(
        config, batch_axis=axis, warpgroups=wgs, w2_widening=widening,
        serial_update=_serial_update(head, table, joint, config),
        producer=(config.producer if config.producer is not None else
                  auto_producer(axis, wgs, int8_state=planes, greedy=shapes.greedy,
                                gated=update_head)),
        merge_tiles=(config.merge_tiles if config.merge_tiles is not None else
                     auto_merge_tiles(axis, wgs, rows, gated=update_head)),
        base_stages=(config.base_stages if config.base_stages is not None else
                     auto_base_stages(axis, wgs, gated=update_head, recurrent=recurrent,
                                      w2_row_scale=w2_row_scale)))
    wg_chunks = warpgroup_chunks(vocab, blocks, wgs)
    batched = plan_batched(
        vocab_size=vocab, rank=rank, batch=rows,
        num_sms=num_sms, smem_per_block=smem, num_blocks=blocks, warpgroups=wgs,
        # A row count is the block's, shared by its warpgroups.
        resident_chunks=resident_units(config.residency, wg_chunks, CHUNK_ROWS * wgs),
        ring_stages=config.ring_stages, base_stages=chosen.base_stages,
        base_itemsize=shapes.base_itemsize, snake=config.snake,
        w2_itemsize=(2 if w2_row_scale and widening == "xla" else
                     jnp.dtype(head.markov_head.markov_w2.weight.dtype).itemsize),
        int8_state=planes, w2_row_scale=w2_row_scale, w2_widening=widening,
        batch_axis=axis, producer=chosen.producer,
        gated=gated,
        gate_split=gated and not table and config.serial_update != "redundant",
        gate_table=table,
        recurrent=recurrent, joint_table=joint, merge_tiles=chosen.merge_tiles,
        overlap_chunks=auto_overlap_chunks(axis, rows, greedy=shapes.greedy,
                                           gated=update_head,
                                           widened_in_kernel=widening != "xla"),
        warp_gather=auto_warp_gather(axis, int8_state=planes),
        ring_preference=auto_ring_preference(
            recurrent=recurrent, joint_table=joint,
            redundant_gate=gated and not table and config.serial_update == "redundant"))
    return chosen, batched

  try:
    chosen, batched = planned(wgs)
  except ValueError as err:
    if config.warpgroups or wgs == 1:
      return Refusal(str(err))
    # The planner's second warpgroup does not fit beside what this walk stages (say a
    # W2 widened through a bf16 tile a warpgroup): one warpgroup, not another kernel.
    try:
      chosen, batched = planned(1)
    except ValueError:
      return Refusal(str(err))
  # The status reduced in the kernel (no reduce op after the launch) where it measured
  # faster: bf16 and int8 W2, every head; with int8 planes after the launch (slower in
  # the kernel for their sampled walks on N: ``docs/decisions.md``).
  status = config.status or ("flags" if batched.int8_state else "kernel")
  ring_refill = config.ring_refill or auto_ring_refill(
      batched.ring_stages, widened_in_kernel=batched.widened_in_kernel)
  return dataclasses.replace(chosen, status=status, ring_refill=ring_refill), batched


def plan(head, shapes: WalkShapes, config: MosaicBatchedConfig, device: DeviceFacts):
  """The kernel build of this walk (a ``BatchedSpec``, in a ``WithLogits`` when logits
  or log-probabilities are asked for), or why the batched kernel cannot run it."""
  from wts_jax.pallas.batched.spec import BatchedSpec
  reason = refusal(head, shapes, config)
  if reason is not None:
    return Refusal(reason)
  resolved = resolve(head, shapes, config, device)
  if isinstance(resolved, Refusal):
    return resolved
  chosen, batched = resolved
  if chosen.ring_refill == "before_epilogue" and batched.widened_in_kernel:
    return Refusal("ring_refill='before_epilogue' needs W2 slots that only WGMMAs read "
                   f"(this plan widens its int8 W2 in the kernel: "
                   f"w2_widening={batched.w2_widening!r})")
  spec = BatchedSpec(plan=batched, batch=shapes.batch, steps=shapes.steps,
                     greedy=shapes.greedy, spin_limit=config.sync_spin_limit,
                     interpret=config.interpret, status=chosen.status,
                     ring_refill=chosen.ring_refill)
  return mosaic_launch.with_logits(spec, shapes)


def launch(spec, operands: WalkOperands):
  return mosaic_launch.launch_with_logits(_launch_batched, spec, operands)


@functools.partial(jax.jit, static_argnames=("spec",))
def _launch_batched(spec, head, base_logits, first_tokens, hidden, score_scale, noise_on,
                    seed):
  """The batched kernel, one launch per 64 rows (the rows of a walk are independent)."""
  from wts_jax.output import WalkOutput
  from wts_jax.pallas.batched.launch import batched_walk
  from wts_jax.pallas.batched.spec import row_launches
  first, status = mosaic_launch.first_tokens(head, first_tokens, spec.plan.vocab_size)
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
    weights["w2"] = widen.widen_to_bf16(operands["w2"], interpret=spec.interpret)
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
                    confidence=mosaic_launch.confidence_logits(head, hidden, first, tokens,
                                                               w1))
