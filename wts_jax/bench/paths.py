"""The paths the benchmark compares: a registry of named ways to run one walk.

A path has ``available() -> str | None`` (None: it can run here; else why it is skipped)
and ``prepare(head, base_logits, first_tokens, hidden, mode, *, return_logits=False)
-> Prepared``. ``mode`` is a ``BenchMode`` (greedy, or Gumbel-max sampling at
``temperature`` with ``key``); ``mode.sampling(batch)`` gives the
``validation.Sampling`` that the walks take. ``prepare`` may raise ``SkipPath`` when
it cannot run one point (a shape its kernel does not support).

A ``Prepared`` walk has ``run()`` (launch one walk asynchronously and return its device
outputs) and ``tokens(outputs) -> np.ndarray [B, K]``. JAX paths also give
``walk_fn(operands, first_tokens)``, a traceable walk over explicit operands, which the
timing chains N times in one executable (``timing.build_chain``); the harness compiles
that chain ahead and checks the tokens of its first run, so it never calls a JAX path's
``run()``. A path's ``framework`` ("jax" or "torch") says when the harness prepares it:
JAX paths before the point's compilation (``prepare`` must not launch device work), the
others after it, just before they are checked and timed.

Adding a path takes a few lines::

    def prepare_mine(head, base_logits, first_tokens, hidden, mode, *, return_logits=False):
      def walk_fn(operands, first):
        head, base, hidden, key = operands
        return my_walk(head, base, first, hidden, mode.sampling(base.shape[0], key))
      return jax_prepared(walk_fn, (head, base_logits, hidden, mode.key), first_tokens)

    register_path("mine", lambda: None, prepare_mine)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax import sampling, validation
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
  margin: float | None = None                      # tokens compared with a tie margin
  notes: dict = dataclasses.field(default_factory=dict)
  keepalive: Any = None                            # buffers the run() closure needs


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


# --- xla: the jitted step-wise reference walk ------------------------------------------

def prepare_xla(head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                return_logits: bool = False) -> Prepared:
  from wts_jax.reference import reference_walk
  head = validation.as_draft_head(head)

  def walk_fn(operands, first):
    head, base, hidden, key = operands
    s = mode.sampling(base.shape[0], key)
    return reference_walk(head, base, first, hidden, s.score_scale, s.noise_on, s.seed,
                          return_logits=return_logits)

  return jax_prepared(walk_fn, (head, base_logits, hidden, mode.key), first_tokens)


# --- wts: the persistent kernel, through the public API --------------------------------

def _gpu_reason() -> str | None:
  backend = jax.default_backend()
  return None if backend == "gpu" else f"needs a GPU (JAX backend is {backend!r})"


def available_wts() -> str | None:
  try:
    from wts_jax.pallas import backend  # noqa: F401
  except Exception as err:  # noqa: BLE001
    return f"wts_jax.pallas.backend failed to import: {type(err).__name__}: {err}"
  return _gpu_reason()


def prepare_wts(head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                return_logits: bool = False, config=None) -> Prepared:
  from wts_jax import api
  head = validation.as_draft_head(head)
  try:
    api.chosen_implementation(head, base_logits, "pallas", config,
                              return_logits=return_logits)
  except ValueError as err:
    raise SkipPath(str(err)) from err

  def walk_fn(operands, first):
    head, base, hidden, key = operands
    return api.walk(head, base, first, hidden, temperature=mode.walk_temperature,
                    key=key, return_logits=return_logits, impl="pallas", config=config)

  return jax_prepared(walk_fn, (head, base_logits, hidden, mode.key), first_tokens)


# --- pallas-stepwise: one fused Pallas kernel per step ---------------------------------

def _stepwise_walk():
  from wts_jax.pallas.stepwise import stepwise_walk
  return stepwise_walk


def available_pallas_stepwise() -> str | None:
  try:
    _stepwise_walk()
  except Exception as err:  # noqa: BLE001
    return (f"wts_jax.pallas.stepwise.stepwise_walk failed to import: "
            f"{type(err).__name__}: {err}")
  return _gpu_reason()


def prepare_pallas_stepwise(head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                            return_logits: bool = False) -> Prepared:
  stepwise_walk = _stepwise_walk()
  head = validation.as_draft_head(head)

  def walk_fn(operands, first):
    head, base, hidden, key = operands
    return stepwise_walk(head, base, first, hidden, mode.sampling(base.shape[0], key),
                         return_logits=return_logits)

  return jax_prepared(walk_fn, (head, base_logits, hidden, mode.key), first_tokens)


# --- torch: DeepSpec's loop, eager and as one CUDA graph -------------------------------

TORCH_TIE_MARGIN = 0.25   # a torch token may differ only where the reference's top-2 gap
#                           is below this (DeepSpec adds a bf16-rounded bias)
_TORCH_DTYPES = {"bfloat16": "bfloat16", "float32": "float32", "float16": "float16"}
_torch_head_cache: dict = {}


def _import_torch():
  import torch
  return torch


def available_torch_eager() -> str | None:
  try:
    _import_torch()
  except Exception as err:  # noqa: BLE001
    return f"torch is not importable: {type(err).__name__}: {err}"
  return None


def available_torch_graph() -> str | None:
  reason = available_torch_eager()
  if reason is not None:
    return reason
  torch = _import_torch()
  if not torch.cuda.is_available():
    return (f"CUDA-graph replay needs torch with CUDA and a GPU; torch "
            f"{torch.__version__} sees no CUDA device")
  return _gpu_reason()


def torch_device():
  """cuda when both JAX and torch run on the GPU, else cpu."""
  torch = _import_torch()
  if jax.default_backend() == "gpu" and torch.cuda.is_available():
    return torch.device("cuda")
  return torch.device("cpu")


def to_torch(array, device, dtype=None):
  """A JAX array as a torch tensor on ``device``: dlpack on CUDA (no host copy)."""
  torch = _import_torch()
  jax.block_until_ready(array)
  tensor = None
  if device.type == "cuda":
    try:
      tensor = torch.from_dlpack(array)
    except Exception:  # noqa: BLE001 - fall back to a host round trip
      tensor = None
  if tensor is None:
    host = np.asarray(array)
    if host.dtype.name == "bfloat16" or host.dtype.kind not in "biuf":
      host = host.astype(np.float32)   # bf16 (ml_dtypes): exact in fp32, cast back below
    tensor = torch.from_numpy(np.array(host, copy=True)).to(device)
    if dtype is None and np.asarray(array).dtype.name == "bfloat16":
      dtype = torch.bfloat16
  return tensor if dtype is None else tensor.to(dtype)


def _torch_head(head, dtype, device):
  """The DeepSpec module with the head's weights (cached for the last head used)."""
  from wts_jax.peers import deepspec_torch
  key = (id(head), str(dtype), str(device))
  cached = _torch_head_cache.get("entry")
  if cached is not None and cached[0] == key and cached[1] is head:
    return cached[2]
  torch_head = deepspec_torch.from_wts_head(head, dtype=dtype, device=device).eval()
  _torch_head_cache["entry"] = (key, head, torch_head)
  return torch_head


