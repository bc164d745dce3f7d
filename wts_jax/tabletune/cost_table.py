"""c(B, K): the device time of one decode iteration per batch size and draft length.

A ``CostTable`` holds the measured (or modelled) seconds of one iteration at a few
batch buckets for a set of draft lengths ``draft_lens`` (the columns' labels: K = 0 is
the target alone, one token per row), with where the figures came from. A table measured
at K = 0, 1, 2, 3, 5, 7 has six columns labelled so; nothing reads a column by its
position. Between buckets the cost is linear in B (an iteration's work is linear in the
B·(K + 1) verified tokens between the roofline's corners); above the largest bucket it
extrapolates the last segment; below the first it holds the first bucket's cost. Between
two labelled draft lengths it is linear in K (``cost`` at an unlabelled K).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.result_files import write_json
from wts_jax.specdecode.policy import check_draft_lens, searchsorted

SCHEMA = "wts_jax.tabletune.cost_table/1"


@dataclasses.dataclass(frozen=True)
class CostTable:
  """Seconds of one iteration: ``seconds[i][j]`` at batch ``batches[i]``, draft length
  ``draft_lens[j]``."""

  device_kind: str
  target: str
  drafter: str
  batches: tuple[int, ...]
  draft_lens: tuple[int, ...]
  seconds: tuple[tuple[float, ...], ...]  # [len(batches)][len(draft_lens)]
  provenance: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    batches = list(self.batches)
    if len(batches) < 2 or any(not isinstance(b, int) or b < 1 for b in batches):
      raise ValueError(f"batches={self.batches!r} must be >= 2 ints >= 1")
    if sorted(set(batches)) != batches:
      raise ValueError(f"batches={self.batches!r} must be strictly increasing")
    draft_lens = check_draft_lens(self.draft_lens)
    if len(draft_lens) < 2:
      raise ValueError(f"draft_lens={self.draft_lens!r} must hold >= 2 draft lengths")
    seconds = np.asarray(self.seconds, np.float64)
    if seconds.ndim != 2 or seconds.shape != (len(batches), len(draft_lens)):
      raise ValueError(f"seconds shape={seconds.shape} must be [len(batches)={len(batches)}, "
                       f"len(draft_lens)={len(draft_lens)}] (draft_lens={draft_lens}: one "
                       f"column per label)")
    if not np.all(np.isfinite(seconds)) or np.any(seconds <= 0):
      raise ValueError(f"seconds={self.seconds!r} must be finite and > 0")

  @property
  def max_draft_len(self) -> int:
    return self.draft_lens[-1]

  def array(self) -> np.ndarray:
    """[len(batches), len(draft_lens)] seconds."""
    return np.asarray(self.seconds, np.float64)

  def column(self, draft_len: int) -> int:
    """The column labelled ``draft_len`` (a ValueError if the table did not measure it)."""
    if draft_len not in self.draft_lens:
      raise ValueError(f"draft_len={draft_len!r} is not in the table's draft_lens="
                       f"{self.draft_lens}")
    return self.draft_lens.index(draft_len)

  def cost(self, batch, draft_len=None):
    """Seconds at ``batch`` (scalar or array): for ``draft_len`` (an int in
    [min(draft_lens), max(draft_lens)], linear in K between labels), or for every
    labelled draft length along the last axis when None."""
    row = interpolate_rows(np.asarray(self.batches, np.float64), self.array(),
                           np.asarray(batch, np.float64))
    if draft_len is None:
      return row
    if not self.draft_lens[0] <= draft_len <= self.draft_lens[-1]:
      raise ValueError(f"draft_len={draft_len!r} is outside the table's draft_lens="
                       f"{self.draft_lens}")
    return interpolate_draft_len(np.asarray(self.draft_lens, np.float64), row, draft_len)

  def restricted(self, draft_lens) -> CostTable:
    """The table's columns for ``draft_lens`` (each must be one of its labels)."""
    draft_lens = check_draft_lens(draft_lens)
    columns = [self.column(k) for k in draft_lens]
    return dataclasses.replace(self, draft_lens=draft_lens,
                               seconds=tuple(tuple(row[j] for j in columns)
                                             for row in self.seconds))

  def scaled(self, factors, note: str) -> CostTable:
    """Every entry times ``factors`` (broadcast against [batches, draft_lens]); the
    provenance records ``note``."""
    seconds = self.array() * np.asarray(factors, np.float64)
    provenance = {**self.provenance, "scaled": [*self.provenance.get("scaled", []), note]}
    return dataclasses.replace(self, seconds=tuple(map(tuple, seconds.tolist())),
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
            "draft_lens": list(self.draft_lens),
            "seconds": [list(map(float, row)) for row in self.seconds],
            "provenance": self.provenance}

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> CostTable:
    """The table a JSON object holds; its ``draft_lens`` label the columns (a table whose
    labels do not match its columns is refused, never read by position)."""
    if not isinstance(data, dict):
      raise ValueError(f"a cost table is a JSON object, not a {type(data).__name__}")
    if data.get("schema") != SCHEMA:
      raise ValueError(f"schema={data.get('schema')!r} must be {SCHEMA!r}")
    missing = [key for key in ("device_kind", "target", "drafter", "batches", "draft_lens",
                               "seconds") if key not in data]
    if missing:
      raise ValueError(f"the cost table has no {missing[0]!r}")
    rows = data["seconds"]
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
      raise ValueError("seconds must be a list of rows")
    labels = data["draft_lens"]
    if not isinstance(labels, list):
      raise ValueError(f"draft_lens={labels!r} must be a list")
    widths = sorted({len(row) for row in rows})
    if widths != [len(labels)]:
      raise ValueError(f"draft_lens={labels} labels {len(labels)} columns but the rows of "
                       f"seconds hold {widths[0] if len(widths) == 1 else widths}")
    return cls(device_kind=str(data["device_kind"]), target=str(data["target"]),
               drafter=str(data["drafter"]), batches=tuple(int(b) for b in data["batches"]),
               draft_lens=check_draft_lens(labels),
               seconds=tuple(tuple(float(s) for s in row) for row in rows),
               provenance=dict(data.get("provenance", {})))

  def save(self, path: str | pathlib.Path) -> pathlib.Path:
    return write_json(self.to_json(), path)

  @classmethod
  def load(cls, path: str | pathlib.Path) -> CostTable:
    return cls.from_json(json.loads(pathlib.Path(path).read_text()))


