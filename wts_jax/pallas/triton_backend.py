"""The Triton backend (``impl="triton"``): from a head and validated inputs to one launch
of the persistent kernel of ``triton_walk``.

``plan`` refuses what the kernel cannot run and makes the residency plan (``plan.py``);
``launch`` hoists the hidden-state-only terms (one batched matmul each, before the
serial loop, by the same ``hoist`` functions the reference uses) and launches the kernel
once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from wts_jax.device import DeviceFacts
from wts_jax.heads.draft_head import DraftHead
from wts_jax.output import WalkOutput
from wts_jax.pallas import triton_walk
from wts_jax.pallas.head_operands import serial_operands
from wts_jax.pallas.protocol import Refusal, WalkOperands, WalkShapes
from wts_jax.pallas.plan import WalkPlan, plan_walk
from wts_jax.pallas.shard_step import KernelSpec
from wts_jax.walk_config import TritonConfig

SUPPORTED_W2_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.int8))
# An fp8 W2 runs in interpret mode but disagreed with its reference on the H200: the
# kernel refuses it and "auto" uses XLA.
UNVERIFIED_W2_DTYPES = (jnp.dtype(jnp.float8_e4m3fn),)
MAX_RANK = 256
MAX_BATCH = 128
# The Triton kernel's bf16 dots and atomics: Ampere or later.
MIN_COMPUTE_CAPABILITY = (8, 0)


def supported_on(device: DeviceFacts) -> str | None:
  """Why ``device`` cannot run the Triton kernel (its compute capability), or None."""
  capability = device.compute_capability
  if capability is None or capability < MIN_COMPUTE_CAPABILITY:
    found = "not a CUDA GPU" if capability is None else f"compute capability {capability}"
    return (f"the Triton kernel needs compute capability {MIN_COMPUTE_CAPABILITY} or "
            f"later; {device.kind} is {found}")
  return None


def _scaled(head: DraftHead) -> bool:
  return getattr(head.markov_head.markov_w2, "scale", None) is not None


def make_plan(head: DraftHead, batch: int, config: TritonConfig,
              device: DeviceFacts | None = None) -> WalkPlan:
  w2_dtype = jnp.dtype(head.markov_head.markov_w2.weight.dtype)
  return plan_walk(vocab_size=head.config.vocab_size, rank=head.config.rank, batch=batch,
                   w2_itemsize=w2_dtype.itemsize, config=config, device=device)


def _refusal(head: DraftHead, batch: int, config: TritonConfig) -> str | None:
  dtype = jnp.dtype(head.markov_head.markov_w2.weight.dtype)
  if head.markov_head.z_as_int8_planes:
    return ("the Triton kernel meets an int8 W2 with an fp32 z; this head's z meets it "
            "as two int8 planes (quantize_w2(..., state='planes')): the Mosaic kernel "
            "runs it, or quantize with state='float'")
  if dtype in UNVERIFIED_W2_DTYPES and not config.interpret:
    return (f"a {dtype} W2 failed the kernel's GPU check against its reference; the "
            "kernel refuses it until fixed (int8 is supported)")
  if dtype not in SUPPORTED_W2_DTYPES + UNVERIFIED_W2_DTYPES:
    return (f"W2 dtype {dtype} is not supported by the kernel (bf16, or int8/fp8 from "
            "wts_jax.quantize_w2)")
  if dtype != jnp.dtype(jnp.bfloat16) and not _scaled(head):
    return f"a {dtype} W2 needs per-row scales (use wts_jax.quantize_w2)"
  rank = head.config.rank
  if rank > MAX_RANK or rank < 16 or rank & (rank - 1):
    return f"rank={rank} must be a power of two in [16, {MAX_RANK}] for the kernel"
  if batch > MAX_BATCH:
    return f"batch B={batch} exceeds the kernel's {MAX_BATCH} rows per launch"
  return None


def plan(head: DraftHead, shapes: WalkShapes, config: TritonConfig,
         device: DeviceFacts) -> KernelSpec | Refusal:
  """The kernel build of this walk, or why the Triton kernel cannot run it."""
  reason = _refusal(head, shapes.batch, config)
  if reason is not None:
    return Refusal(reason)
  try:
    walk_plan = make_plan(head, shapes.batch, config, device)
  except ValueError as err:
    return Refusal(str(err))
  return kernel_spec(head, shapes, walk_plan, spin_limit=config.sync_spin_limit,
                     interpret=config.interpret, num_stages=config.num_stages or 1)


def launch(spec: KernelSpec, operands: WalkOperands) -> WalkOutput:
  mode = operands.mode
  return _launch(spec, operands.head, operands.base_logits, operands.first_tokens,
                 operands.hidden, mode.score_scale, mode.noise_on, mode.seed)


def kernel_spec(head: DraftHead, shapes: WalkShapes, plan: WalkPlan, *, spin_limit: int,
                interpret: bool, num_stages: int = 1) -> KernelSpec:
  """The static description of a kernel build for this head, these inputs and plan."""
  conf_head = head.confidence_head
  return KernelSpec(
      plan=plan, batch=shapes.batch, steps=shapes.steps,
      hidden_size=head.config.hidden_size, head_type=head.config.head_type,
      quantized=_scaled(head), greedy=shapes.greedy,
      confidence=conf_head is not None and conf_head.with_markov,
      return_logits=shapes.return_logits, return_logprobs=shapes.return_logprobs,
      spin_limit=spin_limit, interpret=interpret, num_stages=num_stages)


def kernel_inputs(spec: KernelSpec, head: DraftHead, hidden, score_scale, noise_on,
                  seed) -> dict:
  """The weight-side kernel inputs, and the hidden-only terms for all K positions at
  once (the same ``hoist`` functions as the reference), computed before the serial loop.

  ``conf_hoisted_only`` holds the whole confidence when the confidence head does not
  read ``e_k`` (nothing of it is serial then)."""
  inputs = serial_operands(head, hidden)
  if "w2_scale" in inputs:
    inputs["w2_scale"] = inputs["w2_scale"].astype(jnp.float32)
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
