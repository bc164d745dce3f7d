"""A modelled H200 decode iteration (not a measurement): c(B, K) from the shapes.

Stands in for a profiled table until the real loop is measured. One iteration verifies
B·(K + 1) tokens on the target, runs the DSpark drafter over the B·K block positions
and walks K serial steps; K = 0 is one plain target token per row. Each dense part is a
roofline: max(bytes / HBM bandwidth, FLOPs / tensor throughput), joined smoothly
(an L4 norm) because real kernels do not switch regime at a corner. The walk is fitted
to this project's measured persistent-walk times (H200, Qwen3-4B shape, bf16: ≈ 22 µs
at K = 1 and ≈ 140 µs at K = 7 for B = 1, ≈ 650 µs at K = 7 for B = 64).
"""

from __future__ import annotations

import dataclasses

import numpy as np

# H200: HBM read bandwidth as measured on the project's machine by a 4 GB reduction;
# dense bf16 throughput taken at ~60 % of the 989 TFLOP/s peak (what large GEMMs reach).
HBM_BYTES_PER_S = 4.2e12
DENSE_FLOPS_PER_S = 0.6 * 989e12


@dataclasses.dataclass(frozen=True)
class DecodeShape:
  """The parts of a target + drafter pair that set one iteration's cost."""

  target: str
  drafter: str
  target_params: float          # dense parameters read once per forward
  kv_bytes_per_token: float     # K and V of one cached token over all layers
  drafter_params: float         # draft layers + fc + lm_head
  context_len: int              # tokens in each row's cache
  walk_step_s: float            # one walk step at B = 1
  walk_step_per_row_s: float    # added per batch row per step
  walk_fixed_s: float
  fixed_s: float                # launches, acceptance, sampling: per iteration


QWEN3_8B_DSPARK = DecodeShape(
    target="qwen3-8b", drafter="dspark-qwen3-8b",
    target_params=8.2e9,
    # 36 layers x 8 KV heads x 128 x (K and V) x 2 bytes
    kv_bytes_per_token=36 * 8 * 128 * 2 * 2,
    # 5 Qwen3-8B-sized draft layers (~0.2e9 each), fc [d, 5d], lm_head [V, d]
    drafter_params=5 * 0.2e9 + 5 * 4096 * 4096 + 151_936 * 4096,
    context_len=1024,
    walk_step_s=17e-6, walk_step_per_row_s=1.2e-6, walk_fixed_s=5e-6,
    fixed_s=120e-6)

QWEN3_4B_DSPARK = dataclasses.replace(
    QWEN3_8B_DSPARK, target="qwen3-4b", drafter="dspark-qwen3-4b",
    target_params=4.0e9,
    kv_bytes_per_token=36 * 8 * 128 * 2 * 2,
    drafter_params=5 * 0.1e9 + 5 * 2560 * 2560 + 151_936 * 2560)

MODELLED_SHAPES = {shape.target: shape for shape in (QWEN3_8B_DSPARK, QWEN3_4B_DSPARK)}


def _roofline(bytes_read, flops):
  memory_s = bytes_read / HBM_BYTES_PER_S
  compute_s = flops / DENSE_FLOPS_PER_S
  return (memory_s ** 4 + compute_s ** 4) ** 0.25


def modelled_iteration_cost(shape: DecodeShape, batch, draft_len):
  """Seconds of one modelled H200 iteration (numpy broadcasting over batch, draft_len)."""
  batch = np.asarray(batch, np.float64)
  draft_len = np.asarray(draft_len, np.float64)
  tokens = batch * (draft_len + 1)
  target_s = _roofline(2 * shape.target_params
                       + batch * shape.context_len * shape.kv_bytes_per_token,
                       2 * shape.target_params * tokens)
  drafting = draft_len > 0
  drafter_s = _roofline(2 * shape.drafter_params, 2 * shape.drafter_params * batch * draft_len)
  walk_s = shape.walk_fixed_s + draft_len * (shape.walk_step_s
                                             + shape.walk_step_per_row_s * batch)
  return shape.fixed_s + target_s + np.where(drafting, drafter_s + walk_s, 0.0)


#: The provenance source of a cost table this model gave (the prefix ``modelled_source``
#: writes and ``controller.is_modelled`` reads).
MODELLED_SOURCE = "modelled"


def modelled_source(noise: float = 0.0) -> str:
  """The provenance source of a table profiled over ``modelled_cost_fn`` with ``noise``."""
  return MODELLED_SOURCE + (f", noise {noise}" if noise else "")


def modelled_cost_fn(target: str = "qwen3-8b", *, noise: float = 0.0, seed: int = 0):
  """``cost(batch, draft_len) -> seconds`` of the modelled H200, with optional
  multiplicative measurement noise (a lognormal of sigma ``noise``)."""
  if target not in MODELLED_SHAPES:
    raise ValueError(f"target={target!r} must be one of {sorted(MODELLED_SHAPES)}")
  shape = MODELLED_SHAPES[target]
  rng = np.random.default_rng(seed)

  def cost(batch: int, draft_len: int) -> float:
    seconds = float(modelled_iteration_cost(shape, batch, draft_len))
    return seconds * float(np.exp(noise * rng.standard_normal())) if noise else seconds

  cost.shape = shape
  return cost