def bucket_weights(batches, batch):
  """The two buckets the cost at ``batch`` is interpolated from and their weights:
  (lower index, lower weight, upper weight); linear between buckets, the last segment
  extrapolated above the largest, the first bucket's cost held below the smallest.
  numpy or jax arrays alike."""
  xp = jnp if isinstance(batches, jax.Array) or isinstance(batch, jax.Array) else np
  batch = xp.maximum(xp.asarray(batch, batches.dtype), batches[0])
  lower = xp.clip(searchsorted(xp, batches, batch, side="right") - 1, 0, len(batches) - 2)
  fraction = (batch - batches[lower]) / (batches[lower + 1] - batches[lower])
  return lower, 1.0 - fraction, fraction


def interpolate_rows(batches, seconds, batch):
  """Cost rows [..., len(draft_lens)] at ``batch`` (see ``bucket_weights``)."""
  lower, w_lower, w_upper = bucket_weights(batches, batch)
  return w_lower[..., None] * seconds[lower] + w_upper[..., None] * seconds[lower + 1]


def interpolate_draft_len(draft_lens, row, draft_len):
  """``row`` (cost at each label, last axis) at ``draft_len``, linear in K between labels."""
  xp = jnp if isinstance(row, jax.Array) or isinstance(draft_len, jax.Array) else np
  upper = xp.clip(searchsorted(xp, draft_lens, draft_len, side="left"), 1,
                  len(draft_lens) - 1)
  fraction = ((draft_len - draft_lens[upper - 1])
              / (draft_lens[upper] - draft_lens[upper - 1]))
  lo = xp.take(row, upper - 1, axis=-1)
  hi = xp.take(row, upper, axis=-1)
  return lo + fraction * (hi - lo)


def table_filename(device_kind: str, target: str, drafter: str) -> str:
  """One file per (device kind, target, drafter): ``costs_<device>_<target>_<drafter>.json``."""
  def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
  return f"costs_{slug(device_kind)}_{slug(target)}_{slug(drafter)}.json"
