"""One program's work for one walk step over its W2 shard (Pallas Triton), shared by the
persistent kernel (``triton_walk``) and the step-wise ablation kernel (``stepwise``).

A ``ShardStep`` is built inside a kernel from its refs (by name) and its static spec;
its methods are the pieces of a step: the head's serial update (all of it, or this
program's slice of it: ``plan.serial_update``), the scan of the shard's tiles into a
program's candidates, publishing them, and reducing all programs' slots to the chosen
tokens with the per-step outputs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from wts_jax import sampling
from wts_jax.pallas import tile_math
from wts_jax.pallas.plan import WalkPlan, next_power_of_two


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """Everything static about one kernel build."""

  plan: WalkPlan
  batch: int
  steps: int
  hidden_size: int
  head_type: str            # vanilla | gated | rnn
  quantized: bool           # W2 stored int8/fp8 with a per-row scale
  greedy: bool
  confidence: bool          # the head has a confidence head reading e_k
  return_logits: bool
  return_logprobs: bool
  spin_limit: int
  interpret: bool
  num_stages: int = 1  # the streamed loop prefetches by hand


def splits_serial_update(spec: KernelSpec) -> bool:
  """Whether the programs split the head's serial update (gated/rnn, plan ``split``)."""
  return spec.head_type != "vanilla" and spec.plan.serial_update == "split"


def weight_input_names(spec: KernelSpec) -> list[str]:
  """Inputs both kernels take, in order (each kernel adds its own around them)."""
  names = ["w2"] + (["w2_scale"] if spec.quantized else []) + ["w1", "base_logits"]
  if spec.head_type == "gated":
    names += ["gate_hoisted", "gate_weight"]
  elif spec.head_type == "rnn":
    names += ["joint_hoisted", "joint_weight"]
  if spec.confidence:
    names += ["conf_hoisted", "conf_weight"]
  if not spec.greedy:
    names += ["seed", "score_scale", "noise_on"]
  return names


