"""``pallas-stepwise``: the strongest step-wise kernel — one fused Pallas launch per step.

The ablation that separates what weight residency buys from what fusion buys: each of
the K launches gathers ``e = W1[x_{k-1}]``, advances the head, runs the W2 GEMV over its
shard, adds the base logits and selects, exactly like one step of the persistent kernel
(the same ``ShardStep`` code) — but W2 is re-read from HBM at every step and the grid is
as large as the vocabulary needs, not co-resident.

Cross-program selection without a spin: every program publishes its candidates, then
increments the step's counter (acquire-release); the program that sees the count reach
``G - 1`` is the last one, and it alone reduces all slots and writes the step's outputs
("last block done"). Nothing waits, so nothing can hang, and interpret mode (programs
in sequence) runs the same code with many programs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from wts_jax.heads.draft_head import DraftHead
from wts_jax.output import STATUS_NAN_LOGITS, STATUS_TOKEN_OUT_OF_RANGE, WalkOutput
from wts_jax.pallas import triton_backend
from wts_jax.pallas.protocol import WalkShapes
from wts_jax.pallas.plan import WalkPlan, next_power_of_two, padded_batch
from wts_jax.pallas.shard_step import (KernelSpec, ShardStep, launch,
                                       optional_output_names, status_bit,
                                       step_output_shapes, weight_input_names)
from wts_jax.validation import Sampling

KERNEL_NAME = "wts_stepwise_walk_step"
ROWS_PER_PROGRAM = 1024
TILE_ROWS = 64


def stepwise_plan(vocab_size: int, rank: int, batch: int, w2_itemsize: int,
                  rows_per_program: int = ROWS_PER_PROGRAM) -> WalkPlan:
  rows = min(rows_per_program, -(-vocab_size // TILE_ROWS) * TILE_ROWS)
  return WalkPlan(num_programs=-(-vocab_size // rows), rows_per_program=rows,
                  tile_rows=TILE_ROWS, resident_tiles=0, padded_batch=padded_batch(batch),
                  num_warps=8, vocab_size=vocab_size, rank=rank, w2_itemsize=w2_itemsize,
                  resident_budget_bytes=0)


def _carried_names(spec: KernelSpec) -> list[str]:
  """Buffers threaded through all K launches (inputs aliased to outputs)."""
  names = ["tokens", "status", "counters"] + optional_output_names(spec)
  return names + (["state"] if spec.head_type == "rnn" else [])


def _input_names(spec: KernelSpec) -> list[str]:
  return weight_input_names(spec) + ["first_tokens"] + [
      name + "_in" for name in _carried_names(spec)]


def _output_names(spec: KernelSpec) -> list[str]:
  return _carried_names(spec) + ["slot_scores", "slot_index"]


def _step_kernel(*refs, spec: KernelSpec, step: int):
  refs = dict(zip(_input_names(spec) + _output_names(spec), refs))
  shard = ShardStep(refs, spec)
  zero, vocab = shard.zero, spec.plan.vocab_size
  step_index = zero + step
  status = jnp.int32(0) + zero
  if step == 0:
    prev = pl_triton.load(refs["first_tokens"].at[shard.batch_ids], mask=shard.batch_valid,
                          other=0)
    out_of_range = shard.batch_valid & ((prev < 0) | (prev >= vocab))
    status = status_bit(jnp.max(out_of_range.astype(jnp.int32)) > 0,
                        STATUS_TOKEN_OUT_OF_RANGE)
    prev = jnp.clip(prev, 0, vocab - 1)
  else:
    prev = pl_triton.load(refs["tokens"].at[shard.batch_ids, step_index - 1],
                          mask=shard.batch_valid, other=0)
  state = shard.initial_state()
  if spec.head_type == "rnn" and step > 0:
    # Double-buffered by step parity: launch k reads what launch k-1 wrote.
    state = [pl_triton.load(refs["state"].at[
        zero + step % 2, shard.batch_ids[:, None], shard.chunk_cols(c)[None, :]])
             for c in range(shard.num_chunks)]
  e = shard.gather_embedding(prev)
  state, z = shard.advance(step_index, e, state)
  cand = shard.scan_shard(step_index, z, resident=[])
  shard.publish(zero, cand)
  status = status | status_bit(jnp.max(cand.nan_seen) > 0, STATUS_NAN_LOGITS)
  if not spec.interpret:
    pl_triton.debug_barrier()  # every thread's slot stores precede the release below
  arrived = pl_triton.atomic_add(refs["counters"], step_index, zero + 1)
  pl_triton.atomic_max(refs["status"], zero, status)

  @pl.when(arrived == spec.plan.num_programs - 1)
  def _last_program():
    token, chosen, lse = shard.reduce_slots(zero)
    shard.write_step_outputs(step_index, token, chosen, lse, e, mask=shard.batch_valid)
    if spec.head_type == "rnn":
      for c, chunk in enumerate(state):
        pl_triton.store(refs["state"].at[zero + (step + 1) % 2, shard.batch_ids[:, None],
                                         shard.chunk_cols(c)[None, :]], chunk)


def stepwise_walk(head: DraftHead, base_logits, first_tokens, hidden, mode: Sampling, *,
                  return_logits: bool = False, return_logprobs: bool = False,
                  interpret: bool = False,
                  rows_per_program: int = ROWS_PER_PROGRAM) -> WalkOutput:
  """The walk as K fused step kernels (same contract and outputs as ``walk``)."""
  batch, _, vocab = base_logits.shape
  w2_dtype = jnp.dtype(head.markov_head.markov_w2.weight.dtype)
  plan = stepwise_plan(vocab, head.config.rank, batch, w2_dtype.itemsize,
                       rows_per_program)
  # spin_limit is unused: the step kernels never wait (last-program reduction).
  shapes = WalkShapes.of(base_logits, mode.greedy, return_logits=return_logits,
                         return_logprobs=return_logprobs)
  spec = triton_backend.kernel_spec(head, shapes, plan, spin_limit=1, interpret=interpret)
  return _launch_steps(spec, head, base_logits, first_tokens, hidden, mode.score_scale,
                       mode.noise_on, mode.seed)


@functools.partial(jax.jit, static_argnames=("spec",))
def _launch_steps(spec: KernelSpec, head, base_logits, first_tokens, hidden, score_scale,
                  noise_on, seed) -> WalkOutput:
  plan = spec.plan
  inputs = triton_backend.kernel_inputs(spec, head, hidden, score_scale, noise_on, seed)
  inputs["base_logits"] = base_logits
  inputs["first_tokens"] = first_tokens.astype(jnp.int32)
  shapes = step_output_shapes(spec, next_power_of_two(plan.num_programs), 1)
  shapes["status"] = jax.ShapeDtypeStruct((1,), jnp.int32)
  shapes["counters"] = jax.ShapeDtypeStruct((spec.steps,), jnp.int32)
  shapes["state"] = jax.ShapeDtypeStruct((2, plan.padded_batch, plan.rank), jnp.float32)
  carried = {name: jnp.zeros(shapes[name].shape, shapes[name].dtype)
             for name in _carried_names(spec)}
  in_names, out_names = _input_names(spec), _output_names(spec)
  aliases = {in_names.index(name + "_in"): out_names.index(name) for name in carried}
  for step in range(spec.steps):
    args = dict(inputs, **{name + "_in": value for name, value in carried.items()})
    outputs = launch(functools.partial(_step_kernel, spec=spec, step=step), spec,
                     name=KERNEL_NAME, inputs=args, in_names=in_names,
                     out_names=out_names, shapes=shapes, aliases=aliases)
    carried = {name: outputs[name] for name in carried}
  confidence = carried.get("confidence", inputs.get("conf_hoisted_only"))
  return WalkOutput(tokens=carried["tokens"], status=carried["status"].reshape(()),
                    confidence=confidence, logits=carried.get("logits"),
                    logprobs=carried.get("logprobs"))