def _torch_walk(torch_head, base_logits, first_tokens, hidden, noise, scale: float):
  """DeepSpec's per-step loop (``deepspec_torch.sample_block_tokens``), tokens only.

  The same steps (``markov_head.step``: embed → head → W2 in the weights' dtype → add →
  select) without stacking the [B, K, V] fp32 logits, which a timed walk does not return.
  """
  torch = _import_torch()
  markov = torch_head.markov_head
  batch, steps, _ = base_logits.shape
  state = torch.zeros(batch, markov.rank, dtype=markov.markov_w2.weight.dtype,
                      device=base_logits.device)
  prev = first_tokens
  tokens, confidences = [], []
  for k in range(steps):
    hidden_k = None if hidden is None else hidden[:, k]
    bias, state, e = markov.step(prev, hidden_k, state)
    logits = base_logits[:, k] + bias
    if noise is None:
      prev = torch.argmax(logits, dim=-1)
    else:
      prev = torch.argmax(logits.float() * scale + noise[:, k], dim=-1)
    tokens.append(prev)
    if torch_head.confidence_head is not None:
      confidences.append(torch_head.confidence_head(hidden_k, e))
  out_tokens = torch.stack(tokens, 1)
  if confidences:
    return out_tokens, torch.stack(confidences, 1)
  return out_tokens, None


@functools.partial(jax.jit, static_argnames=("batch", "steps", "vocab"))
def gumbel_noise_bkv(seed, *, batch: int, steps: int, vocab: int) -> jax.Array:
  """The walks' Gumbel noise as one [B, K, V] fp32 array (``sampling.gumbel_noise``)."""
  rows, vocab_ids = jnp.arange(batch), jnp.arange(vocab)
  return jnp.stack([sampling.gumbel_noise(seed, rows, jnp.asarray(k), vocab_ids)
                    for k in range(steps)], axis=1)


