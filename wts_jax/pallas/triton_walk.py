"""The Weights-That-Stay walk as one persistent Pallas kernel (Triton backend).

One ``pallas_call`` with a grid of ``plan.num_programs`` co-resident programs and a
``fori_loop`` over the K steps inside. Program ``p`` owns a shard of W2 rows; its first
``plan.resident_tiles`` tiles are loaded once before the loop and stay in registers for
every step; the rest are streamed each step. Per step every program gathers
``e = W1[x_{k-1}]`` for the batch, advances the head, scans its shard into local
candidates (top-1 and log-sum-exp), publishes them, meets the others at the grid barrier
of ``grid_sync``, and reduces all programs' candidates to the same token. Program 0
writes the per-step outputs.

The gated/rnn head advances ``redundant``-ly (every program computes all of z) or
``split`` (``plan.serial_update``): each program computes its slice of z (and of the
rnn state) from weight slices kept on chip, stores it in ``serial[k]``, and a second
barrier per step (counter ``K + k``) precedes every program's read of the whole z.

Kernel-side contract = the reference's (``wts_jax.reference``): fp32 logits, fp32 ``z``
and serial state (met by bf16 weights in fp32 on CUDA cores, or as hi + lo bf16 parts
on tensor cores), fp32 accumulation, ties to the lowest index, Gumbel noise from
``wts_jax.sampling``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as pl_triton

from wts_jax.output import (STATUS_NAN_LOGITS, STATUS_SYNC_TIMEOUT,
                            STATUS_TOKEN_OUT_OF_RANGE)
from wts_jax.pallas import grid_sync
from wts_jax.pallas.plan import next_power_of_two
from wts_jax.pallas.shard_step import (KernelSpec, ShardStep, launch,
                                       optional_output_names, splits_serial_update,
                                       status_bit, step_output_shapes,
                                       weight_input_names)

KERNEL_NAME = "wts_persistent_walk"


def _input_names(spec: KernelSpec) -> list[str]:
  return weight_input_names(spec) + ["first_tokens", "counters", "status_in"]


def _output_names(spec: KernelSpec) -> list[str]:
  return (["tokens", "status", "counters_out", "slot_scores", "slot_index"]
          + (["serial"] if splits_serial_update(spec) else [])
          + optional_output_names(spec))


def _walk_kernel(*refs, spec: KernelSpec):
  refs = dict(zip(_input_names(spec) + _output_names(spec), refs))
  shard = ShardStep(refs, spec)
  plan, zero = spec.plan, shard.zero
  num_programs = plan.num_programs

  # Invariant: these tiles are loaded once and stay on chip for all K steps.
  resident = [shard.load_w2_tile(t) for t in range(plan.resident_tiles)]
  serial_weights = shard.resident_serial_weights()  # split: this program's slices

  first = pl_triton.load(refs["first_tokens"].at[shard.batch_ids], mask=shard.batch_valid,
                         other=0)
  out_of_range = shard.batch_valid & ((first < 0) | (first >= plan.vocab_size))
  status0 = status_bit(jnp.max(out_of_range.astype(jnp.int32)) > 0,
                       STATUS_TOKEN_OUT_OF_RANGE)
  first = jnp.clip(first, 0, plan.vocab_size - 1)

  def step_body(step, carry):
    prev, state, status = carry
    e = shard.gather_embedding(prev)
    if shard.split_serial:
      shard.publish_serial(step, prev, e, serial_weights)
      if num_programs > 1:
        timed_out = grid_sync.arrive_and_wait(refs["counters_out"], spec.steps + step,
                                              num_programs=num_programs,
                                              spin_limit=spec.spin_limit, zero=zero)
        status = status | status_bit(timed_out, STATUS_SYNC_TIMEOUT)
      z = shard.load_serial(step)
    else:
      state, z = shard.advance(step, e, state)
    cand = shard.scan_shard(step, z, resident)
    shard.publish(step, cand)  # slot row `step` is never reused within a walk
    status = status | status_bit(jnp.max(cand.nan_seen) > 0, STATUS_NAN_LOGITS)
    if num_programs > 1:
      timed_out = grid_sync.arrive_and_wait(refs["counters_out"], step,
                                            num_programs=num_programs,
                                            spin_limit=spec.spin_limit, zero=zero)
      status = status | status_bit(timed_out, STATUS_SYNC_TIMEOUT)
    token, chosen, lse = shard.reduce_slots(step)
    shard.write_step_outputs(step, token, chosen, lse, e,
                             mask=shard.batch_valid & (shard.program == 0))
    return token, state, status

  _, _, status = lax.fori_loop(0, spec.steps, step_body,
                               (first, shard.initial_state(), status0))
  if num_programs > 1:
    # Status words combine by max: a timeout (4) dominates NaN (1) / range (2).
    pl_triton.atomic_max(refs["status"], zero, status)
  else:
    pl_triton.store(refs["status"].at[zero], status)


def persistent_walk(spec: KernelSpec, inputs: dict[str, jax.Array]) -> dict:
  """Launch the kernel once. ``inputs`` maps the input names (without the sync buffers)
  to arrays; returns the outputs by name."""
  plan, steps = spec.plan, spec.steps
  # Barrier counters: one per step for the token exchange, one more for a split update.
  counters = steps * (2 if splits_serial_update(spec) else 1)
  inputs = dict(inputs)
  inputs["counters"] = jnp.zeros((counters,), jnp.int32)
  inputs["status_in"] = jnp.zeros((1,), jnp.int32)
  shapes = step_output_shapes(spec, next_power_of_two(plan.num_programs), steps)
  shapes["status"] = jax.ShapeDtypeStruct((1,), jnp.int32)
  shapes["counters_out"] = jax.ShapeDtypeStruct((counters,), jnp.int32)
  fields = 2 if spec.head_type == "rnn" else 1  # z, and the rnn state
  shapes["serial"] = jax.ShapeDtypeStruct((steps, fields, plan.padded_batch, plan.rank),
                                          jnp.float32)
  in_names, out_names = _input_names(spec), _output_names(spec)
  # The sync buffers are zero-filled inputs aliased to outputs (the kernel uses the
  # output refs): the only kernel state that must start at a known value.
  aliases = {in_names.index("counters"): out_names.index("counters_out"),
             in_names.index("status_in"): out_names.index("status")}
  return launch(functools.partial(_walk_kernel, spec=spec), spec, name=KERNEL_NAME,
                inputs=inputs, in_names=in_names, out_names=out_names, shapes=shapes,
                aliases=aliases)
