"""``generate``: speculative decoding as one jitted ``lax.while_loop``.

Prefill and every decode iteration run inside one compiled program; the host only
launches it and reads the result. One iteration, for all rows at once:

1. the policy chooses k (and a per-row cap);
2. the drafter's backbone runs one block per row from its last committed token;
3. the walk drafts k tokens (``lax.switch`` over one branch per k, so switching k
   never recompiles);
4. the target verifies ``[last, d_1 … d_k]`` over its KV cache;
5. each row accepts a prefix plus one target token (``verify``), EOS and the token
   budget cut it, and the new keys/values of the target and of the drafter's context
   are written at the row's old length; the new length leaves rejected entries stale.

Rows are independent: different prompt lengths, acceptance, EOS and finish times; a
finished row rides along (static shapes) and changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wts_jax.spec.dspark import WALKS, DSparkDrafter
from wts_jax.spec.policy import DraftPolicy, FixedDraftLength, as_policy
from wts_jax.spec.qwen3 import Qwen3
from wts_jax.spec.verify import commit, verify_greedy, verify_sampling
from wts_jax.walk_config import KernelConfig

PAD = -1   # fills ``GenerateOutput.tokens`` after each row's end


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GenerateOutput:
  """tokens [B, max_new_tokens] int32 (``PAD`` after each row's end); num_tokens [B];
  iterations: decode iterations run (target verify passes); accepted [B]: drafted
  tokens accepted in all; steps [B]: iterations in which the row was still decoding."""

  tokens: jax.Array
  num_tokens: jax.Array
  iterations: jax.Array
  accepted: jax.Array
  steps: jax.Array

  def acceptance_length(self) -> np.ndarray:
    """Tokens committed per verify pass, per row (accepted drafts + 1)."""
    steps = np.maximum(np.asarray(self.steps), 1)
    return (np.asarray(self.accepted) + np.asarray(self.steps)) / steps

  def rows(self) -> list[list[int]]:
    """Each row's generated tokens as a list."""
    tokens, counts = np.asarray(self.tokens), np.asarray(self.num_tokens)
    return [tokens[b, :counts[b]].tolist() for b in range(tokens.shape[0])]


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """The static settings one compiled loop is specialised to."""

  max_new_tokens: int
  temperature: float
  policy: DraftPolicy
  walk_impl: str
  cache_len: int
  walk_config: KernelConfig | None = None


def _pad_axis(x: jax.Array, axis: int, extra: int) -> jax.Array:
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths)


def _pick(logits: jax.Array, temperature: float, key: jax.Array) -> jax.Array:
  if temperature > 0:
    return jax.random.categorical(key, logits / temperature, axis=-1).astype(jnp.int32)
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def draft_lengths(policy: DraftPolicy) -> tuple[int, ...]:
  """The k the loop compiles a branch for: only k for a fixed length, else 1..max."""
  if isinstance(policy, FixedDraftLength):
    return (policy.k,)
  return tuple(range(1, policy.max_draft_len + 1))


def iteration(target: Qwen3, drafter: DSparkDrafter, state: dict, s: LoopSettings) -> dict:
  """One decode iteration on the loop state (see the module docstring)."""
  policy = s.policy
  k_max = policy.max_draft_len
  layer_ids = drafter.config.target_layer_ids
  active, length, last = state["active"], state["length"], state["last"]
  key, draft_key, verify_key = jax.random.split(state["key"], 3)
  k, cap, policy_state = policy.choose(state["policy_state"], active)
  base, hidden = drafter.block(last, length, state["draft_cache"])
  head = drafter.head
  with_confidence = (s.walk_impl != "none" and head is not None
                     and head.config.confidence)

  def branch(steps: int):
    def run(_):
      draft = drafter.draft(base[:, :steps], hidden[:, :steps], last,
                            temperature=s.temperature, key=draft_key, walk_impl=s.walk_impl,
                            walk_config=s.walk_config)
      out = target.forward(jnp.concatenate([last[:, None], draft.tokens], axis=1),
                           length, state["target_cache"], feature_layers=layer_ids)
      row_cap = jnp.minimum(cap, steps)
      if s.temperature > 0:
        accepted, bonus = verify_sampling(draft.tokens, draft.q_logits, out.logits,
                                          s.temperature, verify_key, row_cap)
      else:
        accepted, bonus = verify_greedy(draft.tokens, out.logits, row_cap)
      context_keys, context_values = drafter.context_kv(out.features, length)
      extra = k_max - steps
      confidence = (jnp.zeros((length.shape[0], k_max), jnp.float32)
                    if draft.confidence is None
                    else _pad_axis(draft.confidence.astype(jnp.float32), 1, extra))
      return (_pad_axis(draft.tokens, 1, extra), accepted, bonus,
              _pad_axis(out.keys, 2, extra), _pad_axis(out.values, 2, extra),
              _pad_axis(context_keys, 2, extra), _pad_axis(context_values, 2, extra),
              confidence)
    return run

  lengths = draft_lengths(policy)
  branches = [branch(steps) for steps in lengths]
  if len(branches) == 1:
    result = branches[0](None)
  else:
    index = jnp.clip(k - lengths[0], 0, len(branches) - 1)
    result = jax.lax.switch(index, branches, None)
  draft_tokens, accepted, bonus, keys, values, ctx_keys, ctx_values, confidence = result

  done = commit(draft_tokens, accepted, bonus, length, state["generated"], active,
                s.max_new_tokens, state["eos_ids"])
  write_row = jax.vmap(lambda row, new, at: jax.lax.dynamic_update_slice(row, new, (at,)))
  out_tokens = jnp.where(active[:, None],
                         write_row(state["out_tokens"], done.tokens, state["generated"]),
                         state["out_tokens"])
  accepted = jnp.where(active, accepted, 0)
  return dict(
      target_cache=state["target_cache"].write(keys, values, length),
      draft_cache=state["draft_cache"].write(ctx_keys, ctx_values, length),
      length=done.new_length,
      last=jnp.where(active, bonus, last),
      out_tokens=out_tokens,
      generated=state["generated"] + done.count,
      active=active & ~done.finished,
      policy_state=policy.observe(policy_state, k, accepted,
                                  confidence if with_confidence else None, active),
      key=key,
      eos_ids=state["eos_ids"],
      iterations=state["iterations"] + 1,
      accepted=state["accepted"] + accepted,
      steps=state["steps"] + active.astype(jnp.int32),
  )


