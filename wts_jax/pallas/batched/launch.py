"""The batched kernel's launch: its operands checked and laid out (the base logits in
whole tiles, the head's hoisted terms in the rows' order the kernel reads), its shared
memory, global buffers and outputs, then ``plgpu.kernel`` over ``kernel.body``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax import gate_table
from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.batched import kernel as kernel_body
from wts_jax.pallas.batched.plan import BATCH_TILE
from wts_jax.pallas.batched.spec import BatchedSpec, gathered_z_rows
from wts_jax.pallas.mosaic_plan import CHUNK_ROWS


def batched_walk(spec: BatchedSpec, w2, base_logits, w1, first_tokens, seed=None,
                 score_scale=None, noise_on=None, w2_scale=None, w1_scale=None,
                 gate_weight=None, gate_hoisted=None, joint_weight=None,
                 joint_hoisted=None):
  """Launch the kernel once; returns (tokens [B, K] int32, status int32 scalar).
  ``base_logits`` [B, K, V]; padded here to whole 64-column tiles when V is not a
  multiple of 64 and, with the batch on M, to the plan's ``batch_rows`` when B is not a
  multiple of 8 (the base tiles are copied as whole TMA tiles).
  ``plan.int8_state``: ``w2`` int8 with its per-row ``w2_scale`` [V]; ``w1`` is W1's
  interleaved int8 planes [2V, r] and ``w1_scale`` their ``s_lo`` [V]
  (``wts_jax.int8_state.interleaved_planes``). Otherwise bf16 W1 and W2, and with
  ``plan.w2_row_scale`` W2 is an int8 W2's values widened to bf16 (or, widened in the
  kernel, the int8 W2 itself), ``w2_scale`` [V] its per-row scales.
  ``plan.gated``: ``gate_weight`` is ``gate_proj.weight`` [r, d + r] (bf16, inputs
  [h ; e]) and ``gate_hoisted`` its hidden-side terms [B, K, r] f32
  (``GatedMarkovHead.hoist``); with ``plan.gate_table`` ``w1`` is the head's gate table
  [V, 3r] int16 (``wts_jax.gate_table.gate_rows``) and G_e is not read; with
  ``plan.joint_table`` ``w1`` is the rnn head's joint table [V, 6r] int16
  (``wts_jax.joint_table.joint_rows``) and only J_s of ``joint_weight`` is read.
  ``plan.recurrent``: ``joint_weight`` is ``joint_proj.weight`` [3r, 2r + d] (bf16,
  inputs [s ; e ; h]) and ``joint_hoisted`` its hidden-side terms [B, K, 3r] f32
  (``RecurrentHead.hoist``)."""
  check_operands(spec, w2, w1, w2_scale=w2_scale, w1_scale=w1_scale,
                 gate_weight=gate_weight, gate_hoisted=gate_hoisted,
                 joint_weight=joint_weight, joint_hoisted=joint_hoisted)
  plan, batch, steps = spec.plan, spec.batch, spec.steps
  n_major = plan.batch_axis == "n"
  if plan.int8_state:
    w1 = w1.reshape(plan.vocab_size, 2 * plan.rank)   # a token's two planes side by side
    w1_scale = w1_scale.astype(jnp.float32)
  base_logits = base_tiles(spec, base_logits)
  scratch = shared_memory(spec, w2.dtype, base_logits.dtype, w1.dtype)
  threads = plan.warpgroups + (1 if plan.producer else 0)
  rows = plan.batch_rows
  outputs = {"tok_g": jax.ShapeDtypeStruct((steps, BATCH_TILE) if n_major
                                           else (BATCH_TILE, steps), jnp.int32),
             "flag_g": jax.ShapeDtypeStruct(
                 (1,) if spec.status == "kernel" else (plan.num_blocks * threads,),
                 jnp.int32)}
  operands = {"w2_g": w2, "base_g": base_logits}
  # The first tokens as they come (the kernel clamps them and reports those outside
  # [0, V)), padded only where the kernel's first load is wider than the batch.
  first_width = rows if n_major else BATCH_TILE
  operands.update(w1_g=w1, first_g=jnp.pad(first_tokens.astype(jnp.int32),
                                           (0, first_width - batch)))
  if plan.scaled:
    operands.update(w2_scale_g=w2_scale.astype(jnp.float32))
  if plan.int8_state:
    operands.update(w1_scale_g=w1_scale)
  head_operands(spec, operands, outputs, scratch, gate_weight=gate_weight,
                gate_hoisted=gate_hoisted, joint_weight=joint_weight,
                joint_hoisted=joint_hoisted)
  if not spec.greedy:
    def per_row(x, dtype):
      return jnp.zeros((BATCH_TILE,), dtype).at[:batch].set(x.astype(dtype))
    operands.update(seed_g=seed.astype(jnp.uint32),
                    scale_g=per_row(score_scale, jnp.float32),
                    noise_g=per_row(noise_on, jnp.int32))
  kernel = plgpu.kernel(
      kernel_body.body(spec, names=(*operands, *outputs, *scratch)),
      out_type=tuple(outputs.values()),
      grid=(plan.num_blocks,), grid_names=("blocks",),
      **(dict(num_threads=threads, thread_name="wg") if threads > 1 else {}),
      scratch_types=list(scratch.values()),
      compiler_params=gpu.compiler_params(spec.lab.profile_space, spec.lab.profile_dir),
      interpret=gpu.interpret_params() if spec.interpret else None,
  )
  tokens, flags = kernel(*operands.values())[:2]
  status = (flags.reshape(()) if spec.status == "kernel"
            else lax.reduce(flags, jnp.int32(0), lax.bitwise_or, (0,)))
  return (tokens.T if n_major else tokens)[:batch], status


def check_operands(spec: BatchedSpec, w2, w1, *, w2_scale, w1_scale, gate_weight,
                   gate_hoisted, joint_weight, joint_hoisted):
  """ValueError where an operand is not what the plan needs (``batched_walk``'s
  docstring)."""
  plan, batch, steps = spec.plan, spec.batch, spec.steps
  rank, vocab = plan.rank, plan.vocab_size
  if (gate_weight is None or gate_hoisted is None) == plan.gated:
    raise ValueError("a gated plan needs gate_weight and gate_hoisted, and only it")
  if (joint_weight is None or joint_hoisted is None) == plan.recurrent:
    raise ValueError("an rnn plan needs joint_weight and joint_hoisted, and only it")
  if plan.recurrent and (joint_weight.dtype != jnp.bfloat16
                         or joint_weight.shape[0] != 3 * rank
                         or joint_hoisted.shape != (batch, steps, 3 * rank)):
    raise ValueError(f"the rnn kernel needs a bf16 joint_proj.weight [{3 * rank}, "
                     f"{2 * rank} + d] and hoisted terms [{batch}, {steps}, {3 * rank}] "
                     f"(got {joint_weight.dtype}{list(joint_weight.shape)}, "
                     f"{list(joint_hoisted.shape)})")
  if plan.gated and (gate_weight.dtype != jnp.bfloat16 or gate_weight.shape[0] != rank
                     or gate_hoisted.shape != (batch, steps, rank)):
    raise ValueError(f"the gated kernel needs a bf16 gate_proj.weight [{rank}, d + {rank}] "
                     f"and hoisted terms [{batch}, {steps}, {rank}] (got "
                     f"{gate_weight.dtype}{list(gate_weight.shape)}, "
                     f"{list(gate_hoisted.shape)})")
  if plan.gate_table and (w1.shape != (vocab, 3 * rank) or w1.dtype != jnp.int16):
    raise ValueError(f"a gate-table plan needs the head's gate table [{vocab}, {3 * rank}] "
                     f"int16 as w1 (got {w1.dtype}{list(w1.shape)})")
  if plan.joint_table and (w1.shape != (vocab, 6 * rank) or w1.dtype != jnp.int16):
    raise ValueError(f"a joint-table plan needs the head's joint table [{vocab}, "
                     f"{6 * rank}] int16 as w1 (got {w1.dtype}{list(w1.shape)})")
  if plan.int8_state:
    if (w2.dtype != jnp.int8 or w2_scale is None or w1.dtype != jnp.int8
        or w1.shape != (2 * vocab, rank) or w1_scale is None):
      raise ValueError("an int8-planes plan needs an int8 W2 with scales and W1's planes "
                       f"[2V, r] int8 with theirs (got W2 {w2.dtype}, W1 {w1.dtype}"
                       f"{list(w1.shape)})")
  elif (w2.dtype != (jnp.int8 if plan.widened_in_kernel else jnp.bfloat16)
        or w1.dtype != (jnp.int16 if plan.token_table else jnp.bfloat16)):
    raise ValueError("the batched walk needs a bf16 W1 and a bf16 W2, or an int8 W2 to "
                     f"widen in the kernel (got {w1.dtype}, {w2.dtype})")
  if plan.w2_row_scale and (w2_scale is None or w2_scale.shape != (vocab,)):
    raise ValueError(f"a w2_row_scale plan needs W2's per-row scales [{vocab}] (got "
                     f"{None if w2_scale is None else list(w2_scale.shape)})")


def base_tiles(spec: BatchedSpec, base_logits):
  """The base logits [B, K, V] as the kernel's copies read them."""
  plan = spec.plan
  vocab, rows, n_major = plan.vocab_size, plan.batch_rows, plan.batch_axis == "n"
  # On M base tiles are [8-row, 64-column] TMA tiles: rows padded to the plan's. On N a
  # tile is untiled and a copy brings the batch's rows as given (the kernel zeroes the
  # rest of each slot once): padding them would copy all the base logits before the
  # launch. The columns are whole tiles either way: where V is not a multiple of 64, the
  # last tile holds the rows [V - 64, V), the last chunk's (its start clamped so as not to
  # read W2 past V), so that its base tile starts on a tile (``base_start``).
  tail = vocab % CHUNK_ROWS
  if tail:
    base_logits = jnp.concatenate([base_logits[:, :, :vocab - tail],
                                   base_logits[:, :, vocab - CHUNK_ROWS:]], axis=2)
  row_pad = 0 if n_major else rows - base_logits.shape[0]
  if row_pad:
    base_logits = jnp.pad(base_logits, ((0, row_pad), (0, 0), (0, 0)))
  return base_logits


