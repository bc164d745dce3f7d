"""The vocabulary-sharded walk: ``wts_jax.walk`` on a head whose W2 (and W1, and the base
logits) are split along V over a mesh axis.

Every device walks its own slice of the vocabulary — nothing V-sized moves between
devices — and each step the devices agree on the token by exchanging their best
(score, global column) (``exchange``). The tokens are the one-device walk's: exactly
(greedy, ties to the lowest column) and bit for bit with the same key (sampled: the
noise of a column is drawn by its global index).

Implementations (``impl``): ``"xla"`` (and ``"auto"``): the reference walk on each
device's slice, one ``all_gather`` a step; ``"pallas"``: the same loop with each
device's step computed by one Pallas launch (``step_kernel``), the exchange between
launches — the fallback form of a kernel until the exchange runs inside the persistent
kernel (``device_exchange_mgpu`` and docs/sharded.md have that design).
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from wts_jax import validation
from wts_jax.output import WalkOutput
from wts_jax.sharded.local_walk import local_walk, xla_scores
from wts_jax.sharded.placement import (Placement, axes_of, leaf_specs, w2_array,
                                       w2_vocab_dim, walk_view)

IMPLEMENTATIONS = ("auto", "xla", "pallas")


def implementation(impl: str, config) -> str:
  """What runs a sharded walk under ``impl`` and ``config``: ``"xla"`` or ``"pallas"``
  (the step kernel), or one error naming the value."""
  if impl in ("auto", "xla"):
    if config is not None:
      raise ValueError(f"config={config!r} is a kernel's; impl={impl!r} runs the XLA "
                       "sharded walk, which takes none")
    return "xla"
  if impl == "pallas":
    from wts_jax.sharded import step_kernel
    step_kernel.scores_for(config)   # checks the config
    return "pallas"
  raise ValueError(
      f"impl={impl!r} cannot run a vocabulary-sharded walk: it must be one of "
      f"{IMPLEMENTATIONS} (the persistent kernels walk one device's whole vocabulary; "
      "the sharded walk runs the XLA step or the sharded step kernel on each slice)")


def _scores(impl: str, config):
  """The device step of ``impl``: XLA's, or the step kernel's with ``config``."""
  if implementation(impl, config) == "xla":
    return xla_scores
  from wts_jax.sharded import step_kernel
  return step_kernel.scores_for(config)


def check_inputs(head, base_logits, first_tokens, hidden, where: Placement) -> None:
  """``walk``'s checks on a sharded walk's inputs: global arrays outside ``shard_map``,
  one device's inside (its W2 rows and base-logit columns the same slice)."""
  shards = (lax.axis_size(axes_of(where.layout.vocab_axis)) if where.inside_shard_map
            else 1)
  validation.check_walk_inputs(head, base_logits, first_tokens, hidden,
                               vocab_shards=shards)
  if where.inside_shard_map:
    rows = w2_array(head).shape[w2_vocab_dim(head)]
    if rows != base_logits.shape[-1]:
      raise ValueError(f"markov_w2 holds {rows} vocabulary rows here but base_logits "
                       f"{base_logits.shape[-1]} columns; inside shard_map both must be "
                       "the device's slice")


def sharded_walk(head, base_logits, first_tokens, hidden, where: Placement,
                 mode: validation.Sampling, *, return_logits: bool = False,
                 return_logprobs: bool = False, impl: str = "auto",
                 config=None) -> WalkOutput:
  """The walk of a head split along V (``where``: ``placement.placement``'s answer), its
  inputs checked by ``check_inputs`` and its sampling made by ``make_sampling``."""
  scores = _scores(impl, config)
  if not head.config.needs_hidden:
    hidden = None
  layout = where.layout
  if where.inside_shard_map:
    return local_walk(head, base_logits, first_tokens, hidden, mode.score_scale,
                      mode.noise_on, mode.seed, layout=layout,
                      return_logits=return_logits, return_logprobs=return_logprobs,
                      scores=scores)
  view = walk_view(head)
  leaves, treedef = jax.tree.flatten(view)
  return _mesh_walk(leaves, base_logits, first_tokens, hidden, mode.score_scale,
                    mode.noise_on, mode.seed, treedef=treedef,
                    specs=tuple(leaf_specs(view, layout)), mesh=where.mesh, layout=layout,
                    confidence=head.confidence_head is not None,
                    return_logits=return_logits, return_logprobs=return_logprobs,
                    scores=scores)


@functools.partial(jax.jit, static_argnames=(
    "treedef", "specs", "mesh", "layout", "confidence", "return_logits", "return_logprobs",
    "scores"))
def _mesh_walk(leaves, base_logits, first_tokens, hidden, score_scale, noise_on, seed, *,
               treedef, specs, mesh, layout, confidence, return_logits, return_logprobs,
               scores) -> WalkOutput:
  batch, vocab = layout.batch_axis, layout.vocab_axis
  rows = P(batch)
  in_specs = (list(specs), P(batch, None, vocab), rows, P(batch, None, None), rows, rows,
              P())
  out_specs = WalkOutput(tokens=P(batch, None), status=P(),
                         confidence=P(batch, None) if confidence else None,
                         logits=P(batch, None, vocab) if return_logits else None,
                         logprobs=P(batch, None) if return_logprobs else None)

  def device_walk(leaves, base, first, hidden, score_scale, noise_on, seed):
    head = jax.tree.unflatten(treedef, leaves)
    return local_walk(head, base, first, hidden, score_scale, noise_on, seed,
                      layout=layout, return_logits=return_logits,
                      return_logprobs=return_logprobs, scores=scores)

  # The replicated outputs (tokens, confidence, status) are equal on every device of the
  # vocabulary axis by construction (the exchange), which the replication check cannot
  # see through a gather-and-select.
  walk = jax.shard_map(device_walk, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=False)
  args = (leaves, base_logits, first_tokens, hidden, score_scale, noise_on, seed)
  if _explicit(mesh):
    # On explicit mesh axes shard_map takes each input only as its spec lays it out; an
    # input laid out otherwise moves here (nothing, for a head split as the walk needs).
    args = jax.tree.map(
        lambda x, spec: None if x is None else jax.sharding.reshard(
            x, NamedSharding(mesh, spec)), args, in_specs, is_leaf=lambda x: x is None)
  return walk(*args)


def _explicit(mesh) -> bool:
  explicit = getattr(jax.sharding.AxisType, "Explicit", None)
  return any(kind == explicit for kind in getattr(mesh, "axis_types", ()))
