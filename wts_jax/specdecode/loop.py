"""``generate``: speculative decoding as one jitted ``lax.while_loop``.

Prefill and every decode iteration run inside one compiled program; the host only
launches it and reads the result. One iteration, for all rows at once:

1. the policy chooses k (and a per-row cap) among its draft lengths;
2. the drafter's backbone runs one block per row from its last committed token;
3. the walk drafts k tokens (``lax.switch`` over one branch per k, so switching k
   never recompiles);
4. the target verifies ``[last, d_1 … d_k]`` over its KV cache;
5. each row accepts a prefix plus one target token (``verify``), EOS and the token
   budget cut it, and the new keys/values of the target and of the drafter's context
   are written at the row's old length; the new length leaves rejected entries stale.

k = 0 is an iteration without a draft: no block, no walk, the target runs over ``last``
alone and commits its own token (what a controller picks where drafting loses). The
policy is an operand of the compiled loop, not a setting: a controller with new numbers
(a cost table, a prior) runs in the same executable.

Rows are independent: different prompt lengths, acceptance, EOS and finish times; a
finished row rides along (static shapes) and changes nothing.

What keeps it at the hardware's speed: every weight is read where it lies (per-layer
weights, ``wts_jax.specdecode.qwen3``); attention reads each row's cache up to its
length on a GPU (``wts_jax.specdecode.attention``); the caches are loop-carried and
written in place; the executable is compiled with ``KERNEL_COMPILER_OPTIONS`` (the walk
kernel is a plain launch, not re-recorded into a CUDA graph each iteration);
``iterations_per_check`` iterations run between two reads of the loop condition by the
host; where a walk kernel runs, the drafter's W2 is walked as int8 planes
(``draft_w2``).

A policy that reads time (any but a fixed length) gets each iteration's device time
from the device clock (``wts_jax.pallas.device_clock``: the GPU's global timer, read by
a one-thread kernel at the start of every iteration, ordered after the previous
iteration's commit and before this one's work), one iteration late, as
``MeasuredIteration``; where there is no clock (the CPU) it gets ``None``.

Nothing goes wrong silently: a row whose target logits turn non-finite stops and sets
``STATUS_TARGET_NONFINITE``; a drafter whose logits (or walk) go bad sets its bit and
that row's drafts are not accepted (the target's own token is committed, so the output
stays exact); ``generate`` raises ``GenerateError`` for any bit unless ``check=False``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wts_jax.output import STATUS_NAN_LOGITS
from wts_jax.specdecode import attention
from wts_jax.specdecode.dspark import WALKS, DSparkDrafter
from wts_jax.specdecode.generate_output import (PAD, STATUS_DRAFTER_NONFINITE,
                                                STATUS_TARGET_NONFINITE, WALK_BITS,
                                                GenerateOutput)
from wts_jax.specdecode.inputs import check_models, eos_id_array, prompt_array
from wts_jax.specdecode.policy import (DraftPolicy, FixedDraftLength, MeasuredIteration,
                                       as_policy, branch_index, draft_lens_of)
from wts_jax.specdecode.qwen3 import Qwen3
from wts_jax.specdecode.verify import commit, verify_greedy, verify_sampling
from wts_jax.walk_config import KernelConfig

# The named scopes of an iteration's phases and of the prefill (a profile attributes
# device time by them); what lies outside them is "other".
PHASES = ("verify", "drafter", "walk", "prefill")
DRAFT_W2 = ("auto", "bf16", "int8_planes")


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """The static settings one compiled loop is specialised to.

  attention: ``"xla"`` or ``"pallas"`` (resolved, ``wts_jax.specdecode.attention``);
  draft_w2: ``"bf16"`` (the head as stored), ``"int8_planes"`` (W2 quantized per row,
  walked as int8 planes) or ``"auto"`` (int8 planes where a walk kernel runs them, else
  as stored); iterations_per_check: decode iterations between two host reads of the
  loop's condition. draft_lens: the policy's (a branch each; the policy itself is an
  operand of the compiled loop). timed: stamp every iteration with the device clock
  and hand the policy the previous iteration's measured time (``clock_state``).
  """

  max_new_tokens: int
  temperature: float
  draft_lens: tuple[int, ...]
  walk_impl: str
  cache_len: int
  walk_config: KernelConfig | None = None
  attention: str = "xla"
  draft_w2: str = "bf16"
  iterations_per_check: int = 1
  timed: bool = False

  @property
  def max_draft_len(self) -> int:
    return self.draft_lens[-1]


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _StaticPolicy:
  """A policy that is not a pytree, passed whole as static data (hashed by value)."""

  policy: object


def _as_operand(policy: DraftPolicy):
  """The policy as an argument of the compiled loop: itself if it is a pytree (its
  leaves traced), else wrapped as static data."""
  if jax.tree_util.tree_leaves(policy) != [policy]:
    return policy
  try:
    hash(policy)
  except TypeError:
    raise ValueError(f"draft_len={policy!r:.80} must be a pytree (its arrays are operands "
                     "of the compiled loop) or hashable (it is compiled in)") from None
  return _StaticPolicy(policy)


def clock_state() -> dict:
  """The loop state's clock entries before the first iteration: no stamp yet (a zero
  stamp; the GPU's global timer never reads zero)."""
  return dict(stamp=jnp.zeros((2,), jnp.uint32), stamp_draft_len=jnp.int32(0))


