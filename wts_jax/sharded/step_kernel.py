"""The sharded walk's step as one Pallas launch per device (``impl="pallas"``): the
fallback form of a kernel in a sharded walk, the exchange between launches.

Each step, on each device, one ``pallas_call`` over tiles of the device's W2 rows: every
program multiplies its tile by z (``pallas.tile_math``: fp32 accumulation, an fp32 z met
on tensor cores as two bf16 parts), adds the step's base logits, writes the logits when
asked, and reduces its tile to one candidate a batch row (the best score with the lowest
global column, the scaled logit there, a log-sum-exp); the programs' candidates are then
reduced in XLA and exchanged across devices (``exchange``). The head's update (r-sized)
stays in XLA, replicated. The Gumbel noise is drawn by global column, so the kernel's
tokens are the XLA walk's.

W2 is read where it lies, by rows ``[V_local, r]`` or as an engine's kernel
``[r, V_local]``. An int8 W2 met by z as two int8 planes (``quantize_w2(...,
state="planes")``) is refused: this kernel meets a quantized W2 with an fp32 z.

This re-reads the device's W2 slice every step, like the step-wise walk; the persistent
form keeps it on chip and exchanges inside the kernel (``device_exchange_mgpu``).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from wts_jax import sampling
from wts_jax.heads.engine import uses_w2_kernel
from wts_jax.pallas import tile_math
from wts_jax.pallas.plan import padded_batch
from wts_jax.sharded.local_walk import StepInputs, StepScores

KERNEL_NAME = "wts_sharded_walk_step"


@dataclasses.dataclass(frozen=True)
class StepKernelConfig:
  """The sharded step kernel's options: ``tile_rows`` W2 rows a program (a power of two),
  ``interpret`` to run it in Pallas interpret mode (CPU)."""
  tile_rows: int = 128
  num_warps: int = 4
  interpret: bool = False

  def __post_init__(self):
    if self.tile_rows < 16 or self.tile_rows & (self.tile_rows - 1):
      raise ValueError(f"tile_rows={self.tile_rows} must be a power of two >= 16")


def scores_for(config) -> "StepKernelScores":
  if config is None:
    config = StepKernelConfig()
  if not isinstance(config, StepKernelConfig):
    raise TypeError(f"config={config!r} must be None or a StepKernelConfig for the sharded "
                    "step kernel (impl='pallas' on a sharded head)")
  return StepKernelScores(config)


@dataclasses.dataclass(frozen=True)
class KernelShape:
  """Everything static about one build of the step kernel."""
  batch: int
  padded_batch: int
  local_vocab: int
  rank: int
  tile_rows: int
  quantized: bool
  w2_kernel_layout: bool     # W2 as [r, V_local] (an engine's kernel), else [V_local, r]
  z_exact_in_bf16: bool      # z = a bf16 W1 row (the vanilla head): no low part needed
  greedy: bool
  return_logits: bool
  return_logprobs: bool
  num_warps: int
  interpret: bool

  @property
  def num_programs(self) -> int:
    return -(-self.local_vocab // self.tile_rows)


def _refusal(serial) -> str | None:
  rank = serial.config.rank
  if serial.z_as_int8_planes:
    return ("the sharded step kernel meets an int8 W2 with an fp32 z; this head's z meets "
            "it as two int8 planes (quantize_w2(..., state='planes')): use impl='xla', or "
            "quantize with state='float'")
  if rank < 16 or rank & (rank - 1):
    return f"rank={rank} must be a power of two >= 16 for the sharded step kernel"
  return None


CANDIDATE_FIELDS = ("best_score", "best_index", "chosen_scaled", "lse_max", "lse_sum",
                    "nan_seen")


def _input_names(shape: KernelShape) -> list[str]:
  return (["z", "w2"] + (["w2_scale"] if shape.quantized else [])
          + ["base_logits", "step", "column_offset"]
          + ([] if shape.greedy else ["streams", "score_scale", "noise_on"]))


def _output_names(shape: KernelShape) -> list[str]:
  return list(CANDIDATE_FIELDS) + (["logits"] if shape.return_logits else [])


def _kernel(*refs, shape: KernelShape):
  refs = dict(zip(_input_names(shape) + _output_names(shape), refs))
  program = pl.program_id(0)
  zero = program * 0    # traced indices only (tile_math's note)
  tile = shape.tile_rows
  local = program * tile + lax.broadcasted_iota(jnp.int32, (tile,), 0)
  valid = local < shape.local_vocab
  batch_ids = lax.broadcasted_iota(jnp.int32, (shape.padded_batch,), 0)
  batch_valid = batch_ids < shape.batch
  width = tile_math.chunk_width(shape.rank)
  chunk_cols = lax.broadcasted_iota(jnp.int32, (width,), 0)

  operands, weights = [], []
  for c in range(shape.rank // width):
    cols = zero + c * width + chunk_cols
    z = pl_triton.load(refs["z"].at[batch_ids[:, None], cols[None, :]])
    operands.append(tile_math.make_operand(z, exact_in_bf16=shape.z_exact_in_bf16))
    if shape.w2_kernel_layout:
      block = pl_triton.load(refs["w2"].at[cols[:, None], local[None, :]],
                             mask=valid[None, :], other=0)
      weights.append(block.T)
    else:
      weights.append(pl_triton.load(refs["w2"].at[local[:, None], cols[None, :]],
                                    mask=valid[:, None], other=0))
  partial = tile_math.product(operands, weights)               # [BP, T] fp32
  if shape.quantized:
    scale = pl_triton.load(refs["w2_scale"].at[local], mask=valid, other=0.0)
    partial = partial * scale[None, :]

  step = pl_triton.load(refs["step"].at[zero])
  offset = pl_triton.load(refs["column_offset"].at[zero])
  out_mask = batch_valid[:, None] & valid[None, :]
  base = pl_triton.load(refs["base_logits"].at[batch_ids[:, None], step, local[None, :]],
                        mask=out_mask, other=0.0)
  logits = base.astype(jnp.float32) + partial
  if shape.return_logits:
    pl_triton.store(refs["logits"].at[batch_ids[:, None], local[None, :]], logits,
                    mask=out_mask)

  if shape.greedy:
    selection = tile_math.Selection(greedy=True, track_lse=shape.return_logprobs)
  else:
    selection = tile_math.Selection(
        greedy=False, track_lse=shape.return_logprobs,
        score_scale=pl_triton.load(refs["score_scale"].at[batch_ids]),
        noise_on=pl_triton.load(refs["noise_on"].at[batch_ids]) != 0,
        streams=pl_triton.load(refs["streams"].at[batch_ids]))
  cand = tile_math.update_lanes(tile_math.Candidates.empty(logits.shape), logits,
                                offset + local, valid, batch_valid, selection)
  reduced = tile_math.reduce_lanes(cand, axis=1)               # [BP]
  for name in CANDIDATE_FIELDS:
    pl_triton.store(refs[name].at[zero + program, batch_ids], getattr(reduced, name))


@functools.partial(jax.jit, static_argnames=("shape",))
def _launch(inputs: dict, shape: KernelShape) -> dict:
  fields = {"best_score": jnp.float32, "best_index": jnp.int32,
            "chosen_scaled": jnp.float32, "lse_max": jnp.float32, "lse_sum": jnp.float32,
            "nan_seen": jnp.int32}
  out_shape = [jax.ShapeDtypeStruct((shape.num_programs, shape.padded_batch), fields[name])
               for name in CANDIDATE_FIELDS]
  if shape.return_logits:
    out_shape.append(jax.ShapeDtypeStruct((shape.padded_batch, shape.local_vocab),
                                          jnp.float32))
  call = pl.pallas_call(
      functools.partial(_kernel, shape=shape), out_shape=out_shape,
      grid=(shape.num_programs,), interpret=shape.interpret,
      compiler_params=pl_triton.CompilerParams(num_warps=shape.num_warps, num_stages=1),
      name=KERNEL_NAME)
  return dict(zip(_output_names(shape), call(*[inputs[n] for n in _input_names(shape)])))


def _pad_rows(values: jax.Array, rows: int, fill=0) -> jax.Array:
  return jnp.pad(values, [(0, rows - values.shape[0])] + [(0, 0)] * (values.ndim - 1),
                 constant_values=fill)


@dataclasses.dataclass(frozen=True)
class StepKernelScores:
  """A ``local_walk.LocalScores``: one device's step scores by the step kernel."""
  config: StepKernelConfig

  def __call__(self, serial, base_logits, z, step, inputs: StepInputs) -> StepScores:
    reason = _refusal(serial)
    if reason is not None:
      raise ValueError(f"impl='pallas' cannot run this sharded walk: {reason}")
    batch, _, local_vocab = base_logits.shape
    w2 = serial.markov_w2
    kernel_layout = uses_w2_kernel(serial)
    weight = w2.kernel[...] if kernel_layout else w2.weight[...]
    scale = getattr(w2, "scale", None)
    padded = padded_batch(batch)
    shape = KernelShape(
        batch=batch, padded_batch=padded, local_vocab=local_vocab,
        rank=serial.config.rank, tile_rows=self.config.tile_rows,
        quantized=scale is not None, w2_kernel_layout=kernel_layout,
        z_exact_in_bf16=(serial.head_type == "vanilla"
                         and serial.markov_w1.weight.dtype == jnp.bfloat16),
        greedy=inputs.seed is None, return_logits=inputs.return_logits,
        return_logprobs=inputs.return_logprobs, num_warps=self.config.num_warps,
        interpret=self.config.interpret)
    kernel_inputs = {
        "z": _pad_rows(z.astype(jnp.float32), padded), "w2": weight,
        "base_logits": base_logits,
        "step": jnp.asarray(step, jnp.int32).reshape(1),
        "column_offset": jnp.asarray(inputs.column_offset, jnp.int32).reshape(1)}
    if scale is not None:
      kernel_inputs["w2_scale"] = scale[...].astype(jnp.float32)
    if inputs.seed is not None:
      streams = sampling.stream_key(inputs.seed, inputs.rows, jnp.asarray(step))
      kernel_inputs["streams"] = _pad_rows(streams, padded)
      kernel_inputs["score_scale"] = _pad_rows(inputs.score_scale, padded, 1.0)
      kernel_inputs["noise_on"] = _pad_rows(inputs.noise_on.astype(jnp.int32), padded)
    out = _launch(kernel_inputs, shape)
    # The programs' candidates: the same rule across programs as across tile lanes.
    reduced = tile_math.reduce_lanes(
        tile_math.Candidates(**{name: out[name] for name in CANDIDATE_FIELDS}), axis=0)
    # A row with no finite score keeps the sentinel: take the device's first column, as
    # an argmax over all -inf takes the first.
    index = reduced.best_index[:batch]
    index = jnp.where(index == tile_math.INDEX_SENTINEL, inputs.column_offset, index)
    lse = chosen = None
    if inputs.return_logprobs:
      chosen = reduced.chosen_scaled[:batch]
      lse = (reduced.lse_max + jnp.log(reduced.lse_sum))[:batch]
    return StepScores(best=reduced.best_score[:batch], index=index.astype(jnp.int32),
                      nan=jnp.any(reduced.nan_seen[:batch] != 0), chosen=chosen, lse=lse,
                      logits=out["logits"][:batch] if inputs.return_logits else None)
