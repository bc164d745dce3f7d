"""The seam between ``wts_jax.walk`` and the kernels: the backend protocol, the registry,
and the one choice of backend per call.

A backend is one module with:

- ``plan(head, shapes: WalkShapes, config, device: DeviceFacts) -> plan | Refusal``:
  everything static about a launch of this walk (pure Python on shapes; the budget
  checks happen here), or why the backend cannot run it;
- ``launch(plan, operands: WalkOperands) -> WalkOutput``: the launch of exactly that plan;
- ``supported_on(device: DeviceFacts) -> str | None``: why the device cannot run the
  backend's kernel (its compute capability), or None.

The registry holds one entry a kernel: ``mosaic_stacked``, ``mosaic_batched``,
``mosaic_row`` (the three Mosaic GPU kernels), ``triton``, and ``xla`` (the step-wise
reference, every walk's last resort). Registering a new backend: write the module; add
one ``Entry`` (its module, the config class its ``plan`` receives — GPU-free, in
``walk_config`` — and its family); to make ``impl="auto"`` pick it, name it in the
device's tuned table (``pallas/tuned/<device kind>/walk.json``) or in
``preference.fallback_order``.

``impl`` names a backend, or a family: ``"mosaic"`` (the best Mosaic kernel),
``"pallas"`` (the best kernel, never XLA), ``"auto"`` (the best kernel, else XLA).

The choice, once per call (``choose``): every candidate backend plans the walk (the
device read once), with the caller's config, else the tuned table's for that backend,
else its defaults; the refusals are collected; the tuned table of the device (or, off
the table, the planners' fallback order: ``preference``) orders the backends that
accept; the first is launched.
"""

from __future__ import annotations

import dataclasses
import importlib

import jax

from wts_jax import device as device_facts
from wts_jax.pallas.protocol import Refusal, WalkOperands, WalkShapes
from wts_jax.walk_config import (KERNEL_CONFIGS, MosaicBatchedConfig, MosaicRowConfig,
                                 MosaicStackedConfig, TritonConfig)


@dataclasses.dataclass(frozen=True)
class Entry:
  module: str              # imported when a walk first asks the backend to plan
  config_type: type | None  # the config its ``plan`` receives (None: it takes none)
  family: str              # "mosaic", "triton" or "xla"


# Registry order breaks ties in the preference and orders the refusals in an error.
REGISTRY: dict[str, Entry] = {
    "mosaic_stacked": Entry("wts_jax.pallas.mosaic_stacked_backend", MosaicStackedConfig,
                            "mosaic"),
    "mosaic_batched": Entry("wts_jax.pallas.mosaic_batched_backend", MosaicBatchedConfig,
                            "mosaic"),
    "mosaic_row": Entry("wts_jax.pallas.mosaic_row_backend", MosaicRowConfig, "mosaic"),
    "triton": Entry("wts_jax.pallas.triton_backend", TritonConfig, "triton"),
    "xla": Entry("wts_jax.pallas.xla_backend", None, "xla"),
}
KERNELS = tuple(name for name, entry in REGISTRY.items() if entry.family != "xla")
# impl names of a family: every backend of it that can run the walk, the best first.
FAMILIES = {"auto": KERNELS, "pallas": KERNELS,
            "mosaic": tuple(n for n in KERNELS if REGISTRY[n].family == "mosaic")}


def implementations() -> tuple[str, ...]:
  return (*FAMILIES, *REGISTRY)


@dataclasses.dataclass(frozen=True)
class Choice:
  impl: str                           # a backend's name
  plan: object = None                 # that backend's plan
  refusals: tuple[tuple[str, str], ...] = ()   # (backend, reason) of those that refused

  def launch(self, operands: WalkOperands):
    return module(self.impl).launch(self.plan, operands)


def module(name: str):
  return importlib.import_module(REGISTRY[name].module)


def check_config(config) -> None:
  if config is not None and not isinstance(config, KERNEL_CONFIGS):
    names = ", ".join(t.__name__ for t in KERNEL_CONFIGS)
    raise TypeError(f"config={config!r} must be None or one of {names}")