def _torch_inputs(head, base_logits, first_tokens, hidden, mode: BenchMode):
  torch = _import_torch()
  head = validation.as_draft_head(head)
  weight_dtype = jnp.dtype(head.markov_head.markov_w2.weight.dtype)
  if weight_dtype.name not in _TORCH_DTYPES or hasattr(head.markov_head.markov_w2, "scale"):
    raise SkipPath(f"DeepSpec's torch loop has no quantized W2 ({weight_dtype.name})")
  dtype = getattr(torch, _TORCH_DTYPES[weight_dtype.name])
  device = torch_device()
  torch_head = _torch_head(head, dtype, device)
  batch, steps, vocab = base_logits.shape
  base_t = to_torch(base_logits, device, dtype)
  first_t = to_torch(first_tokens, device).long()
  needs_hidden = head.config.needs_hidden and hidden is not None
  hidden_t = to_torch(hidden, device, dtype) if needs_hidden else None
  noise_t, scale = None, 1.0
  notes = {"torch_dtype": str(dtype).replace("torch.", ""), "torch_device": str(device)}
  if not mode.greedy:
    seed = sampling.seed_words(mode.key)
    noise_t = to_torch(gumbel_noise_bkv(seed, batch=batch, steps=steps, vocab=vocab),
                       device)
    # 1/T rounded to fp32, as the JAX walks compute it.
    scale = float(np.float32(1.0) / np.float32(mode.temperature))
    notes["sampling"] = ("Gumbel-max with the wts_jax noise, precomputed as a [B, K, V] "
                         "fp32 tensor read each step (DeepSpec itself samples by "
                         "softmax + torch.multinomial)")
  return torch_head, (base_t, first_t, hidden_t, noise_t, scale), notes


def _torch_tokens(out) -> np.ndarray:
  return out[0].cpu().numpy()


def prepare_torch_eager(head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                        return_logits: bool = False) -> Prepared:
  torch = _import_torch()
  if return_logits:
    raise SkipPath("the torch paths time tokens only (return_logits is not supported)")
  torch_head, inputs, notes = _torch_inputs(head, base_logits, first_tokens, hidden, mode)

  def run():
    with torch.inference_mode():
      return _torch_walk(torch_head, *inputs)

  return Prepared(run=run, tokens=_torch_tokens, framework="torch",
                  margin=TORCH_TIE_MARGIN, notes=notes, keepalive=inputs)


def prepare_torch_graph(head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                        return_logits: bool = False, warmup: int = 3) -> Prepared:
  torch = _import_torch()
  if return_logits:
    raise SkipPath("the torch paths time tokens only (return_logits is not supported)")
  torch_head, inputs, notes = _torch_inputs(head, base_logits, first_tokens, hidden, mode)
  if inputs[0].device.type != "cuda":
    raise SkipPath("CUDA-graph replay needs the inputs on a CUDA device")
  with torch.inference_mode():
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
      for _ in range(warmup):
        _torch_walk(torch_head, *inputs)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
      static_out = _torch_walk(torch_head, *inputs)
  torch.cuda.synchronize()

  def run():
    graph.replay()
    return static_out

  notes["graph"] = "the whole K-step loop captured once, replayed per walk"
  return Prepared(run=run, tokens=_torch_tokens, framework="torch",
                  margin=TORCH_TIE_MARGIN, notes=notes,
                  keepalive=(inputs, graph, static_out))


# --- the correctness gate ----------------------------------------------------------------

@functools.partial(jax.jit, static_argnames=("greedy", "temperature"))
def _reference_with_gaps(head, base_logits, first_tokens, hidden, key, *, temperature,
                         greedy: bool):
  from wts_jax.reference import reference_walk
  batch, steps, vocab = base_logits.shape
  if greedy:
    s = validation.Sampling(greedy=True)
  else:
    s = validation.make_sampling(temperature, key, batch)
  out = reference_walk(head, base_logits, first_tokens, hidden, s.score_scale, s.noise_on,
                       s.seed, return_logits=True)
  score = out.logits
  if not greedy:
    noise = gumbel_noise_bkv(s.seed, batch=batch, steps=steps, vocab=vocab)
    score = score * s.score_scale[:, None, None] + jnp.where(
        s.noise_on[:, None, None], noise, 0.0)
  top2 = jax.lax.top_k(score, 2)[0] if vocab > 1 else jnp.concatenate(
      [score, jnp.full_like(score, -jnp.inf)], axis=-1)
  return out.tokens, top2[..., 0] - top2[..., 1]


