"""``walk(..., impl="pallas")``: from a head and validated inputs to one kernel launch.

Here the hidden-state-only terms are hoisted (one batched matmul each, before the
serial loop, by the same ``hoist`` functions the reference uses), the residency plan is
made, and the persistent kernel of ``triton_walk`` is launched once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from wts_jax.heads.draft_head import DraftHead
from wts_jax.output import WalkOutput
from wts_jax.pallas import triton_walk
from wts_jax.pallas.mosaic_plan import planes_state
from wts_jax.pallas.plan import WalkPlan, plan_walk
from wts_jax.pallas.shard_step import KernelSpec
from wts_jax.validation import Sampling
from wts_jax.walk_config import WalkConfig

SUPPORTED_W2_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int8))
# An fp8 W2 runs in interpret mode but disagreed with its reference on the H200
# (2026-11-29, cause not yet found): the kernel refuses it and "auto" uses XLA.
UNVERIFIED_W2_DTYPES = (jnp.dtype(jnp.float8_e4m3fn),)
MAX_RANK = 256
MAX_BATCH = 128


def w2_arrays(head: DraftHead):
  w2 = head.markov_head.markov_w2
  scale = getattr(w2, "scale", None)
  return w2.weight[...], (None if scale is None else scale[...])


def make_plan(head: DraftHead, batch: int, config: WalkConfig) -> WalkPlan:
  weight, _ = w2_arrays(head)
  return plan_walk(vocab_size=head.config.vocab_size, rank=head.config.rank, batch=batch,
                   w2_itemsize=jnp.dtype(weight.dtype).itemsize, config=config)


def unsupported_reason(head: DraftHead, base_logits, config: WalkConfig) -> str | None:
  if config.backend == "mosaic":
    return mosaic_reason(head, base_logits.shape[0], config)
  weight, scale = w2_arrays(head)
  dtype = jnp.dtype(weight.dtype)
  if config.backend == "auto" and planes_state(head):
    return mosaic_reason(head, base_logits.shape[0], config)
  if planes_state(head):
    return ("the Triton kernel meets an int8 W2 with an fp32 z; this head's z meets it "
            "as two int8 planes (quantize_w2(..., state='planes')): the Mosaic kernel "
            "runs it, or quantize with state='float'")
  if dtype in UNVERIFIED_W2_DTYPES and not config.interpret:
    return (f"a {dtype} W2 failed the kernel's GPU check against its reference; the "
            "kernel refuses it until fixed (int8 is supported)")
  if dtype not in SUPPORTED_W2_DTYPES + UNVERIFIED_W2_DTYPES:
    return (f"W2 dtype {dtype} is not supported by the kernel (bf16, or int8/fp8 from "
            "wts_jax.quantize_w2)")
  if dtype != jnp.dtype(jnp.bfloat16) and scale is None:
    return f"a {dtype} W2 needs per-row scales (use wts_jax.quantize_w2)"
  rank = head.config.rank
  if rank > MAX_RANK or rank < 16 or rank & (rank - 1):
    return f"rank={rank} must be a power of two in [16, {MAX_RANK}] for the kernel"
  batch = base_logits.shape[0]
  if batch > MAX_BATCH:
    return f"batch B={batch} exceeds the kernel's {MAX_BATCH} rows per launch"
  try:
    make_plan(head, batch, config)
  except ValueError as err:
    return str(err)
  return None


def kernel_spec(head: DraftHead, base_logits, mode: Sampling, plan: WalkPlan, *,
                return_logits: bool, return_logprobs: bool, spin_limit: int,
                interpret: bool, num_stages: int = 1) -> KernelSpec:
  """The static description of a kernel build for this head, these inputs and plan."""
  batch, steps, _ = base_logits.shape
  conf_head = head.confidence_head
  return KernelSpec(
      plan=plan, batch=batch, steps=steps, hidden_size=head.config.hidden_size,
      head_type=head.config.head_type, quantized=w2_arrays(head)[1] is not None,
      greedy=mode.greedy, confidence=conf_head is not None and conf_head.with_markov,
      return_logits=return_logits, return_logprobs=return_logprobs,
      spin_limit=spin_limit, interpret=interpret, num_stages=num_stages)


def mosaic_reason(head: DraftHead, batch: int, config: WalkConfig, *,
                  return_logits: bool = False, return_logprobs: bool = False):
  """Why the Mosaic GPU kernel cannot run this walk (None when it can)."""
  from wts_jax.pallas import mosaic_walk
  return mosaic_walk.unsupported_reason(head, batch, config, return_logits=return_logits,
                                        return_logprobs=return_logprobs)


def chosen_backend(head: DraftHead, batch: int, config: WalkConfig, *,
                   return_logits: bool = False, return_logprobs: bool = False,
                   greedy: bool = True) -> str:
  """``"mosaic"`` or ``"triton"``: the kernel ``walk(..., impl="pallas")`` launches."""
  if config.backend == "triton":
    return "triton"
  reason = mosaic_reason(head, batch, config, return_logits=return_logits,
                         return_logprobs=return_logprobs)
  if config.backend == "mosaic":
    if reason is not None:
      raise ValueError(f"backend='mosaic' cannot run this walk: {reason}")
    return "mosaic"
  # "auto": Mosaic where it was measured faster (NOTES.md); interpret mode keeps the
  # Triton kernel (jax 0.10.2's Mosaic GPU interpreter cannot run this kernel; the
  # Mosaic interpret tests ask for it by name).
  from wts_jax.pallas.mosaic_plan import AUTO_MAX_BATCH
  # Measured (NOTES v5, v6): Mosaic is faster for greedy vanilla walks at B = 1 only
  # (bf16 W2 137–143 against 221–225 µs; int8 W2 166–188 against 321 µs); sampled, the
  # Triton kernel is (235 against 246 µs at B = 1). The gated head on Mosaic is not
  # measured yet (NOTES v7): "auto" keeps it on Triton.
  faster = batch <= AUTO_MAX_BATCH and greedy and head.config.head_type == "vanilla"
  if planes_state(head):   # int8 x int8 on the tensor cores: only Mosaic runs it
    if reason is not None:
      raise ValueError(f"no kernel runs this walk: {reason}")
    return "mosaic"
  return "mosaic" if reason is None and faster and not config.interpret else "triton"


def kernel_walk(head: DraftHead, base_logits, first_tokens, hidden, mode: Sampling, *,
                config: WalkConfig, return_logits: bool = False,
                return_logprobs: bool = False) -> WalkOutput:
  if chosen_backend(head, base_logits.shape[0], config, return_logits=return_logits,
                    return_logprobs=return_logprobs, greedy=mode.greedy) == "mosaic":
    from wts_jax.pallas import mosaic_walk
    return mosaic_walk.kernel_walk(head, base_logits, first_tokens, hidden, mode,
                                   config=config)
  plan = make_plan(head, base_logits.shape[0], config)
  spec = kernel_spec(head, base_logits, mode, plan, return_logits=return_logits,
                     return_logprobs=return_logprobs, spin_limit=config.sync_spin_limit,
                     interpret=config.interpret, num_stages=config.num_stages or 1)
  return _launch(spec, head, base_logits, first_tokens, hidden, mode.score_scale,
                 mode.noise_on, mode.seed)


def kernel_inputs(spec: KernelSpec, head: DraftHead, hidden, score_scale, noise_on,
                  seed) -> dict:
  """The weight-side kernel inputs, and the hidden-only terms for all K positions at
  once (the same ``hoist`` functions as the reference), computed before the serial loop.

  ``conf_hoisted_only`` holds the whole confidence when the confidence head does not
  read ``e_k`` (nothing of it is serial then)."""
  serial = head.markov_head
  weight, scale = w2_arrays(head)
  inputs = {"w2": weight, "w1": serial.markov_w1.weight[...]}
  if scale is not None:
    inputs["w2_scale"] = scale.astype(jnp.float32)
  if spec.head_type == "gated":
    inputs["gate_hoisted"] = serial.hoist(hidden)
    inputs["gate_weight"] = serial.gate_proj.weight[...]
  elif spec.head_type == "rnn":
    inputs["joint_hoisted"] = serial.hoist(hidden)
    inputs["joint_weight"] = serial.joint_proj.weight[...]
  conf_head = head.confidence_head
  if conf_head is not None:
    conf_hoisted = conf_head.hoist(hidden)
    if spec.confidence:
      inputs["conf_hoisted"] = conf_hoisted
      inputs["conf_weight"] = conf_head.proj.weight[...]
    else:
      inputs["conf_hoisted_only"] = conf_hoisted
  if not spec.greedy:
    inputs["seed"] = seed
    inputs["score_scale"] = score_scale
    inputs["noise_on"] = noise_on.astype(jnp.int32)
  return inputs


@functools.partial(jax.jit, static_argnames=("spec",))
def _launch(spec: KernelSpec, head: DraftHead, base_logits, first_tokens, hidden,
            score_scale, noise_on, seed) -> WalkOutput:
  inputs = kernel_inputs(spec, head, hidden, score_scale, noise_on, seed)
  inputs["base_logits"] = base_logits
  inputs["first_tokens"] = first_tokens.astype(jnp.int32)
  out = triton_walk.persistent_walk(spec, inputs)
  confidence = out.get("confidence", inputs.get("conf_hoisted_only"))
  return WalkOutput(tokens=out["tokens"], status=out["status"].reshape(()),
                    confidence=confidence, logits=out.get("logits"),
                    logprobs=out.get("logprobs"))
