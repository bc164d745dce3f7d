"""The seam between ``wts_jax.walk`` and the kernels: the backend protocol, the registry,
and the one choice of backend per call.

A backend is one module with:

- ``plan(head, shapes: WalkShapes, config, device: DeviceFacts) -> plan | Refusal``:
  everything static about a launch of this walk (pure Python on shapes; the budget
  checks happen here), or why the backend cannot run it;
- ``launch(plan, operands: WalkOperands) -> WalkOutput``: the launch of exactly that plan.

Registering a new backend (say ``mosaic_int8`` in ``pallas/mosaic_int8_walk.py``):

1. write the module with ``plan`` and ``launch`` (``mosaic_backend.py`` is a model: its
   ``plan`` refuses what the kernel cannot run, with a sentence naming the value);
2. add one entry to ``REGISTRY``: ``"mosaic_int8": Entry("wts_jax.pallas.mosaic_int8_walk",
   MosaicConfig)`` — the config class the backend's ``plan`` receives (a field of
   ``walk_config``: the package must import without a GPU, so the module is only
   imported when a walk asks the backend to plan);
3. to make ``impl="auto"`` pick it, name it in the tuned table of the device
   (``pallas/tuned/<device kind>.json``) or in ``_fallback_preference``.

``impl="mosaic_int8"`` then runs it or raises one error with its refusal; ``"auto"`` asks
every backend and takes the table's choice among those that accept.

The choice, once per call (``choose``): every candidate backend plans the walk (reading
the device once); the refusals are collected; the tuned table of the device (keyed by
head type, V, r, batch bucket, W2 dtype, greedy/sampled) or, off the table, the
planners' fallback preference orders the backends that accept; the first is launched.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import pathlib
import re

import jax
import jax.numpy as jnp

from wts_jax import device as device_facts
from wts_jax.walk_config import MosaicConfig, TritonConfig, WalkConfig


@dataclasses.dataclass(frozen=True)
class Refusal:
  """Why a backend cannot run a walk: one sentence that names the value."""
  reason: str


@dataclasses.dataclass(frozen=True)
class WalkShapes:
  """What a planner may know about a walk besides the head: static facts only."""
  batch: int
  steps: int
  base_itemsize: int = 2
  greedy: bool = True
  return_logits: bool = False
  return_logprobs: bool = False

  @classmethod
  def of(cls, base_logits, greedy: bool, *, return_logits=False, return_logprobs=False):
    batch, steps, _ = base_logits.shape
    return cls(batch=batch, steps=steps,
               base_itemsize=jnp.dtype(base_logits.dtype).itemsize, greedy=greedy,
               return_logits=return_logits, return_logprobs=return_logprobs)


@dataclasses.dataclass(frozen=True)
class WalkOperands:
  """The validated inputs of one walk, as ``launch`` receives them."""
  head: object
  base_logits: object
  first_tokens: object
  hidden: object
  mode: object      # validation.Sampling


@dataclasses.dataclass(frozen=True)
class Entry:
  module: str         # imported when a walk first asks the backend to plan
  config_type: type   # the config its ``plan`` receives


# Registry order is the order of the fallback after the preferred backend, and of the
# refusals in an error.
REGISTRY: dict[str, Entry] = {
    "mosaic": Entry("wts_jax.pallas.mosaic_backend", MosaicConfig),
    "triton": Entry("wts_jax.pallas.triton_backend", TritonConfig),
}
KERNEL_ALIAS = "pallas"   # impl="pallas": the best kernel, never XLA (the older spelling)


def implementations() -> tuple[str, ...]:
  return ("auto", KERNEL_ALIAS, "xla", *REGISTRY)


@dataclasses.dataclass(frozen=True)
class Choice:
  impl: str                           # a backend's name, or "xla"
  plan: object = None                 # that backend's plan (None for XLA)
  refusals: tuple[tuple[str, str], ...] = ()   # (backend, reason) of those that refused

  def launch(self, operands: WalkOperands):
    return module(self.impl).launch(self.plan, operands)


def module(name: str):
  return importlib.import_module(REGISTRY[name].module)


def _config_for(name: str, config):
  """The config backend ``name`` plans with; None when ``config`` is another backend's."""
  entry = REGISTRY[name]
  if config is None:
    return entry.config_type()
  if isinstance(config, WalkConfig):
    if config.backend not in ("auto", name):
      return None
    try:
      return config.for_backend(name)
    except KeyError:   # a backend WalkConfig predates: only by its own config
      return None
  return config if isinstance(config, entry.config_type) else None


def check_config(config) -> None:
  types = (WalkConfig, *{entry.config_type for entry in REGISTRY.values()})
  if config is not None and not isinstance(config, types):
    names = ", ".join(sorted(t.__name__ for t in types))
    raise TypeError(f"config={config!r} must be None or one of {names}")


def plan_one(name: str, head, shapes: WalkShapes, config, device) -> object:
  """Backend ``name``'s plan of this walk, or its ``Refusal``."""
  try:
    backend = module(name)
  except ImportError as err:  # pragma: no cover - depends on the installed jaxlib
    return Refusal(f"the {name} backend failed to import: {err}")
  return backend.plan(head, shapes, config, device)


def refusal_reason(name: str, head, batch: int, config=None, *, steps: int = 1,
                   greedy: bool = True, return_logits: bool = False,
                   return_logprobs: bool = False, device=None) -> str | None:
  """Why backend ``name`` cannot run such a walk (None when it can)."""
  config = _config_for(name, config)
  if config is None:
    return f"the config is not the {name} backend's"
  shapes = WalkShapes(batch=batch, steps=steps, greedy=greedy,
                      return_logits=return_logits, return_logprobs=return_logprobs)
  plan = plan_one(name, head, shapes, config, device or device_facts.current())
  return plan.reason if isinstance(plan, Refusal) else None