def _measure(state: dict, last: jax.Array, length: jax.Array, k: jax.Array
             ) -> tuple[MeasuredIteration, jax.Array, jax.Array, dict]:
  """Stamp this iteration's start, after what the previous iteration produced (its
  committed tokens and lengths), and order this iteration's work after the stamp:
  (the previous iteration's measured time, last, length, the next clock entries)."""
  from wts_jax.pallas import device_clock
  last, length, now = device_clock.stamp_between(last, length)
  seconds = jnp.where(jnp.any(state["stamp"] != 0),
                      device_clock.elapsed_seconds(state["stamp"], now), jnp.float32(jnp.nan))
  measured = MeasuredIteration(seconds, state["stamp_draft_len"], jnp.int32(length.shape[0]))
  return measured, last, length, dict(stamp=now, stamp_draft_len=k.astype(jnp.int32))


def _pad_axis(x: jax.Array, axis: int, extra: int) -> jax.Array:
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths)


def pick(logits: jax.Array, temperature: float, key: jax.Array) -> jax.Array:
  logits = logits.astype(jnp.float32)
  if temperature > 0:
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def _nonfinite_rows(logits: jax.Array) -> jax.Array:
  """[B] True where a row's logits hold a NaN or an infinity."""
  return ~jnp.all(jnp.isfinite(logits), axis=tuple(range(1, logits.ndim)))


def with_walk_head(drafter: DSparkDrafter, s: LoopSettings, batch: int) -> DSparkDrafter:
  """The drafter whose head the loop walks: its W2 as int8 planes when ``draft_w2``
  asks for them (``"auto"``: where the walk's choice for them is a kernel). Called
  inside the compiled loop, so the quantization runs once per ``generate`` call."""
  from wts_jax.api import chosen_implementation
  from wts_jax.quantize import quantize_w2
  head = drafter.head
  if (head is None or s.walk_impl in ("none", "xla") or s.draft_w2 == "bf16"
      or s.max_draft_len == 0):
    return drafter
  if head.markov_head.markov_w2.weight.dtype == jnp.int8:   # already quantized
    return drafter
  if s.draft_w2 == "int8_planes":
    planes = quantize_w2(head, "int8", state="planes")
  else:
    base = jax.ShapeDtypeStruct((batch, s.max_draft_len, drafter.config.vocab_size),
                                drafter.dtype)
    try:   # planes only where a kernel walks them ("pallas" refuses, saying why)
      planes = quantize_w2(head, "int8", state="planes")
      impl = chosen_implementation(planes, base, s.walk_impl, s.walk_config,
                                   temperature=s.temperature,
                                   return_logits=s.temperature > 0)
    except (TypeError, ValueError):   # a rank or head the planes do not fit
      return drafter
    if impl == "xla":
      return drafter
  drafter.head = nnx.data(planes)
  return drafter


