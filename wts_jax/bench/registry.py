"""The registry the benchmark's paths live in: ``Path``, ``Prepared``, ``BenchMode``,
``SkipPath``, ``register_path`` and ``jax_prepared`` (``paths`` says what a path is and
registers the built-in ones).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from wts_jax import validation
from wts_jax.bench.timing import tokens_of


class SkipPath(Exception):
  """Raised by ``prepare`` when a path cannot run one point; the message says why."""


@dataclasses.dataclass(frozen=True)
class BenchMode:
  """Greedy, or sampling at ``temperature`` with the counter-based Gumbel noise of ``key``."""

  name: str                      # "greedy" or "sample"
  temperature: float = 1.0
  key: jax.Array | None = None

  def __post_init__(self):
    if self.name not in ("greedy", "sample"):
      raise ValueError(f"mode name={self.name!r} must be 'greedy' or 'sample'")
    if self.name == "sample" and (self.key is None or not self.temperature > 0):
      raise ValueError(f"sample mode needs key and temperature > 0; got "
                       f"temperature={self.temperature}, key={self.key}")

  @property
  def greedy(self) -> bool:
    return self.name == "greedy"

  @property
  def walk_temperature(self) -> float:
    return 0.0 if self.greedy else float(self.temperature)

  def sampling(self, batch: int, key: jax.Array | None = None) -> validation.Sampling:
    """The ``Sampling`` of this mode; traceable (pass the traced ``key`` under jit)."""
    if self.greedy:
      return validation.Sampling(greedy=True)
    return validation.make_sampling(float(self.temperature),
                                    self.key if key is None else key, batch)


@dataclasses.dataclass
class Prepared:
  """One path ready to run one point."""

  run: Callable[[], Any]
  tokens: Callable[[Any], np.ndarray]
  framework: str                                   # "jax" or "torch"
  walk_fn: Callable | None = None                  # jax: traceable (operands, first) walk
  operands: Any = None
  first_tokens: Any = None
  traced_tokens: Callable = tokens_of
  chain_carry: str = "tokens"                      # timing.build_chain's carry_form
  margin: float | None = None                      # tokens compared with a tie margin
  notes: dict = dataclasses.field(default_factory=dict)
  keepalive: Any = None                            # buffers the run() closure needs
  # Puts one of the harness's own arrays (the first tokens, the flush buffer) where the
  # walk runs: a path on several devices replicates them on its mesh; None: as they are.
  place: Callable[[Any], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Path:
  name: str
  available_fn: Callable[[], str | None]
  prepare_fn: Callable[..., Prepared]
  description: str = ""
  framework: str = "jax"     # "jax": prepared before compiling; else after (see above)

  def available(self) -> str | None:
    try:
      return self.available_fn()
    except Exception as err:  # noqa: BLE001 - an availability probe must not crash a run
      return f"availability check failed: {type(err).__name__}: {err}"

  def prepare(self, head, base_logits, first_tokens, hidden, mode: BenchMode, *,
              return_logits: bool = False) -> Prepared:
    return self.prepare_fn(head, base_logits, first_tokens, hidden, mode,
                           return_logits=return_logits)


PATHS: dict[str, Path] = {}


def register_path(name: str, available_fn: Callable[[], str | None],
                  prepare_fn: Callable[..., Prepared], *, description: str = "",
                  replace: bool = False, framework: str = "jax") -> Path:
  if name in PATHS and not replace:
    raise ValueError(f"path {name!r} is already registered (pass replace=True)")
  PATHS[name] = Path(name, available_fn, prepare_fn, description, framework)
  return PATHS[name]


def unregister_path(name: str) -> None:
  PATHS.pop(name, None)


def get_path(name: str) -> Path:
  if name not in PATHS:
    raise ValueError(f"unknown path {name!r}; registered: {sorted(PATHS)}")
  return PATHS[name]


def jax_prepared(walk_fn: Callable, operands, first_tokens: jax.Array,
                 **kwargs) -> Prepared:
  """A ``Prepared`` for a traceable JAX walk ``walk_fn(operands, first_tokens)``."""
  one_walk = jax.jit(walk_fn)
  traced_tokens = kwargs.pop("traced_tokens", tokens_of)
  return Prepared(run=lambda: one_walk(operands, first_tokens),
                  tokens=lambda out: np.asarray(traced_tokens(out)), framework="jax",
                  walk_fn=walk_fn, operands=operands, first_tokens=first_tokens,
                  traced_tokens=traced_tokens, **kwargs)


def gpu_reason() -> str | None:
  backend = jax.default_backend()
  return None if backend == "gpu" else f"needs a GPU (JAX backend is {backend!r})"
