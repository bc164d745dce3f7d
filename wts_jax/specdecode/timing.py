"""The decode loop's parts as steps, and ``iteration_cost``: their device time.

Method (stated in every ``wts-e2e-bench`` JSON as ``METHOD``): each measured piece is a
function ``carry -> carry``; one jitted executable (compiled as the decode loop is, with
``loop.compiler_options()``) runs it ``chain`` times back to back in a
``lax.fori_loop`` whose carry threads each run's output into the next run's input (so
the compiler can neither hoist nor drop a run), and the wall time of that executable,
after a warm-up call and with ``block_until_ready``, divided by ``chain``, is one
sample; the figure is the median of ``repeats`` samples. Chaining inside one executable
leaves out the host's per-launch work, as the decode loop (one ``lax.while_loop``)
does. The caches hold ``prompt_len`` positions per row and every run starts from that
length again, so the figure belongs to that context length.

Pieces (``PIECES``; each is the code the loop runs, ``loop_pieces``): ``verify`` the
target's forward over ``[last, d_1 … d_k]``, the acceptance rule and the cache write;
``drafter`` the drafter backbone's block plus the context keys/values of the k + 1
verified positions and their write; ``walk`` drafting k tokens from the block
(``walk_impl``); ``total`` the loop's own iteration (all of the above, the commit).
``draft_len = 0`` is the loop's iteration without a draft (the branch a draft policy
takes when drafting loses): the target over one position per row and the drafter's
context keys/values of it; ``drafter`` and ``walk`` are 0.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wts_jax.specdecode import loop
from wts_jax.specdecode.dspark import DSparkDrafter
from wts_jax.specdecode.policy import FixedDraftLength
from wts_jax.specdecode.qwen3 import Qwen3
from wts_jax.specdecode.verify import verify_greedy

PIECES = ("total", "verify", "drafter", "walk")
METHOD = __doc__.split("Method (stated in every ``wts-e2e-bench`` JSON as ``METHOD``): ",
                       1)[1].strip()

# step(target, drafter, carry) -> carry
Step = Callable[[Qwen3, DSparkDrafter, object], object]


@dataclasses.dataclass(frozen=True)
class Piece:
  """A part of the loop as a step and a factory of its first carry (fresh operands for
  every measurement: a measured call consumes, donates, its own)."""

  step: Step
  carry: Callable[[], object]


def loop_pieces(target: Qwen3, drafter: DSparkDrafter, *, batch: int, draft_len: int,
                prompt_len: int, walk_impl: str = "auto", temperature: float = 0.0,
                attention_impl: str = "auto", draft_w2: str = "auto") -> dict[str, Piece]:
  """The loop's parts at one point (batch, k, context length) as ``Piece`` s:
  ``{"total", "verify"}`` for ``draft_len = 0``, else ``PIECES``."""
  if draft_len < 0 or draft_len > drafter.config.block_size:
    raise ValueError(f"draft_len={draft_len} must be in [0, block_size="
                     f"{drafter.config.block_size}]")
  if batch < 1 or prompt_len < 1:
    raise ValueError(f"batch={batch} and prompt_len={prompt_len} must be >= 1")
  steps = draft_len
  policy = FixedDraftLength(steps)
  loop.check_models(target, drafter, policy)
  from wts_jax.specdecode import attention
  settings = loop.LoopSettings(max_new_tokens=1 << 30, temperature=temperature,
                               draft_lens=(steps,), walk_impl=walk_impl,
                               cache_len=prompt_len + steps + 2,
                               attention=attention.resolve(attention_impl),
                               draft_w2=draft_w2)
  layer_ids = drafter.config.target_layer_ids
  length = jnp.full((batch,), prompt_len, jnp.int32)
  key = jax.random.key(0)

  def last():
    return jnp.arange(batch, dtype=jnp.int32) % target.config.vocab_size

  def target_cache():
    return target.empty_cache(batch, settings.cache_len)

  def draft_cache():
    return drafter.empty_cache(batch, settings.cache_len)

  def target_features():   # what the verify pass hands the drafter's context
    return jnp.zeros((batch, steps + 1, len(layer_ids) * target.config.hidden_size),
                     drafter.dtype)

  def whole_iteration(target_, drafter_, state):
    out = loop.iteration(target_, loop.with_walk_head(drafter_, settings, batch), policy,
                         state, settings)
    # back to the measured context length and an unfinished batch for the next run
    return {**out, "length": length, "generated": jnp.ones_like(length),
            "active": jnp.ones_like(out["active"])}

  def loop_state():
    return dict(target_cache=target_cache(), draft_cache=draft_cache(), length=length + 0,
                last=last(), out_tokens=jnp.zeros((batch, steps + 2), jnp.int32),
                generated=jnp.ones_like(length), active=jnp.ones((batch,), bool),
                policy_state=policy.init(batch), key=key,
                eos_ids=jnp.array([-1], jnp.int32), iterations=jnp.int32(0),
                accepted=jnp.zeros_like(length), steps=jnp.zeros_like(length),
                status=jnp.int32(0), **loop.clock_state())

  def verify(target_, drafter_, carry):
    tokens, cache = carry
    out = target_.forward(tokens, length, cache, feature_layers=layer_ids,
                          attention_impl=settings.attention)
    _, bonus = verify_greedy(tokens[:, 1:], out.logits, jnp.full((batch,), steps))
    return tokens.at[:, 0].set(bonus), out.cache

  def draft_backbone(target_, drafter_, carry):
    tokens, cache, features = carry
    base, _, cache = drafter_.block(tokens, length, cache, attention_impl=settings.attention)
    bump = jnp.argmax(base[:, 0], axis=-1).astype(jnp.int32)
    # The context comes after the block, as in the loop (there from the verify pass the
    # draft feeds): written before the block's attention read the cache, it would make
    # XLA copy the cache to keep the block's keys.
    keys, values = drafter_.context_kv(
        jnp.where(bump[:, None, None] < 0, 0, features), length)
    return bump, cache.write(keys, values, length), features

  def walk(target_, drafter_, carry):
    tokens, base, hidden = carry
    drafter_ = loop.with_walk_head(drafter_, settings, batch)
    # Tie the base logits to the carried tokens (never true) so that a walk which does
    # not read the first tokens ("none") cannot be hoisted out of the chain.
    block = jnp.where(tokens[:, None, None] < 0, 0.0, base[:, :steps]).astype(base.dtype)
    draft = drafter_.draft(block, hidden[:, :steps], tokens, temperature=temperature,
                           key=key, walk_impl=walk_impl)
    return draft.tokens[:, -1], base, hidden

  def walk_inputs():
    block = jax.jit(lambda d, c: d.block(last(), length, c,
                                         attention_impl=settings.attention))
    base, hidden, _ = block(drafter, draft_cache())
    return last(), base, hidden

  pieces = {"total": Piece(whole_iteration, loop_state),
            "verify": Piece(verify, lambda: (jnp.broadcast_to(last()[:, None],
                                                              (batch, steps + 1)),
                                             target_cache()))}
  if draft_len == 0:
    return pieces
  return {**pieces,
          "drafter": Piece(draft_backbone,
                           lambda: (last(), draft_cache(), target_features())),
          "walk": Piece(walk, walk_inputs)}


def _chain(step: Callable, chain: int, cublas_products: bool):
  """``step`` run ``chain`` times in one jitted executable, the carry donated."""
  return jax.jit(lambda w, c: jax.lax.fori_loop(0, chain, lambda _, x: step(w, x), c),
                 donate_argnums=1,
                 compiler_options=loop.compiler_options(cublas_products=cublas_products))


def chained_seconds(step: Callable, weights, carry, *, chain: int, repeats: int,
                    cublas_products: bool = False, runs: dict | None = None,
                    key=None) -> float:
  """Median seconds of one ``step(weights, carry) -> carry``, run ``chain`` times a sample.

  The carry is donated and each call's result feeds the next call, so a step that
  writes a cache updates it in place instead of copying it at every call. ``runs``: the
  jitted chains already built, or compiled (``compile_iterations``), by ``key`` — a step
  timed again (the profiler's contested points) reuses its trace and compile instead of
  paying them twice; the carry, which holds the caches, is never kept.
  """
  run = None if runs is None else runs.get(key)
  if run is None:
    run = _chain(step, chain, cublas_products)
    if runs is not None:
      runs[key] = run
  with warnings.catch_warnings():
    # the CPU cannot donate; the figures there are only a check
    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    carry = jax.block_until_ready(run(weights, carry))      # compile and warm up
    samples = []
    for _ in range(repeats):
      begin = time.perf_counter()
      carry = jax.block_until_ready(run(weights, carry))
      samples.append((time.perf_counter() - begin) / chain)
  return float(np.median(samples))


def _piece_step(target: Qwen3, drafter: DSparkDrafter, piece: Piece):
  """A ``Piece`` as ``step(weights, carry)`` with the models' weights as its operand, and
  those weights. (Large operands ride in the carry or the weights: closed over, they
  would become constants baked into the executable.)"""
  (target_graph, target_state), (drafter_graph, drafter_state) = (nnx.split(target),
                                                                  nnx.split(drafter))

  def step(weights, carry):
    return piece.step(nnx.merge(target_graph, weights[0]),
                      nnx.merge(drafter_graph, weights[1]), carry)
  return step, (target_state, drafter_state)


def piece_seconds(target: Qwen3, drafter: DSparkDrafter, piece: Piece, *, chain: int,
                  repeats: int, cublas_products: bool = False, runs: dict | None = None,
                  key=None) -> float:
  """``chained_seconds`` of a ``Piece`` with the models' weights as operands, compiled
  as the loop is (``cublas_products``: ``loop.compiler_options``; ``runs``, ``key``: as
  there)."""
  step, weights = _piece_step(target, drafter, piece)
  return chained_seconds(step, weights, piece.carry(), chain=chain, repeats=repeats,
                         cublas_products=cublas_products, runs=runs, key=key)


def _point_key(piece: str, *, batch: int, draft_len: int, prompt_len: int, walk_impl: str,
               temperature: float, attention_impl: str, draft_w2: str, chain: int):
  """``runs``' key of a piece at one point."""
  return (piece, batch, draft_len, prompt_len, walk_impl, temperature, attention_impl,
          draft_w2, chain)


def compile_iterations(target: Qwen3, drafter: DSparkDrafter, *, batch: int,
                       draft_lens: tuple[int, ...], prompt_len: int, runs: dict,
                       walk_impl: str = "auto", chain: int = 8, temperature: float = 0.0,
                       attention_impl: str = "auto", draft_w2: str = "auto",
                       threads: int = 8) -> dict[str, float]:
  """The whole iteration (``total``) at ``batch`` for each of ``draft_lens``, traced one
  after another and compiled in ``threads`` threads at once (the compiler leaves the
  interpreter free; a cost table's bucket is otherwise one compile after another),
  into ``runs`` under the keys ``iteration_cost`` looks up. Points already there are
  skipped. Returns the wall seconds of the tracing and of the compiles."""
  begin = time.perf_counter()
  lowered = {}
  for draft_len in draft_lens:
    key = _point_key("total", batch=batch, draft_len=draft_len, prompt_len=prompt_len,
                     walk_impl=walk_impl, temperature=temperature,
                     attention_impl=attention_impl, draft_w2=draft_w2, chain=chain)
    if key in runs:
      continue
    piece = loop_pieces(target, drafter, batch=batch, draft_len=draft_len,
                        prompt_len=prompt_len, walk_impl=walk_impl, temperature=temperature,
                        attention_impl=attention_impl, draft_w2=draft_w2)["total"]
    step, weights = _piece_step(target, drafter, piece)
    run = _chain(step, chain, loop.cublas_products(batch))
    lowered[key] = run.lower(weights, jax.eval_shape(piece.carry))
  traced = time.perf_counter()
  if lowered:
    with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(lowered)))) as pool:
      runs.update(zip(lowered, pool.map(lambda low: low.compile(), lowered.values())))
  return {"trace_s": traced - begin, "compile_s": time.perf_counter() - traced}