class ShardStep:
  """The per-step work of program ``pl.program_id(0)`` (see the module docstring).

  r-vectors, tiles and weight blocks are lists of column chunks (``tile_math``)."""

  def __init__(self, refs: dict, spec: KernelSpec):
    self.refs, self.spec = refs, spec
    plan = self.plan = spec.plan
    self.rank, self.tile = plan.rank, plan.tile_rows
    self.width = tile_math.chunk_width(plan.rank)
    self.num_chunks = plan.rank // self.width
    self.program = pl.program_id(0)
    self.zero = self.program * 0       # a traced 0: see tile_math's note on indices
    self.row0 = pl.multiple_of(self.program * plan.rows_per_program, plan.tile_rows)
    self.batch_ids = lax.broadcasted_iota(jnp.int32, (plan.padded_batch,), 0)
    self.batch_valid = self.batch_ids < spec.batch
    self.cols = lax.broadcasted_iota(jnp.int32, (self.width,), 0)
    self.tile_iota = lax.broadcasted_iota(jnp.int32, (plan.tile_rows,), 0)
    if spec.confidence:
      self.conf_w_e = [pl_triton.load(refs["conf_weight"].at[
          self.zero, spec.hidden_size + self.chunk_cols(c)]).astype(jnp.float32)
                       for c in range(self.num_chunks)]
    if not spec.greedy:
      # Two scalar words (a vector would need a slice, which Triton cannot lower).
      self.seed = (pl_triton.load(refs["seed"].at[self.zero]),
                   pl_triton.load(refs["seed"].at[self.zero + 1]))
      self.score_scale = pl_triton.load(refs["score_scale"].at[self.batch_ids],
                                        mask=self.batch_valid, other=1.0)
      self.noise_on = pl_triton.load(refs["noise_on"].at[self.batch_ids],
                                     mask=self.batch_valid, other=0) != 0

  def chunk_cols(self, chunk: int):
    return chunk * self.width + self.cols

  # --- W2 tiles ----------------------------------------------------------------------
  def tile_rows(self, t):
    rows = self.row0 + t * self.tile + self.tile_iota
    return rows, rows < self.plan.vocab_size

  def load_w2_tile(self, t):
    """Tile ``t`` of the shard: ([T, c] column chunks, per-row scale [T] or None)."""
    rows, valid = self.tile_rows(t)
    chunks = [pl_triton.load(self.refs["w2"].at[rows[:, None], self.chunk_cols(c)[None, :]],
                             mask=valid[:, None], other=0)
              for c in range(self.num_chunks)]
    scale = (pl_triton.load(self.refs["w2_scale"].at[rows], mask=valid, other=0.0)
             if self.spec.quantized else None)
    return chunks, scale

  # --- the head ----------------------------------------------------------------------
  def gather_embedding(self, tokens):
    """``e = W1[tokens]``: chunks [BP, c] fp32 (bf16 values)."""
    return [pl_triton.load(self.refs["w1"].at[tokens[:, None], self.chunk_cols(c)[None, :]])
            .astype(jnp.float32) for c in range(self.num_chunks)]

  def _hoisted(self, name, step, columns, valid=None):
    mask = self.batch_valid[:, None]
    if valid is not None:
      mask = mask & valid[None, :]
    return pl_triton.load(
        self.refs[name].at[self.batch_ids[:, None], step, columns[None, :]],
        mask=mask, other=0.0)

  def _weight_block(self, name, out_chunk, in_offset):
    """[c, c] block of a [out, in] weight: output chunk ``out_chunk``, inputs from
    ``in_offset``. Read from L2 each step, so registers go to W2."""
    out_rows = self.chunk_cols(out_chunk)
    return [pl_triton.load(self.refs[name].at[
        out_rows[:, None], in_offset + self.chunk_cols(c)[None, :]])
            for c in range(self.num_chunks)]

  def advance(self, step, e, state):
    """The head's serial update: (state chunks, z chunks [BP, c] fp32)."""
    spec, n = self.spec, self.num_chunks
    if spec.head_type == "vanilla":
      return state, e
    e_ops = [tile_math.make_operand(chunk, exact_in_bf16=True) for chunk in e]
    if spec.head_type == "gated":
      z = []
      for j in range(n):
        pre = self._hoisted("gate_hoisted", step, self.chunk_cols(j)) + (
            tile_math.small_product(e_ops,
                                    self._weight_block("gate_weight", j, spec.hidden_size)))
        z.append(jax.nn.sigmoid(pre) * e[j])
      return state, z
    s_ops = [tile_math.make_operand(chunk, exact_in_bf16=False) for chunk in state]
    pre = []
    for j in range(3 * n):  # output chunks of (gate, candidate, output), [s ; e ; h] in
      pre.append(self._hoisted("joint_hoisted", step, self.chunk_cols(j))
                 + tile_math.small_product(s_ops, self._weight_block("joint_weight", j, 0))
                 + tile_math.small_product(e_ops, self._weight_block("joint_weight", j,
                                                                     self.rank)))
    new_state, z = [], []
    for j in range(n):
      update = jax.nn.sigmoid(pre[j])
      new_state.append(update * state[j] + (1.0 - update) * jnp.tanh(pre[n + j]))
      z.append(jnp.tanh(pre[2 * n + j]))
    return new_state, z

  def initial_state(self):
    rows = self.plan.padded_batch
    if self.spec.head_type == "rnn" and not self.split_serial:
      return [jnp.zeros((rows, self.width), jnp.float32) for _ in range(self.num_chunks)]
    return [jnp.zeros((rows, 1), jnp.float32)]

  # --- the split serial update -------------------------------------------------------
  # Slice ``i`` is output columns [i·w, (i+1)·w) of z (and of the rnn state); program p
  # computes slices p, p + G, ... (< plan.serial_slices) in fp32 on CUDA cores, stores
  # them in ``serial[step]`` ([K, fields, BP, r]: z, then the rnn state), and after a
  # grid barrier every program reads the whole z back (``load_serial``).
  @property
  def split_serial(self) -> bool:
    return splits_serial_update(self.spec)

  def _slice(self, round_):
    """(columns [w], valid [w]) of this program's slice in round ``round_``."""
    plan = self.plan
    index = self.program + round_ * plan.num_programs
    columns = index * plan.serial_slice_cols + lax.broadcasted_iota(
        jnp.int32, (plan.serial_slice_cols,), 0)
    return columns, jnp.broadcast_to(index < plan.serial_slices, columns.shape)

  def _serial_groups(self):
    """(weight, hoisted, output row offsets, input column offsets) of the head."""
    if self.spec.head_type == "gated":   # [r, d + r], inputs [h ; e]
      return "gate_weight", "gate_hoisted", (0,), (self.spec.hidden_size,)
    rank = self.rank                     # [3r, 2r + d], inputs [s ; e ; h]
    return "joint_weight", "joint_hoisted", (0, rank, 2 * rank), (0, rank)

  def serial_weights(self, round_):
    """This program's slice of the serial weights in round ``round_``: for each output
    group, for each input, column chunks [w, c] (bf16)."""
    name, _, outputs, inputs = self._serial_groups()
    columns, valid = self._slice(round_)
    return [[[pl_triton.load(self.refs[name].at[
        out + columns[:, None], offset + self.chunk_cols(c)[None, :]],
        mask=valid[:, None], other=0) for c in range(self.num_chunks)]
             for offset in inputs] for out in outputs]

  def resident_serial_weights(self):
    """The weight slices of every round, loaded once (or None: loaded every step)."""
    if not (self.split_serial and self.plan.serial_weights_resident):
      return None
    return [self.serial_weights(i) for i in range(self.plan.serial_slice_rounds)]

  def _serial_row(self, step, field, columns, mask=None, volatile=False):
    return pl_triton.load(
        self.refs["serial"].at[step, self.zero + field, self.batch_ids[:, None],
                               columns[None, :]],
        mask=mask, other=None if mask is None else 0.0, volatile=volatile)

  def publish_serial(self, step, tokens, e, weights):
    """Compute and store this program's slices of step ``step``'s z (and rnn state).
    ``e``: the full embedding chunks of ``tokens``; ``weights``: resident slices or None.
    The rnn state of step - 1 comes from ``serial[step - 1]`` (zero at step 0)."""
    _, hoisted, outputs, _ = self._serial_groups()
    rnn = self.spec.head_type == "rnn"
    vectors = e  # the input chunks: e, or [s ; e]
    if rnn:
      has_state = jnp.broadcast_to(step > 0, (self.plan.padded_batch, self.width))
      previous = jnp.maximum(step - 1, 0)
      vectors = [self._serial_row(previous, 1, self.chunk_cols(c), mask=has_state,
                                  volatile=True) for c in range(self.num_chunks)] + e
    for round_ in range(self.plan.serial_slice_rounds):
      columns, valid = self._slice(round_)
      blocks = self.serial_weights(round_) if weights is None else weights[round_]
      pre = [self._hoisted(hoisted, step, out + columns, valid)
             + tile_math.slice_product(vectors, [c for chunks in group for c in chunks])
             for out, group in zip(outputs, blocks)]
      mask = jnp.broadcast_to(valid[None, :], (self.plan.padded_batch, columns.shape[0]))
      if rnn:
        state_slice = self._serial_row(previous, 1, columns, mask=mask & (step > 0),
                                       volatile=True)
        update = jax.nn.sigmoid(pre[0])
        new_state = update * state_slice + (1.0 - update) * jnp.tanh(pre[1])
        z = jnp.tanh(pre[2])
        pl_triton.store(self.refs["serial"].at[
            step, self.zero + 1, self.batch_ids[:, None], columns[None, :]], new_state,
                        mask=mask)
      else:
        e_slice = pl_triton.load(self.refs["w1"].at[tokens[:, None], columns[None, :]],
                                 mask=mask, other=0).astype(jnp.float32)
        z = jax.nn.sigmoid(pre[0]) * e_slice
      pl_triton.store(self.refs["serial"].at[
          step, self.zero, self.batch_ids[:, None], columns[None, :]], z, mask=mask)

  def load_serial(self, step):
    """Every program's slices of step ``step``'s z: chunks [BP, c] fp32. Volatile: the
    slices were stored by other SMs and L1 is not coherent."""
    return [self._serial_row(step, 0, self.chunk_cols(c), volatile=True)
            for c in range(self.num_chunks)]

  # --- the shard scan ----------------------------------------------------------------
  def selection(self, step) -> tile_math.Selection:
    if self.spec.greedy:
      return tile_math.Selection(greedy=True, track_lse=self.spec.return_logprobs)
    return tile_math.Selection(
        greedy=False, track_lse=self.spec.return_logprobs, score_scale=self.score_scale,
        noise_on=self.noise_on,
        streams=sampling.stream_key(self.seed, self.batch_ids, self.zero + step))

  def _process_tile(self, step, operands, selection, cand, t, tile):
    chunks, scale = tile
    rows, valid = self.tile_rows(t)
    partial = tile_math.product(operands, chunks)
    if scale is not None:
      partial = partial * scale[None, :]
    out_mask = self.batch_valid[:, None] & valid[None, :]
    index = (self.batch_ids[:, None], step, rows[None, :])
    base = pl_triton.load(self.refs["base_logits"].at[index], mask=out_mask, other=0.0)
    logits = base.astype(jnp.float32) + partial
    if self.spec.return_logits:
      pl_triton.store(self.refs["logits"].at[index], logits, mask=out_mask)
    return tile_math.update_lanes(cand, logits, rows, valid, self.batch_valid, selection)

  def scan_shard(self, step, z, resident) -> tile_math.Candidates:
    """All tiles of the shard — the resident ones (already on chip), then the streamed
    ones, each loaded one iteration ahead — into per-row candidates [BP]."""
    exact = self.spec.head_type == "vanilla"  # z = e: bf16 values, no lo part needed
    operands = [tile_math.make_operand(chunk, exact_in_bf16=exact) for chunk in z]
    selection = self.selection(step)
    cand = tile_math.Candidates.empty((self.plan.padded_batch, self.tile))
    for t, tile in enumerate(resident):
      cand = self._process_tile(step, operands, selection, cand, t, tile)
    first_streamed, tiles = len(resident), self.plan.tiles_per_program
    if first_streamed < tiles:
      def streamed(t, carry):
        cand, tile = carry
        upcoming = self.load_w2_tile(t + 1)  # in flight while this tile computes
        return self._process_tile(step, operands, selection, cand, t, tile), upcoming

      cand, _ = lax.fori_loop(first_streamed, tiles, streamed,
                              (cand, self.load_w2_tile(first_streamed)))
    return tile_math.reduce_lanes(cand, axis=1)

  # --- the exchange ------------------------------------------------------------------
  def publish(self, slot, cand: tile_math.Candidates):
    """Store this program's per-row candidates in slot row ``slot`` of
    ``slot_scores`` [S, 4, G, BP] and ``slot_index`` [S, G, BP]."""
    fields = (cand.best_score, cand.chosen_scaled, cand.lse_max, cand.lse_sum)
    for field, value in enumerate(fields):
      pl_triton.store(self.refs["slot_scores"].at[
          slot, self.zero + field, self.program, self.batch_ids], value)
    pl_triton.store(self.refs["slot_index"].at[slot, self.program, self.batch_ids],
                    cand.best_index)

  def reduce_slots(self, slot):
    """All programs' candidates → (token, chosen_scaled, lse) [BP]. Loads are volatile:
    the slots were written by other SMs and L1 is not coherent."""
    num_programs = self.plan.num_programs
    programs = lax.broadcasted_iota(jnp.int32, (next_power_of_two(num_programs),), 0)
    valid = (programs < num_programs)[:, None]

    def read(field, other):
      return pl_triton.load(self.refs["slot_scores"].at[
          slot, self.zero + field, programs[:, None], self.batch_ids[None, :]],
          mask=valid, other=other, volatile=True)

    index = pl_triton.load(
        self.refs["slot_index"].at[slot, programs[:, None], self.batch_ids[None, :]],
        mask=valid, other=tile_math.INDEX_SENTINEL, volatile=True)
    every = tile_math.Candidates(
        best_score=read(0, tile_math.NEG_INF), best_index=index,
        chosen_scaled=read(1, tile_math.NEG_INF), lse_max=read(2, tile_math.NEG_INF),
        lse_sum=read(3, 0.0), nan_seen=jnp.zeros(index.shape, jnp.int32))
    return tile_math.chosen_token(tile_math.reduce_lanes(every, axis=0, valid=valid),
                                  self.plan.vocab_size)

  def write_step_outputs(self, step, token, chosen, lse, e, mask):
    """Tokens, log-probabilities and confidence of step ``step`` (rows where ``mask``)."""
    refs, index = self.refs, (self.batch_ids, step)
    pl_triton.store(refs["tokens"].at[index], token, mask=mask)
    if self.spec.return_logprobs:
      pl_triton.store(refs["logprobs"].at[index], chosen - lse, mask=mask)
    if self.spec.confidence:
      conf = pl_triton.load(refs["conf_hoisted"].at[index], mask=self.batch_valid,
                            other=0.0)
      products = e[0] * self.conf_w_e[0][None, :]
      for chunk, weight in zip(e[1:], self.conf_w_e[1:]):
        products = products + chunk * weight[None, :]
      conf = conf + jnp.sum(products, axis=1)  # one cross-thread reduction per step
      pl_triton.store(refs["confidence"].at[index], conf, mask=mask)