def prefill(target: Qwen3, drafter: DSparkDrafter, prompt_ids: jax.Array,
            prompt_lengths: jax.Array, eos_ids: jax.Array, key: jax.Array,
            s: LoopSettings) -> dict:
  """Run the prompts, fill both caches, pick each row's first token: the loop state."""
  batch = prompt_ids.shape[0]
  zeros = jnp.zeros((batch,), jnp.int32)
  out = target.forward(prompt_ids, zeros, None,
                       feature_layers=drafter.config.target_layer_ids,
                       logit_positions=(prompt_lengths - 1)[:, None])
  target_cache = target.empty_cache(batch, s.cache_len).write(out.keys, out.values, zeros)
  context_keys, context_values = drafter.context_kv(out.features, zeros)
  draft_cache = drafter.empty_cache(batch, s.cache_len).write(context_keys, context_values,
                                                              zeros)
  key, first_key = jax.random.split(key)
  first = _pick(out.logits[:, 0], s.temperature, first_key)
  width = s.max_new_tokens + s.policy.max_draft_len + 1
  out_tokens = jnp.full((batch, width), PAD, jnp.int32).at[:, 0].set(first)
  active = jnp.full((batch,), s.max_new_tokens > 1) & ~jnp.isin(first, eos_ids)
  return dict(target_cache=target_cache, draft_cache=draft_cache, length=prompt_lengths,
              last=first, out_tokens=out_tokens, generated=jnp.ones((batch,), jnp.int32),
              active=active, policy_state=s.policy.init(batch), key=key, eos_ids=eos_ids,
              iterations=jnp.int32(0), accepted=zeros, steps=zeros)


@functools.lru_cache(maxsize=16)
def _compiled(target_graph, drafter_graph, settings: LoopSettings):
  def run(target_state, drafter_state, prompt_ids, prompt_lengths, eos_ids, key):
    target = nnx.merge(target_graph, target_state)
    drafter = nnx.merge(drafter_graph, drafter_state)
    state = prefill(target, drafter, prompt_ids, prompt_lengths, eos_ids, key, settings)
    state = jax.lax.while_loop(lambda st: jnp.any(st["active"]),
                               lambda st: iteration(target, drafter, st, settings), state)
    count = state["generated"]
    tokens = state["out_tokens"][:, :settings.max_new_tokens]
    tokens = jnp.where(jnp.arange(settings.max_new_tokens)[None] < count[:, None], tokens,
                       PAD)
    return GenerateOutput(tokens, count, state["iterations"], state["accepted"],
                          state["steps"])
  return jax.jit(run)


def check_models(target: Qwen3, drafter: DSparkDrafter, policy: DraftPolicy) -> None:
  """Refuse a target/drafter/draft-length combination that cannot run together."""
  t, d = target.config, drafter.config
  if t.vocab_size != d.vocab_size:
    raise ValueError(f"drafter vocab_size={d.vocab_size} != target vocab_size="
                     f"{t.vocab_size}: the drafter must draft the target's vocabulary")
  bad = [layer for layer in d.target_layer_ids if not -1 <= layer < t.num_layers]
  if bad:
    raise ValueError(f"drafter target_layer_ids={list(d.target_layer_ids)} has {bad[0]}, "
                     f"beyond the target's {t.num_layers} layers (ids in -1..{t.num_layers - 1})")
  if d.num_target_layers is not None and d.num_target_layers != t.num_layers:
    raise ValueError(f"drafter num_target_layers={d.num_target_layers} != the target's "
                     f"num_layers={t.num_layers}: trained for another target")
  features = drafter.fc.weight.shape[1]
  if features != len(d.target_layer_ids) * t.hidden_size:
    raise ValueError(f"drafter fc takes {features} features, but {len(d.target_layer_ids)} "
                     f"target layers of hidden_size={t.hidden_size} give "
                     f"{len(d.target_layer_ids) * t.hidden_size}")
  if policy.max_draft_len > d.block_size:
    raise ValueError(f"draft_len={policy.max_draft_len} must be <= the drafter's "
                     f"block_size={d.block_size}")