def choose(head, shapes: WalkShapes, impl: str = "auto", config=None, *,
           require_gpu: bool = True, device=None) -> Choice:
  """The backend that runs this walk and its plan: each candidate plans once.

  ``impl``: "xla"; a backend's name (it runs, or one error gives its reason);
  "pallas" (the preferred backend that accepts, or one error listing every refusal);
  "auto" (the same, else XLA). ``require_gpu=False`` plans as on the device even
  without one (tests, lowering for CUDA on the CPU)."""
  if impl not in implementations():
    raise ValueError(f"impl={impl!r} must be one of {implementations()}")
  check_config(config)
  if impl == "xla":
    return Choice("xla")
  candidates = [name for name in REGISTRY if impl in ("auto", KERNEL_ALIAS, name)
                and _config_for(name, config) is not None]
  if impl not in ("auto", KERNEL_ALIAS) and not candidates:
    raise ValueError(f"config={config!r} is not for impl={impl!r}")
  interpret = bool(getattr(config, "interpret", False))
  if require_gpu and not interpret and not device_facts.has_gpu():
    reason = (f"no GPU (default backend is {jax.default_backend()!r}; "
              "use impl='xla')")
    return _refused(impl, [(name, reason) for name in candidates], common=reason)
  device = device or device_facts.current()
  plans, refusals = {}, []
  for name in candidates:
    plan = plan_one(name, head, shapes, _config_for(name, config), device)
    if isinstance(plan, Refusal):
      refusals.append((name, plan.reason))
    else:
      plans[name] = plan
  if not plans:
    return _refused(impl, refusals)
  order = preference(head, shapes, device.kind, interpret=interpret)
  chosen = min(plans, key=lambda name: (order.index(name) if name in order else len(order),
                                        list(REGISTRY).index(name)))
  return Choice(chosen, plans[chosen], tuple(refusals))


def _refused(impl: str, refusals, common: str | None = None) -> Choice:
  if impl == "auto":
    return Choice("xla", refusals=tuple(refusals))
  if common is None:
    common = "; ".join(f"{name}: {reason}" for name, reason in refusals)
  raise ValueError(f"impl={impl!r} cannot run this walk: {common}")


# --- the preference: the tuned table of the device, else the planners' ---------------

TUNED_DIR = pathlib.Path(__file__).with_name("tuned")
BATCH_BUCKETS = (1, 4, 16, 64, 128)


def batch_bucket(batch: int) -> int:
  return next((bucket for bucket in BATCH_BUCKETS if batch <= bucket), BATCH_BUCKETS[-1])


def table_key(head, shapes: WalkShapes) -> tuple:
  """(head type, V, r, batch bucket, W2 dtype, "greedy" | "sampled")."""
  config = head.config
  w2_dtype = jnp.dtype(head.markov_head.markov_w2.weight.dtype).name
  return (config.head_type, config.vocab_size, config.rank, batch_bucket(shapes.batch),
          w2_dtype, "greedy" if shapes.greedy else "sampled")


def table_file(device_kind: str) -> pathlib.Path:
  return TUNED_DIR / (re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_") + ".json")


@functools.lru_cache(maxsize=None)
def tuned_table(device_kind: str) -> dict[tuple, dict]:
  """The committed table of ``device_kind`` ({} when there is none): key -> entry."""
  path = table_file(device_kind)
  if not path.exists():
    return {}
  table = json.loads(path.read_text())
  return {(e["head"], e["vocab"], e["rank"], e["batch"], e["w2"], e["mode"]): e
          for e in table["entries"]}


def _fallback_preference(head, shapes: WalkShapes) -> tuple[str, ...]:
  # Measured on the H200 (NOTES.md v5-v7, v10, v11, v13-v15, v20, v22): Mosaic is faster
  # for vanilla walks at one row (the row kernel) and from 2 to 64 rows (the batched
  # kernel), greedy and sampled, and for the gated and rnn heads from one row to 64 (the
  # batched kernel, their update split over the blocks; an int8 W2 widened to bf16);
  # past 64 rows the Triton kernel.
  from wts_jax.pallas.mosaic_batched_plan import AUTO_BATCHED_RANGE
  from wts_jax.pallas.mosaic_plan import AUTO_MAX_BATCH
  low, high = AUTO_BATCHED_RANGE
  head_type = head.config.head_type
  batched = low < shapes.batch <= high
  faster = ((head_type == "vanilla" and (shapes.batch <= AUTO_MAX_BATCH or batched))
            or (head_type in ("gated", "rnn") and shapes.batch <= high))
  return ("mosaic", "triton") if faster else ("triton", "mosaic")


def preference(head, shapes: WalkShapes, device_kind: str, *,
               interpret: bool = False) -> tuple[str, ...]:
  """Backends in the order ``impl="auto"`` tries them for this walk."""
  if interpret:
    # Interpret mode prefers the Triton kernel: jax 0.10.2's Mosaic GPU interpreter
    # cannot run every variant (the Mosaic interpret tests name it).
    return ("triton", "mosaic")
  if shapes.return_logits or shapes.return_logprobs:
    # The Mosaic kernels return them by a second pass over the drafted tokens
    # (``reference.logits_of_tokens``), not yet measured against the Triton kernel's
    # in-kernel logits; the table was measured without them.
    return ("triton", "mosaic")
  entry = tuned_table(device_kind).get(table_key(head, shapes))
  if entry is not None:
    return (entry["impl"], *[n for n in _fallback_preference(head, shapes)
                             if n != entry["impl"]])
  return _fallback_preference(head, shapes)