def iteration(target: Qwen3, drafter: DSparkDrafter, policy: DraftPolicy, state: dict,
              s: LoopSettings) -> dict:
  """One decode iteration on the loop state (see the module docstring)."""
  lens, k_max = s.draft_lens, s.max_draft_len
  layer_ids = drafter.config.target_layer_ids
  active, length, last = state["active"], state["length"], state["last"]
  batch = length.shape[0]
  key, draft_key, verify_key = jax.random.split(state["key"], 3)
  # A loop that keeps its rows for the whole request (finished ones ride along) starts
  # no request mid-run, and computes every row each iteration.
  k, cap, policy_state = policy.choose(state["policy_state"], active,
                                       jnp.zeros_like(active), jnp.int32(batch))
  measured, clock = None, dict(stamp=state["stamp"], stamp_draft_len=state["stamp_draft_len"])
  if s.timed:
    measured, last, length, clock = _measure(state, last, length, k)
  head = drafter.head
  with_confidence = (s.walk_impl != "none" and head is not None
                     and head.config.confidence)

  def block(_):
    with jax.named_scope("drafter"):
      return drafter.block(last, length, state["draft_cache"], attention_impl=s.attention)

  if lens[-1] == 0:
    base = hidden = None
    draft_cache = state["draft_cache"]
  elif lens[0] == 0:   # the block only where this iteration drafts
    shapes = jax.eval_shape(block, None)[:2]
    base, hidden, draft_cache = jax.lax.cond(
        k > 0, block,
        lambda _: (*(jnp.zeros(x.shape, x.dtype) for x in shapes), state["draft_cache"]),
        None)
  else:
    base, hidden, draft_cache = block(None)

  def target_pass(tokens):
    with jax.named_scope("verify"):
      out = target.forward(tokens, length, state["target_cache"], feature_layers=layer_ids,
                           attention_impl=s.attention)
    with jax.named_scope("drafter"):
      context_keys, context_values = drafter.context_kv(out.features, length)
    return out, context_keys, context_values

  def padded(steps, draft_tokens, accepted, bonus, out, context_keys, context_values,
             confidence, drafter_bad, walk_status):
    extra = k_max - steps
    return (_pad_axis(draft_tokens, 1, extra), accepted, bonus, out.cache,
            _pad_axis(context_keys, 3, extra), _pad_axis(context_values, 3, extra),
            confidence, _nonfinite_rows(out.logits), drafter_bad,
            walk_status.astype(jnp.int32))

  def no_draft(_):
    out, context_keys, context_values = target_pass(last[:, None])
    bonus = pick(out.logits[:, 0], s.temperature, verify_key)
    zeros = jnp.zeros((batch,), jnp.int32)
    return padded(0, jnp.zeros((batch, 0), jnp.int32), zeros, bonus, out, context_keys,
                  context_values, jnp.zeros((batch, k_max), jnp.float32),
                  jnp.zeros((batch,), bool), jnp.int32(0))

  def drafting(steps: int):
    def run(_):
      drafter_bad = active & _nonfinite_rows(base[:, :steps])
      with jax.named_scope("walk"):
        draft = drafter.draft(base[:, :steps], hidden[:, :steps], last,
                              temperature=s.temperature, key=draft_key,
                              walk_impl=s.walk_impl, walk_config=s.walk_config)
      out, context_keys, context_values = target_pass(
          jnp.concatenate([last[:, None], draft.tokens], axis=1))
      # A draft from bad logits is not accepted: the row commits the target's own
      # token, which keeps greedy and sampling exact.
      walk_bad = (draft.status & STATUS_NAN_LOGITS) != 0
      row_cap = jnp.where(drafter_bad | walk_bad, 0, jnp.minimum(cap, steps))
      if s.temperature > 0:
        accepted, bonus = verify_sampling(draft.tokens, draft.q_logits, out.logits,
                                          s.temperature, verify_key, row_cap)
      else:
        accepted, bonus = verify_greedy(draft.tokens, out.logits, row_cap)
      confidence = (jnp.zeros((batch, k_max), jnp.float32) if draft.confidence is None
                    else _pad_axis(draft.confidence.astype(jnp.float32), 1,
                                   k_max - steps))
      return padded(steps, draft.tokens, accepted, bonus, out, context_keys,
                    context_values, confidence, drafter_bad, draft.status)
    return run

  branches = [no_draft if steps == 0 else drafting(steps) for steps in lens]
  if len(branches) == 1:
    result = branches[0](None)
  else:
    result = jax.lax.switch(branch_index(lens, k), branches, None)
  (draft_tokens, accepted, bonus, target_cache, ctx_keys, ctx_values, confidence,
   target_bad, drafter_bad, walk_status) = result

  # A row whose target logits are bad commits nothing more and stops.
  target_bad = active & target_bad
  committing = active & ~target_bad
  done = commit(draft_tokens, accepted, bonus, length, state["generated"], committing,
                s.max_new_tokens, state["eos_ids"])
  write_row = jax.vmap(lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (at,)))
  out_tokens = jnp.where(committing[:, None],
                         write_row(state["out_tokens"], done.tokens, state["generated"]),
                         state["out_tokens"])
  accepted = jnp.where(committing, accepted, 0)
  status = (state["status"]
            | jnp.where(jnp.any(active), walk_status & WALK_BITS, 0).astype(jnp.int32)
            | jnp.where(jnp.any(target_bad), STATUS_TARGET_NONFINITE, 0)
            | jnp.where(jnp.any(drafter_bad), STATUS_DRAFTER_NONFINITE, 0))
  return dict(
      target_cache=target_cache,
      draft_cache=draft_cache.write(ctx_keys, ctx_values, length),
      length=done.new_length,
      last=jnp.where(committing, bonus, last),
      out_tokens=out_tokens,
      generated=state["generated"] + done.count,
      active=committing & ~done.finished,
      policy_state=policy.observe(policy_state, k, accepted,
                                  confidence if with_confidence else None, active,
                                  measured),
      key=key,
      eos_ids=state["eos_ids"],
      iterations=state["iterations"] + jnp.any(active).astype(jnp.int32),
      accepted=state["accepted"] + accepted,
      steps=state["steps"] + active.astype(jnp.int32),
      status=status.astype(jnp.int32),
      **clock,
  )


