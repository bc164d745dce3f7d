"""The Mosaic row kernel's backend (``impl="mosaic_row"``): from a head and validated
inputs to one launch of the row kernel (``pallas/row``: 64 W2 rows on the WGMMA's M, up
to 4 batch rows on N).

``plan`` refuses what the kernel cannot run (its scope: ``row/kernel.py``'s docstring) and
makes the shared-memory plan (``mosaic_plan``); ``launch`` launches exactly it, then
computes the confidence logits from the drafted tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from wts_jax.device import DeviceFacts
from wts_jax.pallas import mosaic_launch
from wts_jax.pallas.protocol import Refusal, WalkOperands, WalkShapes
from wts_jax.pallas.head_operands import serial_operands
from wts_jax.pallas.mosaic_plan import MAX_BATCH, make_plan
from wts_jax.walk_config import MosaicRowConfig

HEAD_TYPES = ("vanilla", "gated")   # the head types the row kernel has an ``advance`` for

supported_on = mosaic_launch.supported_on


def refusal(head, shapes: WalkShapes, config: MosaicRowConfig) -> str | None:
  """Why the row kernel cannot run this walk, or None."""
  serial = head.markov_head
  head_type = head.config.head_type
  if head_type not in HEAD_TYPES:
    return (f"the Mosaic row kernel runs the vanilla and gated heads (not {head_type!r}; "
            "the batched kernel runs the rnn head: impl='mosaic_batched')")
  reason = mosaic_launch.weights_refusal(head)
  if reason is not None:
    return reason
  if shapes.batch > MAX_BATCH:
    return (f"the Mosaic row kernel runs up to {MAX_BATCH} rows (B={shapes.batch}); "
            "impl='mosaic_batched' runs more")
  w1_dtype = jnp.dtype(serial.markov_w1.weight.dtype)
  planes = serial.z_as_int8_planes
  if planes and (config.gemv == "registers" or head_type != "vanilla"):
    return ("an int8 W2 whose z meets it as two int8 planes runs on the WGMMA GEMV, "
            "vanilla head (gemv='auto' or 'wgmma')")
  if (config.gemv == "wgmma" and not planes
      and w1_dtype != jnp.dtype(jnp.bfloat16)):
    return f"the WGMMA GEMV needs a bf16 W1 (got {w1_dtype})"
  return mosaic_launch.interpret_blocks_refusal(config)


def plan(head, shapes: WalkShapes, config: MosaicRowConfig, device: DeviceFacts):
  """The kernel build of this walk (a ``RowSpec``, in a ``WithLogits`` when logits or
  log-probabilities are asked for), or why the row kernel cannot run it."""
  from wts_jax.pallas.row.spec import RowSpec
  reason = refusal(head, shapes, config)
  if reason is not None:
    return Refusal(reason)
  try:
    mosaic_plan = make_plan(head, config, device, batch=shapes.batch,
                            base_itemsize=shapes.base_itemsize)
  except ValueError as err:
    return Refusal(str(err))
  spec = RowSpec(plan=mosaic_plan, batch=shapes.batch, steps=shapes.steps,
                    greedy=shapes.greedy, spin_limit=config.sync_spin_limit,
                    interpret=config.interpret)
  return mosaic_launch.with_logits(spec, shapes)


def launch(spec, operands: WalkOperands):
  return mosaic_launch.launch_with_logits(_launch, spec, operands)


@functools.partial(jax.jit, static_argnames=("spec",))
def _launch(spec, head, base_logits, first_tokens, hidden, score_scale, noise_on, seed):
  from wts_jax.output import WalkOutput
  from wts_jax.pallas.row.launch import row_walk
  first, status = mosaic_launch.first_tokens(head, first_tokens, spec.plan.vocab_size)
  operands = serial_operands(head, hidden)
  w1 = operands["w1"]
  gate = ({} if not spec.plan.gated else
          dict(gate_weight=operands["gate_weight"], gate_hoisted=operands["gate_hoisted"]))
  z_source = dict(w1=w1)
  if spec.plan.int8_state:   # the z tile holds W1's interleaved int8 planes
    z_source = dict(w1=operands["w1_planes"], w1_scale=operands["w1_plane_scale"])
  tokens, kernel_status = row_walk(spec, operands["w2"], base_logits,
                                      first_tokens=first, seed=seed,
                                      score_scale=score_scale, noise_on=noise_on,
                                      w2_scale=operands.get("w2_scale"),
                                      **z_source, **gate)
  return WalkOutput(tokens=tokens, status=status | kernel_status,
                    confidence=mosaic_launch.confidence_logits(head, hidden, first, tokens,
                                                               w1))
