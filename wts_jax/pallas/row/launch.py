"""The row kernel's launch: its shared memory, global buffers and outputs by name, then
``plgpu.kernel`` over ``kernel.body``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS, Z_TILE_ROWS
from wts_jax.pallas.row import kernel as kernel_body
from wts_jax.pallas.row.spec import RowSpec


def row_walk(spec: RowSpec, w2, base_logits, w1, first_tokens, seed=None,
             score_scale=None, noise_on=None, w2_scale=None, gate_weight=None,
             gate_hoisted=None, w1_scale=None):
  """Launch the kernel once; returns (tokens [B, K] int32, status int32 scalar).
  ``w2_scale``: the per-row scales [V] of an int8 W2 (``plan.w2_itemsize == 1``).
  ``plan.int8_state``: ``w1`` is W1's interleaved int8 planes [2V, r] and ``w1_scale``
  their ``s_lo`` [V] (``wts_jax.int8_state.interleaved_planes``).
  Gated head (``plan.gated``): ``gate_weight`` is ``gate_proj.weight`` [r, d + r] (bf16,
  inputs [h ; e]) and ``gate_hoisted`` its hidden-side terms [B, K, r] f32
  (``GatedMarkovHead.hoist``)."""
  if (w2_scale is None) != (spec.plan.w2_itemsize == 2):
    raise ValueError(f"the plan streams {spec.plan.w2_itemsize}-byte W2 rows; "
                     f"W2 is {w2.dtype} with{'out' if w2_scale is None else ''} scales")
  if (gate_weight is None or gate_hoisted is None) == spec.plan.gated:
    raise ValueError("a gated plan needs gate_weight and gate_hoisted, and only it")
  if (w1_scale is None) == spec.plan.int8_state or (
      spec.plan.int8_state and (w1.dtype != jnp.int8
                                or w1.shape[0] != 2 * spec.plan.vocab_size)):
    raise ValueError("an int8-planes plan needs W1's planes [2V, r] int8 and their "
                     f"scales, and only it (got W1 {w1.dtype}{list(w1.shape)})")
  plan, batch, steps = spec.plan, spec.batch, spec.steps
  slots = plan.resident_chunks + plan.ring_stages
  transforms = gpu.w2_transforms(jnp.dtype(w2.dtype).itemsize, plan.rank)
  itemsize = jnp.dtype(base_logits.dtype).itemsize
  if batch > plan.staged_batch or itemsize > plan.base_itemsize:
    raise ValueError(f"the plan stages {plan.staged_batch} rows of {plan.base_itemsize}-"
                     f"byte base logits; this walk has {batch} rows of {itemsize} bytes")
  lanes = plan.exchange_lanes
  scratch = {
      "w_s": plgpu.SMEM((slots, CHUNK_ROWS, plan.rank), w2.dtype, transforms=transforms),
      "base_s": plgpu.SMEM((2, plan.chunks, batch, CHUNK_ROWS), base_logits.dtype),
      "res_bar": plgpu.Barrier(num_arrivals=max(1, plan.resident_chunks), num_barriers=1),
      "ring_bar": plgpu.Barrier(num_arrivals=1, num_barriers=max(1, plan.ring_stages)),
      "base_bar": plgpu.Barrier(num_arrivals=plan.chunks, num_barriers=2),
  }
  if plan.gemv == "wgmma":   # z: 8 W1 rows per batch row, the WGMMA's B operand
    if w1.dtype != (jnp.int8 if plan.int8_state else jnp.bfloat16):
      raise ValueError(f"the WGMMA GEMV needs a bf16 W1 (got {w1.dtype})")
    scratch["z_s"] = plgpu.SMEM((Z_TILE_ROWS * batch, plan.rank), w1.dtype,
                                transforms=gpu.w2_transforms(jnp.dtype(w1.dtype).itemsize,
                                                          plan.rank))
    scratch["z_bar"] = plgpu.Barrier(num_arrivals=batch, num_barriers=1)
  if w2_scale is not None:
    scratch["w2_scale_s"] = plgpu.SMEM((plan.chunks, CHUNK_ROWS), jnp.float32)
    scratch["w2_scale_bar"] = plgpu.Barrier(num_arrivals=plan.chunks, num_barriers=1)
  if plan.gated:
    if gate_weight.dtype != jnp.bfloat16 or gate_weight.shape[0] != plan.rank:
      raise ValueError(f"the gated kernel needs a bf16 gate_proj.weight [{plan.rank}, "
                       f"d + {plan.rank}] (got {gate_weight.dtype}{list(gate_weight.shape)})")
    scratch["gate_e_s"] = plgpu.SMEM((plan.rank // CHUNK_ROWS, CHUNK_ROWS, plan.rank),
                                     jnp.bfloat16, transforms=gpu.w2_transforms(2, plan.rank))
    scratch["gate_e_bar"] = plgpu.Barrier(num_arrivals=plan.rank // CHUNK_ROWS,
                                          num_barriers=1)
    scratch["gate_pre_s"] = plgpu.SMEM((batch, plan.rank), jnp.float32)
  if plan.register_chunks:
    scratch["register_bar"] = plgpu.Barrier(num_arrivals=plan.register_chunks,
                                            num_barriers=1)
  outputs = {"tok_g": jax.ShapeDtypeStruct((batch, steps), jnp.int32),
             "flag_g": jax.ShapeDtypeStruct((plan.num_blocks,), jnp.int32),
             "xv_g": jax.ShapeDtypeStruct((2, batch, lanes), jnp.float32),
             "xi_g": jax.ShapeDtypeStruct((2, batch, lanes), jnp.int32)}
  operands = {"w2_g": w2, "base_g": base_logits, "w1_g": w1,
              "first_g": first_tokens.astype(jnp.int32)}
  if not spec.greedy:
    operands.update(seed_g=seed.astype(jnp.uint32), scale_g=score_scale.astype(jnp.float32),
                    noise_g=noise_on.astype(jnp.int32))
  if w2_scale is not None:
    operands["w2_scale_g"] = w2_scale.astype(jnp.float32)
  if w1_scale is not None:
    operands["w1_scale_g"] = w1_scale.astype(jnp.float32)
  if plan.gated:
    operands.update(gate_w_g=gate_weight, gate_hoisted_g=gate_hoisted.astype(jnp.float32))
  kernel = plgpu.kernel(
      kernel_body.body(spec, names=(*operands, *outputs, *scratch)),
      out_type=tuple(outputs.values()),
      grid=(plan.num_blocks,), grid_names=("blocks",),
      scratch_types=list(scratch.values()),
      compiler_params=gpu.compiler_params(spec.profile_space, spec.profile_dir),
      interpret=gpu.interpret_params() if spec.interpret else None,
  )
  tokens, flags, _, _ = kernel(*operands.values())
  return tokens, lax.reduce(flags, jnp.int32(0), lax.bitwise_or, (0,))
