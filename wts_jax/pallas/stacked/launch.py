"""The stacked kernel's launch: its operands checked and laid out, its shared memory and
barriers in the order ``kernel.StackedWalk`` unpacks them, then ``plgpu.kernel``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from wts_jax.pallas import mosaic_gpu_helpers as gpu
from wts_jax.pallas.stacked import kernel as kernel_body
from wts_jax.pallas.stacked.operands import BASE_SLOT_BYTES, TMA_BASE_TRANSFORMS
from wts_jax.pallas.stacked.plan import MAX_BATCH, WARPGROUPS
from wts_jax.pallas.stacked.spec import StackedSpec
from wts_jax.pallas.stacked.threads import REQUESTS, TILE


def stacked_walk(spec: StackedSpec, w2, base_logits, w1, first_tokens, w2_scale, w1_scale,
                 sampling=None):
  """Launch the kernel once; returns (tokens [B, K] int32, status int32 scalar).
  ``w2`` [V, r] int8 with per-row ``w2_scale`` [V]; ``w1`` W1's interleaved int8 planes
  [2V, r] with their ``s_lo`` ``w1_scale`` [V] (``wts_jax.int8_state``); ``base_logits``
  [B, K, V] bf16. A sampled walk (``spec.greedy`` False): ``sampling`` = (score scale
  [B] f32, noise on [B] bool, seed uint32[2]), as ``reference.select_tokens`` takes
  them."""
  if spec.greedy != (sampling is None):
    raise ValueError(f"greedy={spec.greedy} with sampling operands "
                     f"{'given' if sampling is not None else 'missing'}")
  plan, batch, steps = spec.plan, spec.batch, spec.steps
  vocab, rank = plan.vocab_size, plan.rank
  if (w2.dtype != jnp.int8 or w2.shape != (vocab, rank) or w1.dtype != jnp.int8
      or w1.shape != (2 * vocab, rank) or base_logits.dtype != jnp.bfloat16
      or base_logits.shape != (batch, steps, vocab)):
    raise ValueError(
        f"the stacked walk needs W2 [{vocab}, {rank}] int8, W1 planes [{2 * vocab}, {rank}] "
        f"int8 and bf16 base logits [{batch}, {steps}, {vocab}] (got {w2.dtype}"
        f"{list(w2.shape)}, {w1.dtype}{list(w1.shape)}, {base_logits.dtype}"
        f"{list(base_logits.shape)})")
  w1 = w1.reshape(vocab, 2 * rank)   # a token's two planes side by side
  extra = ()
  if sampling is not None:
    score_scale, noise_on, seed = sampling
    extra = (score_scale.astype(jnp.float32), noise_on.astype(jnp.int32),
             seed.astype(jnp.uint32))
  if spec.interpret:   # whole blocks of 32 requests: the interpreted loads take 32 rows
    padding = plan.request_blocks * REQUESTS - batch
    base_logits = jnp.pad(base_logits, ((0, padding), (0, 0), (0, 0)))
    if extra:
      extra = (jnp.pad(extra[0], (0, padding), constant_values=1.0),
               jnp.pad(extra[1], (0, padding)), extra[2])
  scratch = [
      plgpu.SMEM((plan.slots, TILE, rank), jnp.int8, transforms=gpu.w2_transforms(1, rank)),
      plgpu.SMEM((plan.tiles, TILE), jnp.float32),
      plgpu.SMEM((MAX_BATCH,), jnp.int32),
      plgpu.SMEM((WARPGROUPS, REQUESTS), jnp.float32),
      plgpu.SMEM((WARPGROUPS, REQUESTS), jnp.int32),
      plgpu.SMEM((WARPGROUPS, REQUESTS), jnp.int32),
      plgpu.SMEM((3,), jnp.int32),   # NaN seen, first tokens' status, exchange timed out
      plgpu.Barrier(num_arrivals=1, num_barriers=plan.slots),
      plgpu.Barrier(num_arrivals=1, num_barriers=plan.phases * max(1, plan.ring_stages)),
      plgpu.Barrier(num_arrivals=plan.request_blocks,
                    num_barriers=plan.phases * max(1, plan.ring_stages)),
      plgpu.Barrier(num_arrivals=plan.tiles, num_barriers=1),
      plgpu.Barrier(num_arrivals=WARPGROUPS, num_barriers=1),
      plgpu.Barrier(num_arrivals=1, num_barriers=1),
  ]
  if plan.base_slots and not spec.interpret and plan.base_copies == "tma":
    scratch += [plgpu.SMEM((WARPGROUPS * plan.base_slots, REQUESTS, TILE),
                           jnp.bfloat16, transforms=TMA_BASE_TRANSFORMS),
                plgpu.Barrier(num_arrivals=1, num_barriers=WARPGROUPS * plan.base_slots)]
  elif plan.base_slots and not spec.interpret:
    scratch.append(plgpu.SMEM((WARPGROUPS * plan.base_slots * BASE_SLOT_BYTES,),
                              jnp.int8))
  if spec.interpret:
    scratch.append(plgpu.SMEM((WARPGROUPS, 2 * REQUESTS, rank), jnp.int8,
                              transforms=gpu.w2_transforms(1, rank)))
  kernel = plgpu.kernel(
      kernel_body.body(spec),
      out_type=(jax.ShapeDtypeStruct((batch, steps), jnp.int32),
                jax.ShapeDtypeStruct((1,) if spec.status == "kernel"
                                     else (plan.num_blocks * WARPGROUPS,), jnp.int32)),
      grid=(plan.num_blocks,), grid_names=("blocks",),
      num_threads=WARPGROUPS, thread_name="wg",
      scratch_types=scratch,
      compiler_params=gpu.compiler_params(spec.lab.profile_space, spec.lab.profile_dir),
      interpret=gpu.interpret_params() if spec.interpret else None,
  )
  tokens, status = kernel(w2, w2_scale.astype(jnp.float32), base_logits, w1,
                          w1_scale.astype(jnp.float32), first_tokens.astype(jnp.int32), *extra)
  if spec.status == "kernel":
    return tokens, status.reshape(())
  return tokens, lax.reduce(status, jnp.int32(0), lax.bitwise_or, (0,))