def iteration_cost(target: Qwen3, drafter: DSparkDrafter, *, batch: int, draft_len: int,
                   prompt_len: int, walk_impl: str = "auto", repeats: int = 5,
                   chain: int = 8, temperature: float = 0.0,
                   pieces: tuple[str, ...] = PIECES, attention_impl: str = "auto",
                   draft_w2: str = "auto", runs: dict | None = None) -> dict[str, float]:
  """Device seconds of one decode iteration: ``{"total_s", "verify_s", "drafter_s",
  "walk_s"}`` (see the module docstring for the method). ``pieces`` chooses what to
  measure (each costs a compile); the others come back as NaN. ``runs``: a dict that
  keeps each measured piece's compiled chain, so that timing the same point again
  (same models and arguments) compiles nothing."""
  unknown = set(pieces) - set(PIECES)
  if unknown:
    raise ValueError(f"pieces={pieces!r} has {sorted(unknown)}; choose from {PIECES}")
  found = loop_pieces(target, drafter, batch=batch, draft_len=draft_len,
                      prompt_len=prompt_len, walk_impl=walk_impl, temperature=temperature,
                      attention_impl=attention_impl, draft_w2=draft_w2)
  timed = dict(chain=chain, repeats=repeats,
               cublas_products=loop.cublas_products(batch))
  result = {f"{piece}_s": float("nan") if piece in found else 0.0 for piece in PIECES}
  point = dict(batch=batch, draft_len=draft_len, prompt_len=prompt_len, walk_impl=walk_impl,
               temperature=temperature, attention_impl=attention_impl, draft_w2=draft_w2,
               chain=chain)
  for piece in PIECES:
    if piece in pieces and piece in found:
      result[f"{piece}_s"] = piece_seconds(target, drafter, found[piece], **timed,
                                           runs=runs, key=_point_key(piece, **point))
  return result
