"""The Mosaic stacked kernel's backend (``impl="mosaic_stacked"``): from a head and
validated inputs to the launches of ``stacked_walk`` (the vanilla head's int8 W2 met by
z as two int8 planes stacked on the WGMMA's M, four warpgroups, up to 64 rows a launch).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from wts_jax.device import DeviceFacts
from wts_jax.pallas import mosaic_launch
from wts_jax.pallas.protocol import Refusal, WalkOperands, WalkShapes
from wts_jax.pallas.head_operands import serial_operands
from wts_jax.pallas.mosaic_plan import launch_facts
from wts_jax.walk_config import MosaicStackedConfig

# The base logits by TMA copies above this many rows (one block of 32 requests), by the
# threads' async copies up to it (``docs/decisions.md``: the stacked kernel's base
# logits).
STACKED_TMA_BASE_ABOVE = 32

supported_on = mosaic_launch.supported_on


def refusal(head, shapes: WalkShapes, config: MosaicStackedConfig) -> str | None:
  """What the stacked kernel runs, and what it does not."""
  serial = head.markov_head
  if head.config.head_type != "vanilla" or not serial.z_as_int8_planes:
    return ("the stacked kernel runs the vanilla head with an int8 W2 that z meets as two "
            "int8 planes (quantize_w2(head, 'int8', state='planes'))")
  if shapes.base_itemsize != 2:
    return "the stacked kernel needs bf16 base logits"
  vocab, rank = head.config.vocab_size, head.config.rank
  if vocab % 2 or vocab < 64 or rank % 32:
    return (f"the stacked kernel needs an even V of at least 64 and r a multiple of 32 "
            f"(V={vocab}, r={rank})")
  return mosaic_launch.interpret_blocks_refusal(config)


def plan(head, shapes: WalkShapes, config: MosaicStackedConfig, device: DeviceFacts):
  """The kernel build of this walk (a ``StackedSpec``, in a ``WithLogits`` when logits or
  log-probabilities are asked for), or why the stacked kernel cannot run it."""
  from wts_jax.pallas.stacked.plan import MAX_BATCH, plan_stacked
  from wts_jax.pallas.stacked.spec import StackedSpec
  reason = refusal(head, shapes, config)
  if reason is not None:
    return Refusal(reason)
  num_sms, smem = launch_facts(config, device)
  rows = min(shapes.batch, MAX_BATCH)
  vocab = head.config.vocab_size
  gpu = not config.interpret
  try:
    stacked = plan_stacked(vocab_size=vocab, rank=head.config.rank, batch=rows,
                           num_blocks=config.num_blocks or num_sms, smem_per_block=smem,
                           ring_stages=config.ring_stages, base_slots=2 if gpu else 0,
                           base_copies=("tma" if gpu and rows > STACKED_TMA_BASE_ABOVE
                                        and vocab % 8 == 0 else "threads"))
  except ValueError as err:
    return Refusal(str(err))
  # W1's planes in the threads' load order (the head carries them: ``W1Planes``); the
  # interpreted gather reads rows. The base logits copied into shared memory a tile
  # ahead, by TMA above one block of requests; the warps' requests rotated and the warps
  # past the batch idle in the fold; the status reduced in the kernel; W2 in its threads'
  # row order where the head holds it and the plan has base slots (each measured:
  # ``docs/decisions.md``, the stacked kernel).
  thread_rows = (gpu and stacked.base_slots
                 and hasattr(head.markov_head.markov_w2, "thread_rows"))
  spec = StackedSpec(plan=stacked, batch=shapes.batch, steps=shapes.steps,
                     smem_per_block=smem, ring_stages=config.ring_stages,
                     spin_limit=config.sync_spin_limit, interpret=config.interpret,
                     greedy=shapes.greedy, w1_order="fragments" if gpu else "rows",
                     w2_order="thread_rows" if thread_rows else "rows",
                     rotate_warps=gpu, skip_idle_warps=gpu,
                     status=config.status or "kernel")
  return mosaic_launch.with_logits(spec, shapes)


def launch(spec, operands: WalkOperands):
  return mosaic_launch.launch_with_logits(_launch_stacked, spec, operands)


@functools.partial(jax.jit, static_argnames=("spec",))
def _launch_stacked(spec, head, base_logits, first_tokens, hidden, score_scale, noise_on,
                    seed):
  """The stacked kernel, one launch per 64 rows."""
  from wts_jax.output import WalkOutput
  from wts_jax.pallas.stacked.launch import stacked_walk
  from wts_jax.pallas.stacked.spec import row_launches, w1_planes_operand, w2_operand
  first, status = mosaic_launch.first_tokens(head, first_tokens, spec.plan.vocab_size)
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
                    confidence=mosaic_launch.confidence_logits(head, hidden, first, tokens,
                                                               operands["w1"]))