def status_bit(flag: jax.Array, bit: int) -> jax.Array:
  """``bit`` where ``flag`` else 0, as int32 (Triton needs both operands of ``|`` i32)."""
  return jnp.where(flag, jnp.int32(bit), jnp.int32(0)).astype(jnp.int32)


def step_output_shapes(spec: KernelSpec, num_programs_padded: int, slot_steps: int):
  """Shapes of the outputs both kernels share (slot rows per step: ``slot_steps``)."""
  batch, steps, plan = spec.batch, spec.steps, spec.plan
  return {
      "tokens": jax.ShapeDtypeStruct((batch, steps), jnp.int32),
      "slot_scores": jax.ShapeDtypeStruct(
          (slot_steps, 4, num_programs_padded, plan.padded_batch), jnp.float32),
      "slot_index": jax.ShapeDtypeStruct(
          (slot_steps, num_programs_padded, plan.padded_batch), jnp.int32),
      "confidence": jax.ShapeDtypeStruct((batch, steps), jnp.float32),
      "logits": jax.ShapeDtypeStruct((batch, steps, plan.vocab_size), jnp.float32),
      "logprobs": jax.ShapeDtypeStruct((batch, steps), jnp.float32),
  }


def launch(body, spec: KernelSpec, *, name: str, inputs: dict, in_names: list[str],
           out_names: list[str], shapes: dict, aliases: dict[int, int]) -> dict:
  """One ``pallas_call`` of ``body`` over the plan's grid; inputs and outputs by name."""
  call = pl.pallas_call(
      body,
      out_shape=[shapes[out] for out in out_names],
      grid=(spec.plan.num_programs,),
      input_output_aliases=aliases,
      interpret=spec.interpret,
      compiler_params=pl_triton.CompilerParams(num_warps=spec.plan.num_warps,
                                               num_stages=spec.num_stages),
      name=name,
  )
  return dict(zip(out_names, call(*[inputs[key] for key in in_names])))


def optional_output_names(spec: KernelSpec) -> list[str]:
  return ((["confidence"] if spec.confidence else [])
          + (["logits"] if spec.return_logits else [])
          + (["logprobs"] if spec.return_logprobs else []))
