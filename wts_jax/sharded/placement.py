"""Where a sharded walk's arrays lie: read from their shardings or from the caller's axis
names, and the ``PartitionSpec`` of each of the head's arrays.

Two ways in (``wts_jax.walk`` takes both):

- *global arrays* (outside ``shard_map``): the head's W2 carries a ``NamedSharding``
  that splits V over a mesh axis (read from the array, or from its type under ``jit``
  with explicit mesh axes), or the caller names ``vocab_axis`` (and the mesh, or a
  context mesh holds the axis). The walk then runs its own ``shard_map`` over that mesh.
- *one device's arrays* (inside the caller's ``shard_map``): the caller names
  ``vocab_axis``, an axis bound there; the head holds the device's W2 rows, the base
  logits its columns. W1 is the device's slice or all of it, told apart by its row
  count.
"""

from __future__ import annotations

import dataclasses

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from wts_jax.heads.engine import uses_w2_kernel
from wts_jax.sharded.local_walk import ShardLayout

# The serial head's arrays whose rows are vocabulary entries, and which of their axes is V.
# Every other array of a head (the gate / joint / confidence weights, J_h) is held whole
# by every device.
W1_PATH = ("markov_head", "markov_w1", "weight")
W2_PATHS = {("markov_head", "markov_w2", "weight"): 0,    # [V, r]
            ("markov_head", "markov_w2", "kernel"): 1,    # an engine's kernel [r, V]
            ("markov_head", "markov_w2", "scale"): 0}     # int8 / fp8 row scales [V]
# Copies a kernel reads instead of the weights (``wts_jax.derived``), each V-sized: the
# sharded walk reads the weights, so they are left out of it rather than moved.
KERNEL_ONLY_COPIES = ("markov_w1_planes", "gate_table", "joint_table")


@dataclasses.dataclass(frozen=True)
class Placement:
  """A sharded walk's mesh (None inside the caller's ``shard_map``) and layout."""
  mesh: object
  layout: ShardLayout

  @property
  def inside_shard_map(self) -> bool:
    return self.mesh is None


def axes_of(axis) -> tuple[str, ...]:
  if axis is None:
    return ()
  return tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)


def axis_bound(axis) -> bool:
  """Whether every name of ``axis`` is bound here (inside ``shard_map`` over it)."""
  try:
    for name in axes_of(axis):
      lax.axis_size(name)
  except NameError:
    return False
  return bool(axes_of(axis))


def _named_sharding(array) -> NamedSharding | None:
  """The array's ``NamedSharding``: a concrete array's own, or (under ``jit`` with
  explicit mesh axes) its type's; None when neither says."""
  if not isinstance(array, jax.core.Tracer):
    sharding = getattr(array, "sharding", None)
    return sharding if isinstance(sharding, NamedSharding) else None
  try:
    sharding = jax.typeof(array).sharding
  except (AttributeError, TypeError):
    return None
  # A traced array's type tells its layout only over explicit mesh axes; on automatic
  # axes its spec reads unsplit whatever the layout is.
  explicit = getattr(jax.sharding.AxisType, "Explicit", None)
  if not isinstance(sharding, NamedSharding) or not any(
      kind == explicit for kind in getattr(sharding.mesh, "axis_types", ())):
    return None
  return sharding


def _spec_entry(sharding: NamedSharding, dim: int):
  spec = tuple(sharding.spec) + (None,) * (dim + 1 - len(sharding.spec))
  return spec[dim]


def _split_size(mesh, axis) -> int:
  size = 1
  for name in axes_of(axis):
    size *= mesh.shape[name]
  return size


def w2_array(head):
  serial = head.markov_head
  w2 = serial.markov_w2
  return w2.kernel[...] if uses_w2_kernel(head) else w2.weight[...]


def w2_vocab_dim(head) -> int:
  return 1 if uses_w2_kernel(head) else 0


def _w1_sharded_like_w2(head, mesh, vocab_axis) -> bool:
  """From W1's sharding: split along V over ``vocab_axis`` (True), whole on every device
  (False). Unknown (a traced W1 on automatic mesh axes): split, which costs at most a
  local slice of a whole W1, where assuming it whole would gather a split one."""
  w1 = head.markov_head.markov_w1.weight[...]
  sharding = _named_sharding(w1)
  if sharding is None:
    return True
  vocab_entry, rank_entry = _spec_entry(sharding, 0), _spec_entry(sharding, 1)
  if rank_entry is not None:
    raise ValueError(f"markov_w1.weight is sharded as {sharding.spec} (along r); a sharded "
                     f"walk needs W1 whole or split along V over {vocab_axis!r}")
  if vocab_entry is None:
    return False
  if axes_of(vocab_entry) != axes_of(vocab_axis):
    raise ValueError(f"markov_w1.weight is split along V over {vocab_entry!r} but W2 over "
                     f"{vocab_axis!r}; split both over the same mesh axis, or keep W1 whole")
  return True


def _check_divides(vocab: int, shards: int, vocab_axis) -> None:
  if vocab % shards:
    raise ValueError(f"vocab_size={vocab} is not a multiple of the {shards} devices of "
                     f"vocab_axis={vocab_axis!r}: pad V to a multiple")


