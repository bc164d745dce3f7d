"""The PyTorch paths: DeepSpec's loop, eager (``torch-eager``) and captured as one CUDA
graph (``torch-graph``), and their timing by CUDA events (``time_torch``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax import sampling, validation
import time

from wts_jax.bench.flush import is_cold
from wts_jax.bench.gate import gumbel_noise_bkv
from wts_jax.bench.registry import BenchMode, Prepared, SkipPath, gpu_reason
from wts_jax.bench.timing import Timing, summarize


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
  return gpu_reason()


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



# --- timing: CUDA events around N walks -------------------------------------------------

def time_torch(run: Callable[[], Any], *, l2: str, n_walks: int, repeats: int,
               flush, warmup: int = 3) -> Timing:
  """Time ``run()`` (one walk, launched on the current stream) by CUDA events.

  On a CPU device torch runs synchronously and the host clock is used instead.
  """
  import torch
  cold = is_cold(l2)
  cuda = flush.is_cuda

  def loop(with_walk: bool):
    for _ in range(n_walks):
      if cold:
        flush.add_(1)
      if with_walk:
        run()

  def timed(with_walk: bool) -> float:
    if not cuda:
      start = time.perf_counter()
      loop(with_walk)
      return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loop(with_walk)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3

  for _ in range(warmup):
    timed(True)
    timed(False)
  if cuda:
    torch.cuda.synchronize()
  total, base = [], []
  for _ in range(repeats):
    total.append(timed(True))
    base.append(timed(False))
  return dataclasses.replace(summarize(total, base, n_walks), method="cuda events")


def time_torch_empty(batch: int, *, l2: str, n_walks: int, repeats: int,
                     flush) -> Timing:
  import torch
  del batch   # one element whatever the batch: this times the method, not a walk
  x = torch.zeros(1, dtype=torch.int32, device=flush.device)
  return time_torch(lambda: x.add_(1), l2=l2, n_walks=n_walks, repeats=repeats,
                    flush=flush)