def _reference_args(head, base_logits, first_tokens, hidden, mode: BenchMode):
  head = validation.as_draft_head(head)
  if not head.config.needs_hidden:
    hidden = None
  return ((head, base_logits, first_tokens, hidden, mode.key),
          {"temperature": None if mode.greedy else float(mode.temperature),
           "greedy": mode.greedy})


def reference_tokens_and_gaps(head, base_logits, first_tokens, hidden, mode: BenchMode):
  """The XLA reference's tokens [B, K] and the top-2 gap of its selection scores [B, K]."""
  args, static = _reference_args(head, base_logits, first_tokens, hidden, mode)
  tokens, gaps = _reference_with_gaps(*args, **static)
  return np.asarray(tokens), np.asarray(gaps)


def lower_reference(head, base_logits, first_tokens, hidden, mode: BenchMode):
  """``reference_tokens_and_gaps`` split for compiling ahead: (lowered, finish), where
  ``finish(lowered.compile())`` is a function of no arguments giving (tokens, gaps)."""
  args, static = _reference_args(head, base_logits, first_tokens, hidden, mode)
  lowered = _reference_with_gaps.lower(*args, **static)

  def finish(compiled):
    def run():
      tokens, gaps = compiled(*args)
      return np.asarray(tokens), np.asarray(gaps)
    return run

  return lowered, finish


def compare_tokens(reference: np.ndarray, tokens: np.ndarray, gaps: np.ndarray | None = None,
                   margin: float | None = None) -> tuple[bool, str, float]:
  """(passed, check text, fraction of tokens equal) of a path's tokens vs the reference.

  Exact unless ``margin`` is given; with a margin, each row may first differ only at a
  step where the reference's top-2 score gap is below ``margin`` (a near-tie that a
  lower-precision bias can flip); after that the walks diverge and are not compared.
  """
  reference, tokens = np.asarray(reference), np.asarray(tokens)
  if reference.shape != tokens.shape:
    return False, (f"mismatch: tokens shape {tokens.shape} != reference shape "
                   f"{reference.shape}"), 0.0
  equal = reference == tokens
  agreement = float(equal.mean()) if equal.size else 1.0
  if equal.all():
    return True, "ok", agreement
  differing = int((~equal).sum())
  rows = np.flatnonzero(~equal.all(axis=1))
  if margin is None:
    row = rows[0]
    step = int(np.flatnonzero(~equal[row])[0])
    return False, (f"mismatch: row {row} step {step}: token {tokens[row, step]} != "
                   f"reference {reference[row, step]} ({differing} of {equal.size} "
                   f"tokens differ)"), agreement
  for row in rows:
    step = int(np.flatnonzero(~equal[row])[0])
    gap = float(gaps[row, step])
    if not gap < margin:
      return False, (f"mismatch: row {row} step {step}: token {tokens[row, step]} != "
                     f"reference {reference[row, step]} where the reference's top-2 gap "
                     f"{gap:.3g} >= margin {margin}"), agreement
  return True, (f"ok (tie margin {margin}: {len(rows)} of {reference.shape[0]} rows "
                f"diverged at a near-tie; {agreement:.1%} of tokens agree)"), agreement


register_path("xla", lambda: None, prepare_xla,
              description="jitted step-wise reference walk (lax.scan over K)")
register_path("pallas-stepwise", available_pallas_stepwise, prepare_pallas_stepwise,
              description="one fused Pallas kernel per step")
register_path("torch-eager", available_torch_eager, prepare_torch_eager,
              description="DeepSpec's PyTorch loop, eager", framework="torch")
register_path("torch-graph", available_torch_graph, prepare_torch_graph,
              description="DeepSpec's PyTorch loop captured as one CUDA graph",
              framework="torch")
register_path("wts", available_wts, prepare_wts,
              description="the persistent Weights-That-Stay kernel (walk(impl='pallas'))")



def wts_variant(**options):
  """A tuning variant of the persistent kernel (``WalkConfig`` options), for tools that
  time variants beside the default ``wts`` (``tools/bench_variants.py``)."""
  def prepare(*args, **kwargs):
    from wts_jax.walk_config import WalkConfig
    return prepare_wts(*args, config=WalkConfig(**options), **kwargs)
  return prepare


DEFAULT_PATHS = ("xla", "pallas-stepwise", "torch-eager", "torch-graph", "wts")
