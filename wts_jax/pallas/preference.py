"""Which backend ``impl="auto"`` (and each family) takes for a walk, and with which
config: the device's tuned table (data: ``tuned/<device kind>/walk.json``), else the
planners' fallback order.

A table entry names, for a head (type, its derived table), V, r, the W2's form, greedy
or sampled and a range of batch sizes, the backend measured fastest there and the full
config it runs with (every choice a planner would make, written out; the budget —
resident chunks, ring slots — is still the planner's on the device's shared memory).
Off the table (another device, shape or W2), ``fallback_order`` ranks the backends by
the planners' rules, which were read from the same measurements on the H200.
"""

from __future__ import annotations

import functools
import json
import pathlib
import re

import jax.numpy as jnp

from wts_jax.walk_config import (MosaicBatchedConfig, MosaicRowConfig, MosaicStackedConfig,
                                 TritonConfig)

TUNED_DIR = pathlib.Path(__file__).with_name("tuned")
CONFIG_TYPES = {"mosaic_stacked": MosaicStackedConfig, "mosaic_batched": MosaicBatchedConfig,
                "mosaic_row": MosaicRowConfig, "triton": TritonConfig}
MOSAIC = ("mosaic_stacked", "mosaic_batched", "mosaic_row")
# From this many rows the stacked kernel is the Mosaic kernel of a greedy int8-planes
# walk (``docs/decisions.md``: the stacked kernel); sampled walks stay on the batched one.
STACKED_MIN_BATCH = 1


def device_slug(device_kind: str) -> str:
  return re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_")


def table_file(device_kind: str) -> pathlib.Path:
  return TUNED_DIR / device_slug(device_kind) / "walk.json"


@functools.lru_cache(maxsize=None)
def tuned_table(device_kind: str) -> tuple[dict, ...]:
  """The committed entries of ``device_kind``'s table (none when it has none)."""
  path = table_file(device_kind)
  if not path.exists():
    return ()
  return tuple(json.loads(path.read_text())["entries"])


def w2_form(head) -> str:
  """The W2 as a table names it: its dtype's name, or "int8_planes" (an int8 W2 that z
  meets as two int8 planes)."""
  serial = head.markov_head
  if serial.z_as_int8_planes:
    return "int8_planes"
  return jnp.dtype(serial.markov_w2.weight.dtype).name


def derived_table(head) -> str | None:
  """The head's derived table a kernel may read: "gate", "joint" or None."""
  from wts_jax.gate_table import has_gate_table
  from wts_jax.joint_table import has_joint_table
  serial = head.markov_head
  if has_gate_table(serial):
    return "gate"
  if has_joint_table(serial):
    return "joint"
  return None


def table_key(head, shapes) -> dict:
  """What a table entry is matched on (its "batch" a range that holds ``shapes.batch``)."""
  config = head.config
  return {"head": config.head_type, "table": derived_table(head),
          "vocab": config.vocab_size, "rank": config.rank, "w2": w2_form(head),
          "mode": "greedy" if shapes.greedy else "sampled"}


def tuned_entry(device_kind: str, head, shapes) -> dict | None:
  """The device's table entry for this walk, or None. (The tables were measured with
  jax >= 0.11, whose Mosaic GPU lowers the batch on N; with jax 0.10 the planners
  decide.)"""
  from wts_jax.pallas.mosaic_launch import BATCH_ON_N_LOWERS
  if not BATCH_ON_N_LOWERS:
    return None
  key = table_key(head, shapes)
  for entry in tuned_table(device_kind):
    low, high = entry["batch"]
    if (all(entry[name] == value for name, value in key.items())
        and low <= shapes.batch and (high is None or shapes.batch <= high)):
      return entry
  return None


def preference(head, shapes, device_kind: str) -> tuple[tuple[str, ...], dict]:
  """(the kernels in the order the families try them, {backend: the tuned config it
  plans with where no config is given})."""
  fallback = fallback_order(head, shapes)
  if shapes.return_logits or shapes.return_logprobs:
    # The Mosaic kernels return them by a second pass over the drafted tokens
    # (``reference.logits_of_tokens``), not measured against the Triton kernel's
    # in-kernel logits; the table was measured without them.
    return ("triton", *mosaic_order(head, shapes)), {}
  entry = tuned_entry(device_kind, head, shapes)
  if entry is None:
    return fallback, {}
  impl = entry["impl"]
  config = CONFIG_TYPES[impl](**entry["config"]) if impl in CONFIG_TYPES else None
  return (impl, *[name for name in fallback if name != impl]), {impl: config}


def fallback_order(head, shapes) -> tuple[str, ...]:
  """The kernels best first by the planners' rules (measured on the H200): Mosaic for
  vanilla walks of one row (the row kernel) and of 2 to 64 rows (the stacked kernel for
  a greedy int8-planes walk, else the batched kernel), greedy and sampled, and for the
  gated and rnn heads from one row to 64 (the batched kernel, their update split over
  the blocks or from their table; an int8 W2 widened to bf16); past 64 rows Triton."""
  from wts_jax.pallas.batched.auto import AUTO_BATCHED_RANGE
  from wts_jax.pallas.mosaic_plan import AUTO_MAX_BATCH
  low, high = AUTO_BATCHED_RANGE
  head_type = head.config.head_type
  batched = low < shapes.batch <= high
  faster = ((head_type == "vanilla" and (shapes.batch <= AUTO_MAX_BATCH or batched))
            or (head_type in ("gated", "rnn") and shapes.batch <= high))
  mosaic = mosaic_order(head, shapes)
  return (*mosaic, "triton") if faster else ("triton", *mosaic)


def mosaic_order(head, shapes) -> tuple[str, ...]:
  """The Mosaic kernels best first: the stacked kernel for the vanilla head's greedy walk
  of an int8-planes W2 (bf16 base logits); the batched kernel past one row (faster from
  two: ``docs/decisions.md``), for the gated and rnn heads (their update split over the
  blocks), and for a greedy walk whose int8 W2 the batched kernel widens in registers;
  else the row kernel."""
  from wts_jax.pallas import mosaic_batched_backend, mosaic_stacked_backend
  from wts_jax.pallas.mosaic_plan import AUTO_MAX_BATCH
  if (shapes.greedy and shapes.batch >= STACKED_MIN_BATCH
      and mosaic_stacked_backend.refusal(head, shapes, MosaicStackedConfig()) is None):
    return ("mosaic_stacked", "mosaic_batched", "mosaic_row")
  split_head = head.config.head_type in ("gated", "rnn")
  widened_greedy = shapes.greedy and mosaic_batched_backend.w2_widening(
      head, shapes, MosaicBatchedConfig()) == "registers"
  if shapes.batch > AUTO_MAX_BATCH or split_head or widened_greedy:
    return ("mosaic_batched", "mosaic_row", "mosaic_stacked")
  return ("mosaic_row", "mosaic_batched", "mosaic_stacked")
