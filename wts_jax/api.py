"""``wts_jax.walk``: the public entry point, and the choice of implementation."""

from __future__ import annotations

import jax

from wts_jax import sharded, validation
from wts_jax.heads.engine import uses_w2_kernel
from wts_jax.output import WalkOutput, check
from wts_jax.walk_config import KernelConfig


def _backend():
  # The registry imports no GPU code itself; each backend's module is imported when a
  # walk first asks it to plan.
  from wts_jax.pallas import backend
  return backend


def walk(head, base_logits: jax.Array, first_tokens: jax.Array,
         hidden: jax.Array | None = None, *, temperature=0.0, key: jax.Array | None = None,
         return_logits: bool = False, return_logprobs: bool = False,
         impl: str = "auto", config: KernelConfig | None = None,
         vocab_axis=None, batch_axis=None, mesh=None) -> WalkOutput:
  """Walk the serial head over a block of K draft positions.

  Args:
    head: a ``DraftHead`` (or a bare serial head), e.g. from ``wts_jax.load``.
    base_logits: [B, K, V] backbone logits of the K draft positions.
    first_tokens: [B] int, the last accepted token ``x_{-1}`` of each row.
    hidden: [B, K, d] backbone hidden states; needed by the gated and rnn heads and by
      the confidence head.
    temperature: 0 for greedy; a number > 0 or a [B] array (0 entries stay greedy)
      samples by Gumbel-max with ``key``'s counter-based noise.
    key: a JAX PRNG key, needed when sampling; the same key gives the same tokens on
      every implementation.
    return_logits / return_logprobs: also return the corrected logits [B, K, V] /
      the log-probability of each drafted token [B, K].
    impl: a Weights-That-Stay kernel by name — ``"mosaic_row"``, ``"mosaic_batched"``,
      ``"mosaic_stacked"``, ``"triton"`` (an error gives its reason when it cannot run
      the walk) — or ``"mosaic"`` (the best Mosaic kernel for the walk), ``"xla"`` (the
      step-wise reference), ``"auto"`` (the kernel the device's tuned table prefers
      among those that can run the walk, else XLA) or ``"pallas"`` (as ``"auto"`` but
      never XLA: an error lists every kernel's reason).
    config: ``None`` (the tuned defaults), or one kernel's config
      (``TritonConfig``, ``MosaicRowConfig``, ``MosaicBatchedConfig``,
      ``MosaicStackedConfig``) with its options: it names that kernel.
    vocab_axis, batch_axis, mesh: a walk split across devices (docs/sharded.md). A head
      whose W2 carries a ``NamedSharding`` splitting V over a mesh axis is walked
      sharded without them; ``vocab_axis`` names that axis where the arrays' shardings
      are not visible (under ``jit`` on automatic mesh axes, with ``mesh`` or a context
      mesh) or, inside ``shard_map``, where the arrays are each device's slice.
      ``batch_axis``: the axis the batch rows are split over (read from the base
      logits' sharding when it is visible). ``impl`` is then ``"auto"``/``"xla"`` or
      ``"pallas"`` (the sharded step kernel, ``config`` a ``StepKernelConfig``).

  Returns a ``WalkOutput``. Called eagerly, a reported problem (NaN logits, a barrier
  timeout) raises ``WalkError``; under ``jit`` it is left in ``WalkOutput.status``.
  """
  head = validation.as_draft_head(head)
  where = sharded.placement(head, base_logits, vocab_axis=vocab_axis,
                            batch_axis=batch_axis, mesh=mesh)
  if where is not None:
    sharded.check_inputs(head, base_logits, first_tokens, hidden, where)
    mode = validation.make_sampling(temperature, key, base_logits.shape[0])
    output = sharded.sharded_walk(head, base_logits, first_tokens, hidden, where, mode,
                                  return_logits=return_logits,
                                  return_logprobs=return_logprobs, impl=impl, config=config)
    return _finished(output, mode, base_logits, vocab_split=True)
  impl = _impl_for_layout(head, impl)
  validation.check_walk_inputs(head, base_logits, first_tokens, hidden)
  mode = validation.make_sampling(temperature, key, base_logits.shape[0])
  if not head.config.needs_hidden:
    hidden = None  # nothing reads it; keep it out of the compiled program

  backend = _backend()
  shapes = backend.WalkShapes.of(base_logits, mode.greedy, return_logits=return_logits,
                                 return_logprobs=return_logprobs)
  choice = backend.choose(head, shapes, impl, config)
  output = choice.launch(backend.WalkOperands(head, base_logits, first_tokens, hidden,
                                              mode))
  return _finished(output, mode, base_logits)


def _finished(output: WalkOutput, mode, base_logits, *, vocab_split: bool = False
              ) -> WalkOutput:
  # status bits from the inputs and the outputs, whichever implementation ran
  output = validation.finish_walk(output, mode, base_logits, vocab_split=vocab_split)
  if validation.is_concrete(output.status):
    check(output)
  return output


def _impl_for_layout(head, impl: str) -> str:
  """A head holding W2 as an engine's kernel [r, V] (``head_from_arrays``) is walked by
  XLA where it lies: the kernels read W2 by rows [V, r], which would need a copy."""
  if not uses_w2_kernel(head) or impl == "xla":
    return impl
  if impl == "auto":
    return "xla"
  raise ValueError(f"impl={impl!r}: this head holds W2 as a Linear kernel [r, V] "
                   "(head_from_arrays); the kernels read W2 by rows [V, r]: use "
                   "impl='xla' or 'auto', or give the head W2 as rows")


def chosen_implementation(head, base_logits, impl: str = "auto", config=None, *,
                          temperature=0.0, return_logits: bool = False,
                          return_logprobs: bool = False) -> str:
  """The implementation ``walk(..., impl=impl, config=config)`` would run: a backend's
  name (``"mosaic_row"``, ``"mosaic_batched"``, ``"mosaic_stacked"``, ``"triton"`` or
  ``"xla"``); for a head split along V (its W2's ``NamedSharding``), ``"xla"`` or
  ``"pallas"`` (the sharded step kernel)."""
  head = validation.as_draft_head(head)
  if sharded.placement(head, base_logits) is not None:
    return sharded.implementation(impl, config)
  backend = _backend()
  greedy = validation.make_sampling(temperature, jax.random.key(0),
                                    base_logits.shape[0]).greedy
  shapes = backend.WalkShapes.of(base_logits, greedy, return_logits=return_logits,
                                 return_logprobs=return_logprobs)
  return backend.choose(head, shapes, _impl_for_layout(head, impl), config).impl