def prefill(target: Qwen3, drafter: DSparkDrafter, policy: DraftPolicy,
            prompt_ids: jax.Array, prompt_lengths: jax.Array, eos_ids: jax.Array,
            key: jax.Array, s: LoopSettings) -> dict:
  """Run the prompts, fill both caches, pick each row's first token: the loop state."""
  batch = prompt_ids.shape[0]
  zeros = jnp.zeros((batch,), jnp.int32)
  out = target.forward(prompt_ids, zeros, None,
                       feature_layers=drafter.config.target_layer_ids,
                       logit_positions=(prompt_lengths - 1)[:, None],
                       attention_impl=s.attention)
  target_cache = target.empty_cache(batch, s.cache_len).write(out.keys, out.values, zeros)
  context_keys, context_values = drafter.context_kv(out.features, zeros)
  draft_cache = drafter.empty_cache(batch, s.cache_len).write(context_keys, context_values,
                                                              zeros)
  key, first_key = jax.random.split(key)
  first = pick(out.logits[:, 0], s.temperature, first_key)
  bad = _nonfinite_rows(out.logits)
  width = s.max_new_tokens + s.max_draft_len + 1
  out_tokens = jnp.full((batch, width), PAD, jnp.int32).at[:, 0].set(first)
  active = jnp.full((batch,), s.max_new_tokens > 1) & ~jnp.isin(first, eos_ids) & ~bad
  status = jnp.where(jnp.any(bad), STATUS_TARGET_NONFINITE, 0).astype(jnp.int32)
  return dict(target_cache=target_cache, draft_cache=draft_cache, length=prompt_lengths,
              last=first, out_tokens=out_tokens, generated=jnp.where(bad, 0, 1),
              active=active, policy_state=policy.init(batch), key=key, eos_ids=eos_ids,
              iterations=jnp.int32(0), accepted=zeros, steps=zeros, status=status,
              **clock_state())


def decode(target: Qwen3, drafter: DSparkDrafter, policy: DraftPolicy, state: dict,
           s: LoopSettings) -> dict:
  """Iterate until every row is done, ``iterations_per_check`` iterations between two
  evaluations of the condition (each is a device-to-host read on a GPU). An iteration
  after the last row finished changes nothing."""
  def some_iterations(st):
    return jax.lax.fori_loop(0, s.iterations_per_check,
                             lambda _, x: iteration(target, drafter, policy, x, s), st)
  return jax.lax.while_loop(lambda st: jnp.any(st["active"]), some_iterations, state)


