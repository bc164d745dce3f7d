"""c(B, K): the device time of one decode iteration per batch size and draft length.

A ``CostTable`` holds the measured (or modelled) seconds of one iteration at a few
batch buckets for every draft length K = 0 (plain autoregressive decoding) .. block
size, with where the figures came from. Between buckets the cost is linear in B (an
iteration's work is linear in the B·(K + 1) verified tokens between the roofline's
corners); above the largest bucket it extrapolates the last segment; below the first it
holds the first bucket's cost.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.result_files import write_json

SCHEMA = "wts_jax.tabletune.cost_table/1"


@dataclasses.dataclass(frozen=True)
class CostTable:
  """Seconds of one iteration: ``seconds[i, k]`` at batch ``batches[i]``, draft length k."""

  device_kind: str
  target: str
  drafter: str
  batches: tuple[int, ...]
  seconds: tuple[tuple[float, ...], ...]  # [len(batches)][max_draft_len + 1]
  provenance: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    batches = list(self.batches)
    if len(batches) < 2 or any(not isinstance(b, int) or b < 1 for b in batches):
      raise ValueError(f"batches={self.batches!r} must be >= 2 ints >= 1")
    if sorted(set(batches)) != batches:
      raise ValueError(f"batches={self.batches!r} must be strictly increasing")
    seconds = np.asarray(self.seconds, np.float64)
    if seconds.ndim != 2 or seconds.shape[0] != len(batches) or seconds.shape[1] < 2:
      raise ValueError(f"seconds shape={seconds.shape} must be [len(batches)={len(batches)}, "
                       f"max_draft_len + 1 >= 2]")
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
      raise ValueError(f"seconds={self.seconds!r} must be finite and > 0")

  @property
  def max_draft_len(self) -> int:
    return len(self.seconds[0]) - 1

  def array(self) -> np.ndarray:
    return np.asarray(self.seconds, np.float64)

  def cost(self, batch, draft_len=None):
    """Seconds at ``batch`` (scalar or array) for ``draft_len`` (None: every K, last axis)."""
    row = interpolate_rows(np.asarray(self.batches, np.float64), self.array(),
                           np.asarray(batch, np.float64))
    return row if draft_len is None else row[..., draft_len]

  def refined(self, batch: float, draft_len: int, seconds: float, *,
              weight: float = 0.25) -> CostTable:
    """The table moved towards one live measurement of an iteration at (batch, K).

    The bucket(s) that the cost at ``batch`` is interpolated from are scaled at column K
    by one factor, so that the cost there moves ``weight`` of the way to ``seconds`` (an
    exponential average when fed every measurement); above the largest bucket the last
    two scale alike. A jitted decode loop
    has no device clock, so this runs on the host between runs (a controller built from
    the refined table compiles once more).
    """
    if not 0 <= draft_len <= self.max_draft_len:
      raise ValueError(f"draft_len={draft_len!r} must be in [0, {self.max_draft_len}]")
    if not (math.isfinite(seconds) and seconds > 0):
      raise ValueError(f"seconds={seconds!r} must be finite and > 0")
    if not 0 < weight <= 1:
      raise ValueError(f"weight={weight!r} must be in (0, 1]")
    batches = np.asarray(self.batches, np.float64)
    position = np.clip(np.interp(batch, batches, np.arange(len(batches))), 0, len(batches) - 1)
    lower = min(int(position), len(batches) - 2)
    rows = [lower] if position == lower else [lower, lower + 1]
    if batch > batches[-1]:
      rows = [len(batches) - 2, len(batches) - 1]
    table = self.array()
    table[rows, draft_len] *= 1.0 + weight * (seconds / float(self.cost(batch, draft_len)) - 1.0)
    provenance = {**self.provenance,
                  "refinements": int(self.provenance.get("refinements", 0)) + 1}
    return dataclasses.replace(self, seconds=tuple(map(tuple, table.tolist())),
                               provenance=provenance)

  def with_noise(self, sigma: float, seed: int = 0) -> CostTable:
    """A second 'measurement' of this table: every entry times a lognormal of ``sigma``
    (what a policy sees when the table it was given is itself measured)."""
    if not sigma >= 0:
      raise ValueError(f"sigma={sigma!r} must be >= 0")
    noise = np.exp(sigma * np.random.default_rng(seed).standard_normal(self.array().shape))
    provenance = {**self.provenance, "noise_sigma": sigma, "noise_seed": seed}
    return dataclasses.replace(self, seconds=tuple(map(tuple, (self.array() * noise).tolist())),
                               provenance=provenance)

  def to_json(self) -> dict[str, Any]:
    return {"schema": SCHEMA, "device_kind": self.device_kind, "target": self.target,
            "drafter": self.drafter, "batches": list(self.batches),
            "draft_lens": list(range(self.max_draft_len + 1)),
            "seconds": [list(map(float, row)) for row in self.seconds],
            "provenance": self.provenance}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> CostTable:
    if not isinstance(data, dict):
      raise ValueError(f"a cost table is a JSON object, not a {type(data).__name__}")
    if data.get("schema") != SCHEMA:
      raise ValueError(f"schema={data.get('schema')!r} must be {SCHEMA!r}")
    return cls(device_kind=data["device_kind"], target=data["target"],
               drafter=data["drafter"], batches=tuple(int(b) for b in data["batches"]),
               seconds=tuple(tuple(float(s) for s in row) for row in data["seconds"]),
               provenance=dict(data.get("provenance", {})))

  def save(self, path: str | pathlib.Path) -> pathlib.Path:
    return write_json(self.to_json(), path)

  @classmethod
  def load(cls, path: str | pathlib.Path) -> CostTable:
    return cls.from_json(json.loads(pathlib.Path(path).read_text()))


def interpolate_rows(batches, seconds, batch):
  """Cost rows [..., K + 1] at ``batch``: piecewise linear in B, extrapolating the last
  segment, held constant below the first bucket. numpy or jax arrays alike."""
  xp = jnp if isinstance(seconds, jax.Array) or isinstance(batch, jax.Array) else np
  batch = xp.maximum(xp.asarray(batch, seconds.dtype), batches[0])
  segment = xp.clip(xp.searchsorted(batches, batch, side="right") - 1, 0, len(batches) - 2)
  lo, hi = batches[segment], batches[segment + 1]
  fraction = ((batch - lo) / (hi - lo))[..., None]
  return seconds[segment] + fraction * (seconds[segment + 1] - seconds[segment])


def table_filename(device_kind: str, target: str, drafter: str) -> str:
  """One file per (device kind, target, drafter): ``costs_<device>_<target>_<drafter>.json``."""
  def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
  return f"costs_{slug(device_kind)}_{slug(target)}_{slug(drafter)}.json"
