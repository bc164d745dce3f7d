"""The sharded paths: the walk split along V over every GPU of the host
(``wts_jax.sharded``), W2 and the base logits split, W1 whole (as sglang-jax holds it).

- ``sharded-stepwise``: the XLA walk on each GPU's slice, one ``all_gather`` of the
  step's candidates a step (``walk(impl="xla")`` on the placed head);
- ``sharded-step-kernel``: one Pallas step kernel a step on each GPU's slice, the
  exchange between launches (``walk(impl="pallas")``): the fallback form of a kernel on
  a sharded head until the walk kernels run the in-kernel exchange
  (``sharded.device_exchange_mgpu``; docs/sharded.md), which has no path yet.

Each needs two GPUs or more on one host and says so where there are fewer. The harness's
first tokens and flush buffer are replicated on the path's mesh (``Prepared.place``), so
the flush before every walk empties every GPU's L2; the floor of a record is the sharded
one (``floor.walk_floor(..., devices=n)``, with the exchange term).
"""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from wts_jax import validation
from wts_jax.bench.registry import BenchMode, Prepared, SkipPath, jax_prepared

VOCAB_AXIS = "tensor"


def available_sharded() -> str | None:
  backend = jax.default_backend()
  if backend != "gpu":
    return f"needs 2 or more GPUs on one host (JAX backend is {backend!r})"
  count = jax.local_device_count()
  if count < 2:
    return f"needs 2 or more GPUs on one host (this host has {count})"
  return None


def bench_mesh(devices=None):
  """A mesh of ``devices`` (default: every local device) along the vocabulary axis."""
  devices = list(devices if devices is not None else jax.local_devices())
  return jax.make_mesh((len(devices),), (VOCAB_AXIS,), devices=devices,
                       axis_types=(jax.sharding.AxisType.Explicit,))


def prepare_sharded(impl: str, head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                    return_logits: bool = False, devices=None) -> Prepared:
  from wts_jax import api
  from wts_jax.sharded.placement import place_head
  head = validation.as_draft_head(head)
  mesh = bench_mesh(devices)
  count = mesh.shape[VOCAB_AXIS]
  if head.config.vocab_size % count:
    raise SkipPath(f"vocab_size={head.config.vocab_size} is not a multiple of the "
                   f"{count} devices")
  if impl == "pallas" and head.markov_head.z_as_int8_planes:
    raise SkipPath("the sharded step kernel meets an int8 W2 with an fp32 z, not planes")
  whole = NamedSharding(mesh, P())

  def place(array):
    return None if array is None else jax.device_put(array, whole)

  placed = place_head(head, mesh, VOCAB_AXIS, split_w1=False)
  base = jax.device_put(base_logits, NamedSharding(mesh, P(None, None, VOCAB_AXIS)))

  def walk_fn(operands, first):
    head, base, hidden, key = operands
    return api.walk(head, base, first, hidden, temperature=mode.walk_temperature, key=key,
                    return_logits=return_logits, impl=impl)

  prepared = jax_prepared(walk_fn, (placed, base, place(hidden), place(mode.key)),
                          place(first_tokens), place=place)
  prepared.notes["devices"] = count
  return prepared


def prepare_sharded_stepwise(*args, **kwargs) -> Prepared:
  return prepare_sharded("xla", *args, **kwargs)


def prepare_sharded_step_kernel(*args, **kwargs) -> Prepared:
  return prepare_sharded("pallas", *args, **kwargs)