# From this many rows on, the speculative loop's products run on cuBLAS (XLA's Triton
# GEMMs off): measured faster there, slower below (docs/decisions.md, "Products on
# cuBLAS from 16 rows").
CUBLAS_MIN_BATCH = 16


def cublas_products(batch: int) -> bool:
  """Whether a decode executable over ``batch`` rows runs its products on cuBLAS."""
  return batch >= CUBLAS_MIN_BATCH


def gpu_compiler_options(*, cublas_products: bool = False) -> dict:
  """XLA options for a decode executable on a GPU: ``KERNEL_COMPILER_OPTIONS`` and
  ``UNMERGED_PRODUCTS``, with ``cublas_products`` also ``CUBLAS_PRODUCTS``."""
  from wts_jax.launch_options import (CUBLAS_PRODUCTS, KERNEL_COMPILER_OPTIONS,
                                      UNMERGED_PRODUCTS)
  return {**KERNEL_COMPILER_OPTIONS, **UNMERGED_PRODUCTS,
          **(CUBLAS_PRODUCTS if cublas_products else {})}


def compiler_options(*, cublas_products: bool = False) -> dict | None:
  """``gpu_compiler_options`` where the default backend is a GPU, else None."""
  if jax.default_backend() != "gpu":
    return None
  return gpu_compiler_options(cublas_products=cublas_products)


@functools.lru_cache(maxsize=16)
def _compiled(target_graph, drafter_graph, settings: LoopSettings, batch: int):
  def run(target_state, drafter_state, policy, prompt_ids, prompt_lengths, eos_ids, key):
    if isinstance(policy, _StaticPolicy):
      policy = policy.policy
    target = nnx.merge(target_graph, target_state)
    drafter = with_walk_head(nnx.merge(drafter_graph, drafter_state), settings,
                             prompt_ids.shape[0])
    with jax.named_scope("prefill"):
      state = prefill(target, drafter, policy, prompt_ids, prompt_lengths, eos_ids, key,
                      settings)
    state = decode(target, drafter, policy, state, settings)
    count = state["generated"]
    tokens = state["out_tokens"][:, :settings.max_new_tokens]
    tokens = jnp.where(jnp.arange(settings.max_new_tokens)[None] < count[:, None], tokens,
                       PAD)
    return GenerateOutput(tokens, count, state["iterations"], state["accepted"],
                          state["steps"], state["status"], state["policy_state"])
  return jax.jit(run, compiler_options=compiler_options(
      cublas_products=cublas_products(batch)))


def _times_iterations(policy: DraftPolicy) -> bool:
  """Whether the loop stamps its iterations for ``policy``: where the device has a clock
  the loop can read, for any policy but a fixed length (which reads no time)."""
  if isinstance(policy, FixedDraftLength):
    return False
  from wts_jax.pallas import device_clock
  return device_clock.available()