def _base_transforms(itemsize: int):
  # The base tile is read in the WGMMA layout: the 128-byte swizzle spreads the 8 rows a
  # warp reads over all banks.
  return (plgpu.TilingTransform((8, 128 // itemsize)), plgpu.SwizzleTransform(128))


def shared_memory(spec: BatchedSpec, w2_dtype, base_dtype, w1_dtype) -> dict:
  """The kernel's shared memory and barriers by name, but for the head's update's
  (``head_operands``)."""
  plan = spec.plan
  rank, rows = plan.rank, plan.batch_rows
  wgs = plan.warpgroups
  slots = wgs * (plan.resident_chunks + plan.ring_stages)
  w_itemsize = jnp.dtype(w2_dtype).itemsize
  if (plan.int8_state or plan.token_table) and plan.pair_on_n:
    # (one above the other)
    a_tile = (2 * plan.staged_rows, rank)
  elif plan.int8_state or plan.z_pair:
    a_tile = (2, plan.staged_rows, rank)
  else:
    a_tile = (plan.staged_rows, rank)
  # The WGMMA tile's (a table's staging holds int16 words).
  z_dtype = jnp.bfloat16 if plan.token_table else w1_dtype
  scratch = {
      "w_s": plgpu.SMEM((slots, CHUNK_ROWS, rank), w2_dtype,
                        transforms=gpu.w2_transforms(w_itemsize, rank)),
      "za_s": plgpu.SMEM(a_tile, z_dtype, transforms=gpu.w2_transforms(plan.z_itemsize, rank)),
      # Batch on N reads the base tile transposed: untiled.
      "base_s": plgpu.SMEM((wgs * plan.base_stages, plan.base_rows, CHUNK_ROWS), base_dtype,
                           transforms=() if plan.batch_axis == "n"
                           else _base_transforms(jnp.dtype(base_dtype).itemsize)),
      "tok_s": plgpu.SMEM((BATCH_TILE,), jnp.int32),
      "keys_s": plgpu.SMEM((2, BATCH_TILE), jnp.uint32),   # exchange keys: high, low words
      "res_bar": plgpu.Barrier(num_arrivals=max(1, plan.resident_chunks), num_barriers=wgs),
      "ring_bar": plgpu.Barrier(num_arrivals=1, num_barriers=wgs * max(1, plan.ring_stages)),
      "base_bar": plgpu.Barrier(num_arrivals=1, num_barriers=wgs * plan.base_stages),
      # A base slot read by every thread of its warpgroup (one arrival each).
      "base_free_bar": plgpu.Barrier(num_arrivals=1, num_barriers=wgs * plan.base_stages),
      # A row's copies each.
      "z_bar": plgpu.Barrier(num_arrivals=gathered_z_rows(spec), num_barriers=1),
      "z_s": plgpu.SMEM((plan.staged_rows, plan.z_row_bytes // plan.z_itemsize), w1_dtype),
  }
  if plan.w2_widening == "smem":
    scratch["widen_s"] = plgpu.SMEM((wgs, CHUNK_ROWS, rank), jnp.bfloat16,
                                    transforms=gpu.w2_transforms(2, rank))
  if plan.scaled:
    scratch["w2_scale_s"] = plgpu.SMEM((plan.chunks, CHUNK_ROWS), jnp.float32)
    scratch["w2_scale_bar"] = plgpu.Barrier(num_arrivals=plan.wg_chunks, num_barriers=wgs)
  if plan.int8_state:
    scratch["row_scale_s"] = plgpu.SMEM((BATCH_TILE,), jnp.float32)
  if plan.producer:   # slots released to the producer, by every consumer thread
    scratch["ring_free_bar"] = plgpu.Barrier(num_arrivals=1,
                                             num_barriers=wgs * max(1, plan.ring_stages))
  if wgs > 1:
    scratch["za_bar"] = plgpu.Barrier(num_arrivals=1, num_barriers=1)
    scratch["merge_bar"] = plgpu.Barrier(num_arrivals=1, num_barriers=1)
    scratch["merge_value_s"] = plgpu.SMEM((BATCH_TILE,), jnp.float32)
    scratch["merge_index_s"] = plgpu.SMEM((BATCH_TILE,), jnp.int32)
    if spec.status == "kernel" and not plan.merge_tiles:
      scratch["merge_flag_s"] = plgpu.SMEM((1,), jnp.int32)
    if plan.merge_tiles:   # warpgroup 1's per-element bests, [64 vocab rows, rows]
      for name, dtype in (("value", jnp.float32), ("index", jnp.int32), ("nan", jnp.int32)):
        scratch[f"merge_tile_{name}_s"] = plgpu.SMEM((CHUNK_ROWS, rows), dtype)
  return scratch


def head_operands(spec: BatchedSpec, operands, outputs, scratch, *, gate_weight,
                  gate_hoisted, joint_weight, joint_hoisted):
  """The gated or rnn head's operands (its weights, its hoisted terms laid out as the
  kernel reads them), global buffers and shared memory, added to the launch's."""
  plan, batch, steps = spec.plan, spec.batch, spec.steps
  rank = plan.rank
  def hoisted_padded(hoisted):
    """[B, K, n] -> [64 rows, K, n] f32 (rows past B zero): a split update's block reads
    its units' columns of a step with the rows' stride."""
    return jnp.pad(hoisted.astype(jnp.float32), ((0, BATCH_TILE - batch), (0, 0), (0, 0)))
  if plan.gated:
    if plan.gate_table:   # the staged rows' terms as int16 halves: [K, 2, rows, r]
      halves = jnp.stack(gate_table.f32_halves(gate_hoisted), axis=2)   # [B, K, 2, r]
      operands.update(gate_hoisted_g=jnp.pad(
          halves, ((0, plan.staged_rows - batch), (0, 0), (0, 0), (0, 0))
      ).transpose(1, 2, 0, 3))
    else:
      hoisted = hoisted_padded(gate_hoisted)
      if not plan.gate_split:   # whole [64 rows, 64] tiles a step and G_e chunk
        hoisted = hoisted.transpose(1, 0, 2).reshape(
            steps, BATCH_TILE, rank // CHUNK_ROWS, CHUNK_ROWS).transpose(0, 2, 1, 3)
      operands.update(gate_w_g=gate_weight, gate_hoisted_g=hoisted)
  if plan.joint_table:   # the staged rows' terms as int16 halves: [K, 2, 3, rows, r]
    halves = jnp.stack(gate_table.f32_halves(joint_hoisted), axis=2)   # [B, K, 2, 3r]
    halves = halves.reshape(batch, steps, 2, 3, rank)
    operands.update(joint_w_g=joint_weight, gate_hoisted_g=jnp.pad(
        halves, ((0, plan.staged_rows - batch),) + ((0, 0),) * 4).transpose(1, 2, 3, 0, 4))
    outputs["ppub_g"] = jax.ShapeDtypeStruct((steps, 2, 3, BATCH_TILE, rank), jnp.int16)
    scratch["state_s"] = plgpu.SMEM((plan.staged_rows, rank), jnp.float32)
    scratch["state_tile_s"] = plgpu.SMEM((BATCH_TILE, rank), jnp.bfloat16,
                                         transforms=gpu.w2_transforms(2, rank))
    scratch["update_w_s"] = plgpu.SMEM((3 * plan.update_units, rank), jnp.bfloat16,
                                       transforms=gpu.w2_transforms(2, rank))
    scratch["update_w_bar"] = plgpu.Barrier(num_arrivals=3, num_barriers=1)
  elif plan.recurrent:
    operands.update(joint_w_g=joint_weight, gate_hoisted_g=hoisted_padded(joint_hoisted))
  if plan.split:   # the split update's global buffers (outputs, discarded) and weights
    outputs["zpub_g"] = jax.ShapeDtypeStruct((steps, 2, BATCH_TILE, rank), jnp.bfloat16)
    scratch["pub_bar"] = plgpu.Barrier(num_arrivals=2, num_barriers=1)
    if plan.recurrent:
      outputs["spub_g"] = jax.ShapeDtypeStruct((steps, 2, BATCH_TILE, rank), jnp.bfloat16)
      scratch["state_bar"] = plgpu.Barrier(num_arrivals=1, num_barriers=1)
      scratch["state_s"] = plgpu.SMEM((BATCH_TILE, plan.update_units), jnp.float32)
    copies = 6 if plan.recurrent else 1
    scratch["update_w_s"] = plgpu.SMEM(
        ((2, 3 * plan.update_units) if plan.recurrent else (plan.update_units,)) + (rank,),
        jnp.bfloat16,
        transforms=gpu.w2_transforms(2, rank))
    scratch["update_w_bar"] = plgpu.Barrier(num_arrivals=copies, num_barriers=1)
    scratch["update_flag_s"] = plgpu.SMEM((1,), jnp.int32)
