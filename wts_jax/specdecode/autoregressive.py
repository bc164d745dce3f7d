"""The target's own greedy decoding as one compiled loop: the baseline speculative
decoding is measured against (``wts-e2e-bench``) and its oracle on the device."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from wts_jax.specdecode import attention
from wts_jax.specdecode.inputs import prompt_array
from wts_jax.specdecode.loop import compiler_options, executable, pick
from wts_jax.specdecode.qwen3 import Qwen3


@functools.lru_cache(maxsize=8)
def _compiled_autoregressive(target_graph, max_new_tokens: int, cache_len: int,
                             attention_impl: str):
  def run(target_state, prompt_ids, prompt_lengths):
    target = nnx.merge(target_graph, target_state)
    batch = prompt_ids.shape[0]
    zeros = jnp.zeros((batch,), jnp.int32)
    with jax.named_scope("prefill"):
      out = target.forward(prompt_ids, zeros, None,
                           logit_positions=(prompt_lengths - 1)[:, None],
                           attention_impl=attention_impl)
      cache = target.empty_cache(batch, cache_len).write(out.keys, out.values, zeros)
      first = pick(out.logits[:, 0], 0.0, None)
    tokens = jnp.zeros((batch, max_new_tokens), jnp.int32).at[:, 0].set(first)

    def step(i, carry):
      tokens, cache = carry
      length = prompt_lengths + i - 1
      with jax.named_scope("verify"):
        out = target.forward(jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1),
                             length, cache,
                             attention_impl=attention_impl)
      cache = out.cache
      return tokens.at[:, i].set(pick(out.logits[:, 0], 0.0, None)), cache
    return jax.lax.fori_loop(1, max_new_tokens, step, (tokens, cache))[0]
  return jax.jit(run, compiler_options=compiler_options())


def decode_autoregressive(target: Qwen3, prompts: Sequence[Sequence[int]],
                          max_new_tokens: int, *, attention_impl: str = "auto",
                          hlo_text: list | None = None) -> jax.Array:
  """The target's own greedy decoding, one token per row and step, as one compiled loop
  (the baseline speculative decoding is measured against): [B, max_new_tokens] ids,
  no EOS (every row runs the full length). hlo_text: as ``generate``'s."""
  if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or (
      max_new_tokens < 1):
    raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
  prompt_ids, prompt_lengths = prompt_array(prompts, target.config.vocab_size)
  graph, state = nnx.split(target)
  settings = (max_new_tokens, prompt_ids.shape[1] + max_new_tokens,
              attention.resolve(attention_impl))
  args = (state, jnp.asarray(prompt_ids), jnp.asarray(prompt_lengths))
  run = executable(("autoregressive", graph, *settings, prompt_ids.shape),
                    lambda: _compiled_autoregressive(graph, *settings).lower(*args))
  if hlo_text is not None:
    hlo_text.append(run.as_text())
  return run(*args)