def generate(target: Qwen3, drafter: DSparkDrafter, prompts: Sequence[Sequence[int]],
             max_new_tokens: int, *, temperature: float = 0.0, key: jax.Array | None = None,
             draft_len: int | DraftPolicy | None = None, walk_impl: str = "auto",
             eos_id: int | Sequence[int] | None = None, cache_len: int | None = None,
             walk_config: KernelConfig | None = None, attention_impl: str = "auto",
             draft_w2: str = "auto", iterations_per_check: int = 1,
             check: bool = True, hlo_text: list | None = None) -> GenerateOutput:
  """Speculative decoding of a batch of prompts (token-id lists of any lengths).

  temperature: 0 for greedy (output = the target's greedy decoding in the same compute
  dtype), > 0 for lossless speculative sampling (needs ``key``). draft_len: tokens
  drafted per iteration, an int (0: no drafting, the target alone) or a ``DraftPolicy``
  (default: the drafter's block size). walk_impl: ``"auto"``, ``"pallas"``, ``"xla"``
  (``wts_jax.walk``'s ``impl``) or ``"none"`` (no serial head). eos_id: token id(s)
  that end a row (kept in its output). cache_len: KV-cache positions per row (default:
  the longest prompt + max_new_tokens + draft_len). walk_config: the walk kernel's
  options (one kernel's config, ``wts_jax.walk``'s).
  attention_impl: ``"auto"`` (the cache-attention kernel on a GPU, else XLA), ``"xla"``,
  ``"pallas"``. draft_w2: ``"auto"`` (int8 planes where a walk kernel runs them),
  ``"bf16"`` (as stored), ``"int8_planes"``. iterations_per_check: iterations between
  two host reads of the loop condition. check: raise ``GenerateError`` when the
  output's ``status`` reports a problem (else leave it in ``status``). hlo_text: a
  list to which the optimized HLO of the compiled loop is appended (profiling reads its
  operations' phases).
  Every argument is checked before any work; a bad one raises ``ValueError``.
  """
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
      max_new_tokens < 1):
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
  if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or (
      not np.isfinite(temperature) or temperature < 0):
    raise ValueError(f"temperature={temperature!r} must be a finite number >= 0")
  if temperature > 0 and key is None:
    raise ValueError("temperature > 0 samples and needs key=jax.random.key(...)")
  if walk_impl not in WALKS:
    raise ValueError(f"walk_impl={walk_impl!r} must be one of {WALKS}")
  if draft_w2 not in DRAFT_W2:
    raise ValueError(f"draft_w2={draft_w2!r} must be one of {DRAFT_W2}")
  if isinstance(iterations_per_check, bool) or not isinstance(iterations_per_check, int) or (
      iterations_per_check < 1):
    raise ValueError(f"iterations_per_check={iterations_per_check!r} must be an int >= 1")
  attention_impl = attention.resolve(attention_impl)
  policy = as_policy(drafter.config.block_size if draft_len is None else draft_len)
  check_models(target, drafter, policy)
  prompt_ids, prompt_lengths = prompt_array(prompts, target.config.vocab_size)
  eos_ids = eos_id_array(eos_id, target.config.vocab_size)
  lens = draft_lens_of(policy)
  needed = prompt_ids.shape[1] + max_new_tokens + lens[-1]
  limit = target.config.max_position_embeddings
  if prompt_ids.shape[1] + max_new_tokens > limit:
    raise ValueError(f"the longest prompt ({prompt_ids.shape[1]} tokens) + max_new_tokens "
                     f"({max_new_tokens}) exceed the target's max_position_embeddings="
                     f"{limit}")
  if cache_len is None:
    cache_len = needed
  elif prompt_ids.shape[1] > cache_len:
    raise ValueError(f"a prompt of {prompt_ids.shape[1]} tokens is longer than "
                     f"cache_len={cache_len}")
  elif needed > cache_len:
    raise ValueError(f"cache_len={cache_len} is too small: the longest prompt "
                     f"({prompt_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) + "
                     f"draft_len ({lens[-1]}) need {needed}")
  settings = LoopSettings(max_new_tokens, float(temperature), lens, walk_impl,
                          int(cache_len), walk_config, attention_impl, draft_w2,
                          iterations_per_check, timed=_times_iterations(policy))
  target_graph, target_state = nnx.split(target)
  drafter_graph, drafter_state = nnx.split(drafter)
  key = jax.random.key(0) if key is None else key
  args = (target_state, drafter_state, _as_operand(policy), jnp.asarray(prompt_ids),
          jnp.asarray(prompt_lengths), jnp.asarray(eos_ids), key)
  # The policy's numbers are operands: a policy of the same structure and leaf shapes
  # (a controller with another table) runs in the same executable.
  leaves, policy_tree = jax.tree_util.tree_flatten(args[2])
  policy_key = (policy_tree, tuple((np.shape(x), np.result_type(getattr(x, "dtype", x)))
                                  for x in leaves))
  run = executable((target_graph, drafter_graph, settings, policy_key, prompt_ids.shape,
                     eos_ids.shape),
                    lambda: _compiled(target_graph, drafter_graph, settings,
                                      prompt_ids.shape[0]).lower(*args))
  if hlo_text is not None:
    hlo_text.append(run.as_text())
  out = run(*args)
  return out.check() if check else out


EXECUTABLES: dict = {}


def executable(key: tuple, lower):
  """The compiled loop for ``key`` (models, settings, input shapes), compiled ahead of
  time once, so that its HLO can be read without compiling it again."""
  if key not in EXECUTABLES:
    if len(EXECUTABLES) >= 16:
      EXECUTABLES.pop(next(iter(EXECUTABLES)))
    EXECUTABLES[key] = lower().compile()
  return EXECUTABLES[key]