def placement(head, base_logits, *, vocab_axis=None, batch_axis=None,
              mesh=None) -> Placement | None:
  """Where this walk's arrays lie, or None for a walk on one device.

  With ``vocab_axis`` bound (inside ``shard_map``): the arrays are one device's. Else the
  mesh and axis come from the arguments, W2's ``NamedSharding`` or the context mesh; a
  W2 not split along V over devices (and no ``vocab_axis``) is the one-device walk."""
  vocab = head.config.vocab_size
  if vocab_axis is not None and axis_bound(vocab_axis):
    if mesh is not None:
      raise ValueError(f"mesh={mesh!r} with vocab_axis={vocab_axis!r} bound by the caller's "
                       "shard_map: inside shard_map the arrays are one device's, give no mesh")
    shards = lax.axis_size(axes_of(vocab_axis))
    _check_divides(vocab, shards, vocab_axis)
    if batch_axis is not None and not axis_bound(batch_axis):
      raise ValueError(f"batch_axis={batch_axis!r} is not bound by the caller's shard_map")
    w1_rows = head.markov_head.markov_w1.weight.shape[0]
    if w1_rows not in (vocab, vocab // shards):
      raise ValueError(f"markov_w1.weight has {w1_rows} rows; inside shard_map over "
                       f"{vocab_axis!r} it must hold all V={vocab} rows or the device's "
                       f"V/{shards}={vocab // shards}")
    return Placement(None, ShardLayout(vocab_axis=vocab_axis, batch_axis=batch_axis,
                                       vocab_size=vocab,
                                       w1_sharded=w1_rows != vocab))

  w2_sharding = _named_sharding(w2_array(head))
  if vocab_axis is None:
    if w2_sharding is None:
      return None
    vocab_axis = _spec_entry(w2_sharding, w2_vocab_dim(head))
    if vocab_axis is None or _split_size(w2_sharding.mesh, vocab_axis) == 1:
      return None
  if mesh is None:
    if w2_sharding is not None and all(name in w2_sharding.mesh.shape
                                       for name in axes_of(vocab_axis)):
      mesh = w2_sharding.mesh
    else:
      mesh = jax.sharding.get_abstract_mesh()
  missing = [name for name in axes_of(vocab_axis) + axes_of(batch_axis)
             if name not in mesh.shape]
  if missing:
    raise ValueError(f"vocab_axis={vocab_axis!r}, batch_axis={batch_axis!r}: no axis "
                     f"{missing} in the mesh {dict(mesh.shape)} (pass mesh=, or call "
                     "inside the shard_map that binds the axis)")
  _check_divides(vocab, _split_size(mesh, vocab_axis), vocab_axis)
  if batch_axis is None:
    base_sharding = _named_sharding(base_logits)
    if base_sharding is not None and base_sharding.mesh.shape == mesh.shape:
      batch_axis = _spec_entry(base_sharding, 0)
  if batch_axis is not None and base_logits.shape[0] % _split_size(mesh, batch_axis):
    raise ValueError(f"batch B={base_logits.shape[0]} is not a multiple of the "
                     f"{_split_size(mesh, batch_axis)} devices of batch_axis={batch_axis!r}")
  return Placement(mesh, ShardLayout(
      vocab_axis=vocab_axis, batch_axis=batch_axis, vocab_size=vocab,
      w1_sharded=_w1_sharded_like_w2(head, mesh, vocab_axis)))


# --- the head's arrays in the shard_map ------------------------------------------------

def walk_view(head):
  """A head sharing every weight with ``head``, without the V-sized copies only a kernel
  reads (``KERNEL_ONLY_COPIES``, an int8-planes W2's ``thread_rows``)."""
  from wts_jax.heads.base import sharing_copy
  view = sharing_copy(head)
  serial = view.markov_head
  for name in KERNEL_ONLY_COPIES:
    if getattr(serial, name, None) is not None:
      setattr(serial, name, None)
  if hasattr(serial.markov_w2, "thread_rows"):
    del serial.markov_w2.thread_rows
  return view


def _path_names(path) -> tuple[str, ...]:
  names = tuple(getattr(key, "name", getattr(key, "key", None)) for key in path)
  return tuple(name for name in names if name != "value")


def leaf_specs(head, layout: ShardLayout) -> list[P]:
  """The ``PartitionSpec`` of each leaf of ``head`` (``jax.tree.leaves`` order)."""
  specs = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(head)[0]:
    names = _path_names(path)
    if names in W2_PATHS:
      dim = W2_PATHS[names]
      specs.append(P(*([None] * dim), layout.vocab_axis))
    elif names == W1_PATH and layout.w1_sharded:
      specs.append(P(layout.vocab_axis, None))
    else:
      specs.append(P())
  return specs


def place_head(head, mesh, vocab_axis, *, split_w1: bool = True):
  """``head`` with its arrays put on ``mesh``: W2 (and its row scales) split along V over
  ``vocab_axis``, W1 too when ``split_w1`` (else whole on every device), every other
  array whole on every device; without the kernel-only copies (``walk_view``). For a
  head loaded on one device; an engine's arrays already on the mesh need no placing
  (``heads.engine.head_from_arrays``)."""
  view = walk_view(head)
  vocab = view.config.vocab_size
  shards = _split_size(mesh, vocab_axis)
  _check_divides(vocab, shards, vocab_axis)
  layout = ShardLayout(vocab_axis=vocab_axis, batch_axis=None, vocab_size=vocab,
                       w1_sharded=split_w1)
  leaves, treedef = jax.tree.flatten(view)
  placed = [jax.device_put(leaf, NamedSharding(mesh, spec))
            for leaf, spec in zip(leaves, leaf_specs(view, layout))]
  return jax.tree.unflatten(treedef, placed)