def _prompt_array(prompts, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
    raise ValueError(f"prompts={prompts!r:.80} must be a non-empty list of token-id lists")
  rows = []
  for b, prompt in enumerate(prompts):
    row = np.asarray(prompt)
    if row.ndim != 1 or row.size == 0 or not np.issubdtype(row.dtype, np.integer):
      raise ValueError(f"prompts[{b}] must be a non-empty list of token ids")
    if row.min() < 0 or row.max() >= vocab_size:
      raise ValueError(f"prompts[{b}] holds id {int(row.max() if row.max() >= vocab_size else row.min())}"
                       f", outside [0, vocab_size={vocab_size})")
    rows.append(row)
  lengths = np.array([row.size for row in rows], np.int32)
  array = np.zeros((len(rows), int(lengths.max())), np.int32)
  for b, row in enumerate(rows):
    array[b, :row.size] = row
  return array, lengths


def generate(target: Qwen3, drafter: DSparkDrafter, prompts: Sequence[Sequence[int]],
             max_new_tokens: int, *, temperature: float = 0.0, key: jax.Array | None = None,
             draft_len: int | DraftPolicy | None = None, walk_impl: str = "auto",
             eos_id: int | Sequence[int] | None = None, cache_len: int | None = None,
             walk_config: KernelConfig | None = None) -> GenerateOutput:
  """Speculative decoding of a batch of prompts (token-id lists of any lengths).

  temperature: 0 for greedy (output = the target's greedy decoding), > 0 for lossless
  speculative sampling (needs ``key``). draft_len: tokens drafted per iteration, an int
  or a ``DraftPolicy`` (default: the drafter's block size). walk_impl: ``"auto"``,
  ``"pallas"``, ``"xla"`` (``wts_jax.walk``'s ``impl``) or ``"none"`` (no serial head).
  eos_id: token id(s) that end a row (kept in its output). cache_len: KV-cache
  positions per row (default: the longest prompt + max_new_tokens + draft_len).
  walk_config: the walk kernel's options (one kernel's config, ``wts_jax.walk``'s).
  Every argument is checked before any work; a bad one raises ``ValueError``.
  """
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
      max_new_tokens < 1):
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
  if not isinstance(temperature, (int, float)) or not np.isfinite(temperature) or (
      temperature < 0):
    raise ValueError(f"temperature={temperature!r} must be a finite number >= 0")
  if temperature > 0 and key is None:
    raise ValueError("temperature > 0 samples and needs key=jax.random.key(...)")
  if walk_impl not in WALKS:
    raise ValueError(f"walk_impl={walk_impl!r} must be one of {WALKS}")
  policy = as_policy(drafter.config.block_size if draft_len is None else draft_len)
  check_models(target, drafter, policy)
  prompt_ids, prompt_lengths = _prompt_array(prompts, target.config.vocab_size)
  eos_ids = [] if eos_id is None else [
      int(i) for i in ((eos_id,) if isinstance(eos_id, (int, np.integer)) else eos_id)]
  outside = [i for i in eos_ids if not 0 <= i < target.config.vocab_size]
  if outside:   # (such an id would never end a row: a typo, not a wish)
    raise ValueError(f"eos_id {outside[0]} is outside [0, vocab_size="
                     f"{target.config.vocab_size})")
  # At least one entry (-1 matches no token): no EOS and one EOS share a compile.
  eos_ids = np.array(eos_ids or [-1], np.int32)
  needed = prompt_ids.shape[1] + max_new_tokens + policy.max_draft_len
  if cache_len is None:
    cache_len = needed
  elif prompt_ids.shape[1] > cache_len:
    raise ValueError(f"a prompt of {prompt_ids.shape[1]} tokens is longer than "
                     f"cache_len={cache_len}")
  elif needed > cache_len:
    raise ValueError(f"cache_len={cache_len} is too small: the longest prompt "
                     f"({prompt_ids.shape[1]}) + max_new_tokens ({max_new_tokens}) + "
                     f"draft_len ({policy.max_draft_len}) need {needed}")
  settings = LoopSettings(max_new_tokens, float(temperature), policy, walk_impl,
                       int(cache_len), walk_config)
  target_graph, target_state = nnx.split(target)
  drafter_graph, drafter_state = nnx.split(drafter)
  run = _compiled(target_graph, drafter_graph, settings)
  key = jax.random.key(0) if key is None else key
  return run(target_state, drafter_state, jnp.asarray(prompt_ids),
             jnp.asarray(prompt_lengths), jnp.asarray(eos_ids), key)
