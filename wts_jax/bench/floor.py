"""The floor model of one walk, and the ceilings it needs, measured in the same run.

For one walk of K steps (docs/design.md §4):

  floor = bytes(W2 once + base logits + the rest read once + outputs) / BW_hbm
        + (K - 1) * bytes(non-resident W2) / BW_L2
        + K * t_sync

"The rest read once" is the hidden states and the head's small weights (gate / joint /
confidence projections) when the head reads them, and the K·B gathered W1 rows. The
non-resident bytes are ``(1 - resident_fraction) * bytes(W2)``; the default
``resident_fraction`` is the capacity arithmetic of docs/design.md §4: ``num_sms × (usable
shared memory + registers per SM) / bytes(W2)``, capped at 1. ``stepwise_floor_us`` (K × bytes(W2) /
BW_hbm plus the base logits) is what any walk that re-reads W2 from HBM each step must pay.

Beside it, ``plan_floor_us`` is the same model with the resident fraction of the plan the
kernel will actually run (``kernel_plan``: the backend ``impl="pallas"`` chooses and its
plan, read from the same planners): what that plan's bytes cost at the ceilings.

A walk split along V over ``devices`` GPUs (``wts_jax.sharded``; ``walk_floor(...,
devices=n)``) is the same model on one device's share — W2, its row scales and the base
logits divided by ``n``, the resident fraction that of W2 / n, the rest (hidden states,
small weights, outputs) whole on every device — plus the cross-device exchange of every
step:

  floor_n = floor(one device's bytes) + K * t_exchange

``t_exchange`` (``Ceilings.exchange_us``) is measured on a multi-GPU device by the
in-kernel exchange probe (``measure_exchange_us``: the probe's time per step, K large
minus K small); where it is not measured (one device) it is 0, which keeps the floor a
lower bound.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.bench.microbench import median_time

DESIGN_SYNC_US = 2.1             # docs/design.md §4: one grid-wide sync on the H200
USABLE_SMEM_PER_SM = 200 * 1024  # of 227 KB per block, leaving room for staging buffers
# Registers hold W2 too, as MMA fragments loaded once (the public int8 kernel keeps two
# thirds of each SM's shard there, about 190 KB of the 256 KB register file).
USABLE_REGISTERS_PER_SM = 190 * 1024


@dataclasses.dataclass(frozen=True)
class Ceilings:
  hbm_gbps: float            # read bandwidth (large reduction); what the floor divides by
  l2_gbps: float
  sync_us: float
  sync_source: str           # "measured" or "design-doc"
  details: dict = dataclasses.field(default_factory=dict)
  # One step's cross-device exchange (a sharded walk), and where the figure comes from.
  exchange_us: float = 0.0
  exchange_source: str = "not measured (one device): 0, a lower bound"

  def as_record(self) -> dict:
    return {"hbm_gbps": self.hbm_gbps, "l2_gbps": self.l2_gbps, "sync_us": self.sync_us,
            "sync_source": self.sync_source, "exchange_us": self.exchange_us,
            "exchange_source": self.exchange_source, **self.details}


# --- ceilings --------------------------------------------------------------------------

def _chained_sums(passes: int):
  """``passes`` full reductions of x, each forced to re-read it (no CSE, no fusion)."""
  barrier = jax.lax.optimization_barrier

  def run(x):
    total = jnp.zeros((), jnp.float32)
    for _ in range(passes):
      x, total = barrier((x, total))
      total = total + jnp.sum(x, dtype=jnp.float32)
    return total

  return jax.jit(run)


def _copy_passes(passes: int):
  barrier = jax.lax.optimization_barrier

  def run(x):
    for _ in range(passes):
      x = barrier(x + 1.0)
    return x

  return jax.jit(run)


def _broadcast_sum(rows: int):
  """One fused reduction reading x ``rows`` times ([rows, n] row sums of x + w_i)."""
  def run(x, w):
    return jnp.sum(x[None, :] + w[:, None], axis=1, dtype=jnp.float32)
  return jax.jit(run)


def measure_hbm_gbps(nbytes: int, *, passes: int = 4, repeats: int = 5) -> dict:
  """Read bandwidth (chained reductions) and copy bandwidth (read + write), in GB/s."""
  n = max(1, nbytes // 4)
  x = jax.random.uniform(jax.random.key(0), (n,), jnp.float32)
  read_s = median_time(_chained_sums(passes), x, repeats=repeats) / passes
  copy_s = median_time(_copy_passes(passes), x, repeats=repeats) / passes
  del x
  return {"hbm_read_gbps": 4 * n / read_s / 1e9,
          "hbm_copy_gbps": 2 * 4 * n / copy_s / 1e9,
          "hbm_buffer_bytes": 4 * n}


def measure_l2_gbps(nbytes: int, *, passes: int | None = None, rows: int = 64,
                    repeats: int = 5) -> dict:
  """L2 read bandwidth over a buffer that fits in L2, read again and again (warm).

  Two estimates, both lower bounds of the true figure: ``passes`` chained reductions
  (each a separate launch, so launch gaps count against it) and one fused reduction
  that reads the buffer ``rows`` times in one launch. The larger is used.
  """
  if passes is None:
    passes = 200 if jax.default_backend() == "gpu" else 20
  n = max(1, nbytes // 4)
  x = jax.random.uniform(jax.random.key(1), (n,), jnp.float32)
  w = jnp.arange(rows, dtype=jnp.float32)
  chained_s = median_time(_chained_sums(passes), x, repeats=repeats) / passes
  fused_s = median_time(_broadcast_sum(rows), x, w, repeats=repeats) / rows
  return {"l2_chained_gbps": 4 * n / chained_s / 1e9,
          "l2_fused_gbps": 4 * n / fused_s / 1e9,
          "l2_buffer_bytes": 4 * n}


def sync_latency(sync_latency_us: float | None = None) -> tuple[float, str, str | None]:
  """(µs, source, why the kernel module's measurement was not used)."""
  if sync_latency_us is not None:
    return float(sync_latency_us), "given", None
  try:
    from wts_jax.bench.sync_latency import measure_sync_latency_us
    value = float(measure_sync_latency_us())
    if not np.isfinite(value) or value <= 0:
      raise ValueError(f"measure_sync_latency_us() returned {value}")
    return value, "measured", None
  except Exception as err:  # noqa: BLE001 - any failure falls back to the design doc
    return DESIGN_SYNC_US, "design-doc", f"{type(err).__name__}: {err}"


def measure_microbenchmarks(*, hbm_bytes: int, l2_bytes: int, sync: bool = True,
                            l2_passes: int = 50, barrier_rounds: int = 256) -> dict:
  """The ceilings from kernels that do nothing else (``microbench``: a streaming read
  from HBM and from the L2, the cheapest grid barrier), on a GPU only: {} elsewhere, and
  ``{"microbenchmark_error": ...}`` where one fails (the harness keeps its own)."""
  if jax.default_backend() != "gpu":
    return {}
  from wts_jax.bench import microbench
  try:
    sms = device_num_sms()
    found = {"stream_hbm_gbps": microbench.stream_gbps(hbm_bytes, programs=4 * sms),
             "stream_l2_gbps": microbench.stream_gbps(l2_bytes, programs=4 * sms,
                                                      passes=l2_passes)}
    if sync:
      found["barrier_us"] = microbench.barrier_us(programs=sms, rounds=barrier_rounds)
  except Exception as err:  # noqa: BLE001 - the harness's own ceilings stand
    return {"microbenchmark_error": f"{type(err).__name__}: {err}"[:300]}
  if not all(np.isfinite(v) and v > 0 for v in found.values()):
    return {"microbenchmark_error": f"not positive and finite: {found}"}
  return found


def measure_ceilings(*, hbm_bytes: int, l2_bytes: int,
                     sync_latency_us: float | None = None) -> Ceilings:
  """Measure the ceilings on the default JAX device (a few seconds on the H200).

  A floor must stay under every real kernel, so each ceiling is the best of its
  estimates: bandwidth the larger of the XLA reductions' and the streaming kernel's, the
  step exchange the smaller of our kernel's measured exchange and the bare grid barrier
  (``measure_microbenchmarks``; on a GPU). A given ``sync_latency_us`` is used as is."""
  details = {}
  hbm = measure_hbm_gbps(hbm_bytes)
  l2 = measure_l2_gbps(l2_bytes)
  details.update(hbm)
  details.update(l2)
  sync_us, source, why = sync_latency(sync_latency_us)
  if why is not None:
    details["sync_fallback_reason"] = why[:300]
  micro = measure_microbenchmarks(hbm_bytes=hbm_bytes, l2_bytes=l2_bytes,
                                  sync=sync_latency_us is None)
  details.update(micro)
  hbm_gbps = max(hbm["hbm_read_gbps"], micro.get("stream_hbm_gbps", 0.0))
  l2_gbps = max(l2["l2_chained_gbps"], l2["l2_fused_gbps"], micro.get("stream_l2_gbps", 0.0))
  if micro.get("barrier_us", float("inf")) < sync_us:
    details["kernel_exchange_us"] = sync_us
    sync_us, source = micro["barrier_us"], "barrier microbenchmark"
  exchange = {}
  if jax.default_backend() == "gpu" and jax.local_device_count() >= 2:
    try:
      exchange = {"exchange_us": measure_exchange_us(),
                  "exchange_source": f"exchange probe on {jax.local_device_count()} GPUs"}
    except Exception as err:  # noqa: BLE001 - the floor stays a lower bound without it
      details["exchange_error"] = f"{type(err).__name__}: {err}"[:300]
  return Ceilings(hbm_gbps=hbm_gbps, l2_gbps=l2_gbps, sync_us=sync_us, sync_source=source,
                  details=details, **exchange)


def measure_exchange_us(*, steps: tuple[int, int] = (8, 64), repeats: int = 5) -> float:
  """One step of the in-kernel cross-device exchange on every local GPU
  (``sharded.device_exchange_mgpu``'s probe, one block a GPU's SM), µs: the probe's time
  at ``steps[1]`` steps minus at ``steps[0]``, over the difference (what a launch costs
  cancels)."""
  import functools
  from jax.sharding import NamedSharding, PartitionSpec as P
  from wts_jax.sharded.device_exchange_mgpu import ROWS, exchange_probe
  devices = jax.local_devices()
  mesh = jax.make_mesh((len(devices),), ("tensor",), devices=devices)
  blocks = device_num_sms()
  probe = jax.jit(jax.shard_map(functools.partial(exchange_probe, axis_name="tensor"),
                                mesh=mesh, in_specs=(P("tensor"), P("tensor"), P()),
                                out_specs=(P(), P("tensor")), check_vma=False))
  times = []
  for count in steps:
    shape = (len(devices) * count, blocks, ROWS)
    scores = jax.device_put(jax.random.normal(jax.random.key(0), shape, jnp.float32),
                            NamedSharding(mesh, P("tensor")))
    indices = jax.device_put(jnp.zeros(shape, jnp.int32), NamedSharding(mesh, P("tensor")))
    first = jax.device_put(jnp.zeros((ROWS,), jnp.int32), NamedSharding(mesh, P()))
    _, timeouts = probe(scores, indices, first)
    if int(jnp.max(timeouts)):
      raise RuntimeError("the exchange probe's poll timed out")
    times.append(median_time(probe, scores, indices, first, repeats=repeats))
  return (times[1] - times[0]) / (steps[1] - steps[0]) * 1e6


# --- the floor -------------------------------------------------------------------------

def device_num_sms() -> int:
  from wts_jax import device
  return device.current().num_sms


def kernel_plan(head, base_logits, *, greedy: bool = True,
                return_logits: bool = False) -> dict:
  """The kernel ``walk(impl="pallas")`` would run for this walk and its plan, planned
  as on the device (no GPU needed): {"impl", "plan", "resident_fraction"}, or
  {"impl": None, "refused": reasons} when no kernel can run it."""
  from wts_jax.pallas import backend
  shapes = backend.WalkShapes.of(base_logits, greedy, return_logits=return_logits)
  try:
    choice = backend.choose(head, shapes, "pallas", None, require_gpu=False)
  except ValueError as err:
    return {"impl": None, "refused": str(err)}
  plan = getattr(choice.plan, "plan", choice.plan)   # a kernel spec holds its plan
  return {"impl": choice.impl, "plan": plan.describe(),
          "resident_fraction": float(plan.resident_fraction)}


def _nbytes(array) -> int:
  if array is None:
    return 0
  return int(np.prod(array.shape)) * jnp.dtype(array.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class WalkBytes:
  w2: int               # W2 (and its per-row scales when quantized)
  base_logits: int
  read_once: int        # hidden states, small head weights, the gathered W1 rows
  outputs: int          # tokens (+ confidence, + logits when asked)


def walk_bytes(head, base_logits, hidden, *, return_logits: bool = False) -> WalkBytes:
  """The bytes one walk must move, read off the head and the inputs."""
  config = head.config
  batch, steps, vocab = base_logits.shape
  markov = head.markov_head
  w2 = markov.markov_w2
  w2_bytes = _nbytes(w2.weight[...]) + _nbytes(getattr(w2, "scale", None))
  small = 0
  for name in ("gate_proj", "joint_proj"):
    layer = getattr(markov, name, None)
    if layer is not None:
      small += _nbytes(layer.weight[...]) + _nbytes(layer.bias[...])
  if head.confidence_head is not None:
    small += _nbytes(head.confidence_head.proj.weight[...])
  w1 = markov.markov_w1.weight
  gathered_w1 = batch * steps * config.rank * jnp.dtype(w1.dtype).itemsize
  hidden_bytes = _nbytes(hidden) if config.needs_hidden else 0
  outputs = batch * steps * 4 * (2 if head.confidence_head is not None else 1)
  if return_logits:
    outputs += batch * steps * vocab * 4
  return WalkBytes(w2=w2_bytes, base_logits=_nbytes(base_logits),
                   read_once=small + gathered_w1 + hidden_bytes, outputs=outputs)


def default_resident_fraction(w2_bytes: int, num_sms: int | None = None,
                              smem_per_sm: int = USABLE_SMEM_PER_SM,
                              registers_per_sm: int = USABLE_REGISTERS_PER_SM) -> float:
  """The share of W2 that shared memory and registers can hold chip-wide (capped at 1)."""
  num_sms = device_num_sms() if num_sms is None else num_sms
  return min(1.0, num_sms * (smem_per_sm + registers_per_sm) / max(1, w2_bytes))


# The public int8 persistent walk (vanilla, V = 151 936, r = 256, K = 7, greedy, L2
# flushed), measured on the H200 in the same run as our paths (NOTES.md): B -> µs.
PUBLIC_INT8_US = {1: 31.4, 4: 41.2, 16: 66.8, 64: 111.0}


def public_int8_floor(ceilings: "Ceilings", batch: int, *, steps: int = 7,
                      vocab: int = 151_936, rank: int = 256) -> dict:
  """The floor of the public int8 kernel's walk (int8 W2 + an fp32 scale per row, bf16
  base logits, W1 rows gathered as two int8 planes), to set against ``PUBLIC_INT8_US``:
  a floor above a measured figure means the model is wrong."""
  w2 = vocab * rank + vocab * 4
  nbytes = WalkBytes(w2=w2, base_logits=batch * steps * vocab * 2,
                     read_once=batch * steps * rank * 2, outputs=batch * steps * 4)
  return walk_floor(nbytes, steps, ceilings,
                    resident_fraction=default_resident_fraction(w2, num_sms=132))


def public_int8_check(ceilings: "Ceilings", platform: str = "gpu") -> dict:
  """The floor at these ceilings against the public int8 kernel's measured walks, B ->
  {"floor_us", "measured_us", "below"}: a floor above a real kernel's time is wrong.
  Empty off the GPU (``platform``, JAX's backend name): those walks were measured on an
  H200, and a CPU's ceilings set against them would only say the CPU is slower."""
  if platform not in ("gpu", "cuda"):
    return {}
  check = {}
  for batch, measured in PUBLIC_INT8_US.items():
    floor_us = public_int8_floor(ceilings, batch)["floor_us"]
    check[str(batch)] = {"floor_us": floor_us, "measured_us": measured,
                         "below": floor_us <= measured}
  return check


def walk_floor(nbytes: WalkBytes, steps: int, ceilings: Ceilings, *,
               resident_fraction: float | None = None,
               plan: dict | None = None, devices: int = 1) -> dict:
  """The floor of one walk (µs) and its terms; with ``plan`` (``kernel_plan``'s) also
  ``plan_floor_us``, the floor at that plan's resident fraction. ``devices`` > 1: the
  walk split along V over that many GPUs (the module docstring), with its exchange term
  ``floor_exchange_us``."""
  if devices > 1:
    nbytes = dataclasses.replace(nbytes, w2=nbytes.w2 // devices,
                                 base_logits=nbytes.base_logits // devices)
  if resident_fraction is None:
    resident_fraction = default_resident_fraction(nbytes.w2)
  once = nbytes.w2 + nbytes.base_logits + nbytes.read_once + nbytes.outputs
  hbm_us = once / (ceilings.hbm_gbps * 1e3)
  exchange_us = steps * ceilings.exchange_us if devices > 1 else 0.0
  sync_us = steps * ceilings.sync_us + exchange_us

  def l2_us(fraction):
    return (steps - 1) * (1.0 - fraction) * nbytes.w2 / (ceilings.l2_gbps * 1e3)

  stepwise_us = (steps * nbytes.w2 + nbytes.base_logits) / (ceilings.hbm_gbps * 1e3)
  floor = {"floor_us": hbm_us + l2_us(resident_fraction) + sync_us,
           "floor_hbm_us": hbm_us, "floor_l2_us": l2_us(resident_fraction),
           "floor_sync_us": sync_us, "floor_exchange_us": exchange_us,
           "devices": devices, "stepwise_floor_us": stepwise_us,
           "resident_fraction": resident_fraction, "bytes_once": once,
           "bytes_nonresident_per_step": (1.0 - resident_fraction) * nbytes.w2}
  if plan is not None:
    floor["kernel_plan"] = plan
    if plan.get("resident_fraction") is not None:
      floor["plan_floor_us"] = hbm_us + l2_us(plan["resident_fraction"]) + sync_us
  return floor
