"""The Weights-That-Stay walk for many batch rows: one persistent Mosaic GPU kernel with
the batch on the tensor cores — on the WGMMA's M (``batch_axis="m"``) or on its N
(``"n"``; ``plan.py`` says why either, and ``auto.py`` which the planner takes).

Per block (one per SM) and step (``BatchedWalk.step``):

- z of all rows is a WGMMA operand (A on M, B on N), staged from the rows' gathered W1
  rows, its head's update applied (``z_staging``, ``head_update`` and its strategies);
- per 64-row W2 chunk (resident in shared memory, or streamed through the TMA ring that
  runs ahead across steps, odd steps in reverse as in the row kernel: ``rings``) one
  WGMMA into an fp32 accumulator (``chunks``), the chunk's base logits (through their
  own TMA ring) added and its top-1 folded into the bests (``epilogue``);
- the leader exchanges each row's best over the grid and requests the next z
  (``exchange``).

With two warpgroups (``plan.warpgroups``) each owns half of the block's chunks (its own
resident chunks, rings, base slots and accumulators) and they overlap each other's
latencies. Warpgroup 0 stages z and runs the exchange: it hands the WGMMA tile to
warpgroup 1 through an mbarrier (``za_bar``), and warpgroup 1 hands back its best per
row through shared memory (``merge_bar``); warpgroup 1 waits for nothing else, so it can
never run a step ahead (its next step starts on warpgroup 0's next ``za_bar``). With a
producer (``plan.producer``) one more warpgroup issues every refill (``rings``).

Int8 planes (``wts_jax.int8_state``): two int8 WGMMAs a chunk, s32 accumulators, D = 256
· d_hi + d_lo exact, then (f32(D) · s_lo) · scale2 — each row's s_lo loaded by a thread
of its own after the planes' copies. A hi + lo bf16 pair of z (the gated and rnn heads)
is two WGMMAs into one accumulator — or, with the batch on N (``plan.pair_on_n``), one
WGMMA over both halves' rows whose two column blocks are summed.

Scope (``mosaic_batched_backend.plan`` says why otherwise): the vanilla head (z = e, a W1
row) with a bf16 W1 and W2 (z exact in bf16) or an int8 W2 that z meets as two int8
planes, the gated head with a bf16 W1, W2 and gate, and the rnn head (split, or from its
joint table) with a bf16 W1, W2 and joint_proj (no producer for either). Up to 64 rows a
launch (``launch.py``), greedy and sampled; no logits written (the backend computes them
after the walk when asked). Interpret mode runs one block owning every chunk.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import sampling
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched.chunks import Chunks, StepInputs
from wts_jax.pallas.batched.context import WalkContext
from wts_jax.pallas.batched.epilogue import Epilogue
from wts_jax.pallas.batched.exchange import Exchange
from wts_jax.pallas.batched.head_update import HeadUpdate
from wts_jax.pallas.batched.rings import Rings
from wts_jax.pallas.batched.spec import CONSUMER_REGISTERS, BatchedRefs, BatchedSpec
from wts_jax.pallas.batched.update_gate_table import GateTable
from wts_jax.pallas.batched.update_joint_table import JointTable
from wts_jax.pallas.batched.update_redundant_gate import RedundantGate
from wts_jax.pallas.batched.update_split import SplitUpdate
from wts_jax.pallas.batched.z_staging import ZStaging


def head_update(walk) -> HeadUpdate:
  """The head-update strategy ``walk.plan`` asks for."""
  plan = walk.plan
  if plan.gate_table:
    return GateTable(walk)
  if plan.joint_table:
    return JointTable(walk)
  if plan.split:
    return SplitUpdate(walk)
  if plan.gated:
    return RedundantGate(walk)
  return HeadUpdate(walk)


class BatchedWalk(ZStaging, Rings, Chunks, Epilogue, Exchange, WalkContext):
  """One block's walk: its parts' methods over the kernel's facts."""

  def __init__(self, refs: BatchedRefs, spec: BatchedSpec):
    super().__init__(refs, spec)
    self.update = head_update(self)

  def run(self):
    if self.plan.producer:
      pl.when(self.wg == self.wgs)(self.producer)
      pl.when(self.wg < self.wgs)(self.consumer)
    else:
      self.consumer()

  def consumer(self):
    """A computing warpgroup: its chunks' WGMMAs and epilogues, and (the leader) z and
    the exchange."""
    refs = self.refs
    if self.plan.producer and self.wgs > 1:   # the producer gave its registers up
      plgpu.set_max_registers(CONSUMER_REGISTERS, action="increase")
    given_first = self.prologue()
    sampled = None
    if not self.spec.greedy:
      sampled = ((refs.seed_g[0], refs.seed_g[1]),
                 gpu.load(refs.scale_g.at[pl.ds(0, self.batch_width)], self.per_batch_row,
                          optimized=False),
                 gpu.load(refs.noise_g.at[pl.ds(0, self.batch_width)], self.per_batch_row,
                          optimized=False) != 0)
    flags = lax.fori_loop(0, self.spec.steps, functools.partial(self.step, sampled),
                          self.first_tokens_flag(given_first))
    self.write_status(flags)

  def prologue(self):
    """Zeros where no copy writes, the rings started, the first tokens (as given:
    ``first_g`` is ``batch_width`` long, the caller's rows, zeros past them; clamped for
    the walk, checked for the status) and the first gather, the update's resident rows.
    Returns the first tokens as given."""
    refs, plan = self.refs, self.plan
    with jax.named_scope("prologue"):
      short_base = self.n_major and self.base_copy_rows < self.rows
      if self.zero_padded_rows or short_base:
        if self.zero_padded_rows:
          self.leader_only(self.zero_staging)
        self.zero_base_slots(short_base)
        plgpu.commit_smem()   # the generic writes before any async copy lands beside them
      self.start_rings()
      given_first = gpu.load(refs.first_g.at[pl.ds(0, self.batch_width)], self.per_batch_row,
                             optimized=False)
      self.leader_only(functools.partial(self.first_z, given_first))
      if self.update.has_resident_rows:
        self.leader_only(self.update.resident_rows)
      if plan.scaled:
        plgpu.barrier_wait(refs.w2_scale_bar.at[self.wg])
    return given_first

  def step(self, sampled, step, flags):
    """One step: z staged, this warpgroup's chunks folded, the step's end."""
    plane_scale = self.staged_z(step)
    at = StepInputs(step, plane_scale)
    if sampled is not None:
      seeds, row_scale, row_noise = sampled
      streams = sampling.stream_key(seeds, self.row_ids + self.spec.row_offset, step)
      at = StepInputs(step, plane_scale, *(
          lax.broadcast_in_dim(value, self.tile, (self.batch_axis,))
          for value in (streams, row_scale, row_noise)))
    carry = self.all_chunks(at)
    return self.step_end(step, carry, flags)


def _batched_kernel(*refs, spec: BatchedSpec, names: tuple[str, ...]):
  BatchedWalk(BatchedRefs(**dict(zip(names, refs))), spec).run()


def body(spec: BatchedSpec, names: tuple[str, ...]):
  """The kernel body ``plgpu.kernel`` launches for ``spec``: its refs arrive in the order
  of ``names`` (operands, outputs, scratch). The launch keeps the body function's name."""
  return functools.partial(_batched_kernel, spec=spec, names=names)