def backend_of_config(config) -> str | None:
  """The backend a config names (None for no config)."""
  if config is None:
    return None
  return next(name for name, entry in REGISTRY.items()
              if entry.config_type is not None and isinstance(config, entry.config_type))


def plan_one(name: str, head, shapes: WalkShapes, config, device) -> object:
  """Backend ``name``'s plan of this walk with ``config`` (None: its defaults), or its
  ``Refusal`` (the device's, where it cannot run the kernel, first)."""
  entry = REGISTRY[name]
  try:
    backend = module(name)
  except ImportError as err:  # pragma: no cover - depends on the installed jaxlib
    return Refusal(f"the {name} backend failed to import: {err}")
  if not getattr(config, "interpret", False):
    reason = backend.supported_on(device)
    if reason is not None:
      return Refusal(reason)
  if entry.config_type is not None and config is None:
    config = entry.config_type()
  return backend.plan(head, shapes, config, device)


def refusal_reason(name: str, head, batch: int, config=None, *, steps: int = 1,
                   greedy: bool = True, return_logits: bool = False,
                   return_logprobs: bool = False, device=None) -> str | None:
  """Why backend ``name`` cannot run such a walk with ``config`` (None when it can)."""
  named = backend_of_config(config)
  if named not in (None, name):
    return f"the config is not the {name} backend's"
  shapes = WalkShapes(batch=batch, steps=steps, greedy=greedy,
                      return_logits=return_logits, return_logprobs=return_logprobs)
  plan = plan_one(name, head, shapes, config, device or device_facts.current())
  return plan.reason if isinstance(plan, Refusal) else None


def _candidates(impl: str, config) -> list[str]:
  """The backends ``impl`` and ``config`` allow, in registry order."""
  named = backend_of_config(config)
  allowed = FAMILIES.get(impl, (impl,))
  if named is not None:
    if named not in allowed:
      raise ValueError(f"config={config!r} is not for impl={impl!r}")
    return [named]
  return list(allowed)


def choose(head, shapes: WalkShapes, impl: str = "auto", config=None, *,
           require_gpu: bool = True, device=None) -> Choice:
  """The backend that runs this walk and its plan: each candidate plans once.

  ``impl``: a backend's name (it runs, or one error gives its reason); a family
  (``FAMILIES``: the preferred backend of it that accepts, or one error listing every
  refusal; "auto" falls back to XLA instead). ``require_gpu=False`` plans as on the
  device even without one (tests, lowering for CUDA on the CPU)."""
  from wts_jax.pallas import preference
  if impl not in implementations():
    raise ValueError(f"impl={impl!r} must be one of {implementations()}")
  check_config(config)
  if impl == "xla":
    return Choice("xla", plan_one("xla", head, shapes, None, device))
  candidates = _candidates(impl, config)
  interpret = bool(getattr(config, "interpret", False))
  if require_gpu and not interpret and not device_facts.has_gpu():
    reason = (f"no GPU (default backend is {jax.default_backend()!r}; "
              "use impl='xla')")
    return _refused(impl, head, shapes, [(name, reason) for name in candidates],
                    common=reason)
  device = device or device_facts.current()
  order, tuned = preference.preference(head, shapes, device.kind)
  plans, refusals = {}, []
  for name in candidates:
    own = config if config is not None else tuned.get(name)
    plan = plan_one(name, head, shapes, own, device)
    if isinstance(plan, Refusal):
      refusals.append((name, plan.reason))
    else:
      plans[name] = plan
  if not plans:
    return _refused(impl, head, shapes, refusals)
  chosen = min(plans, key=lambda name: (order.index(name) if name in order else len(order),
                                        list(REGISTRY).index(name)))
  return Choice(chosen, plans[chosen], tuple(refusals))


def _refused(impl: str, head, shapes, refusals, common: str | None = None) -> Choice:
  if impl == "auto":
    return Choice("xla", plan_one("xla", head, shapes, None, None), tuple(refusals))
  if common is None:
    common = "; ".join(f"{name}: {reason}" for name, reason in refusals)
  raise ValueError(f"impl={impl!r} cannot run this walk: {common}")
