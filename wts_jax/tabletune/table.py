"""The draft-length table: K*(B) = argmax_K B · E[accepted + 1 | K] / c(B, K), K over
the cost table's draft lengths (K = 0, the target alone, among them when measured).

Acceptance enters only through the expected tokens per row, so one cost table and an
acceptance profile (per-position conditional acceptance) give the whole table; a new
profile re-derives it without re-profiling.
"""

from __future__ import annotations

import pathlib

import numpy as np

from wts_jax.tabletune.acceptance import expected_tokens
from wts_jax.tabletune.cost_table import CostTable
from wts_jax.result_files import pyplot, save_figure


def profile_from_rate(rate: float, max_draft_len: int, decay: float = 1.0) -> np.ndarray:
  """A per-position acceptance profile: ``rate`` at position 0, times ``decay`` a position."""
  if not 0.0 <= rate <= 1.0:
    raise ValueError(f"rate={rate!r} must be in [0, 1]")
  return rate * decay ** np.arange(max_draft_len)


def tokens_per_second(table: CostTable, acceptance, batch) -> np.ndarray:
  """[..., len(draft_lens)]: B · E[accepted + 1 | K] / c(B, K) for K in the table's
  draft lengths."""
  acceptance = np.asarray(acceptance, np.float64)[..., :table.max_draft_len]
  if acceptance.shape[-1] != table.max_draft_len:
    raise ValueError(f"acceptance has {acceptance.shape[-1]} positions; the table needs "
                     f"max_draft_len={table.max_draft_len}")
  batch = np.asarray(batch, np.float64)
  tokens = expected_tokens(acceptance)[..., list(table.draft_lens)]
  return batch[..., None] * tokens / table.cost(batch)


def best_draft_len(table: CostTable, acceptance, batch, *, min_draft_len: int = 0) -> np.ndarray:
  """K*(B) for each batch in ``batch``: a draft length of the table, >= ``min_draft_len``
  (ties go to the shorter draft)."""
  allowed = np.asarray(table.draft_lens) >= min_draft_len
  if not allowed.any():
    raise ValueError(f"min_draft_len={min_draft_len!r} is above every draft length of the "
                     f"table ({table.draft_lens})")
  rates = np.where(allowed, tokens_per_second(table, acceptance, batch), -np.inf)
  return np.asarray(table.draft_lens)[np.argmax(rates, axis=-1)]


def draft_len_table(table: CostTable, acceptance, batches=None, *,
                    min_draft_len: int = 0) -> dict:
  """The table as JSON-ready rows: batch, K*, tokens/s at each of the table's K."""
  batches = np.arange(1, max(table.batches) + 1) if batches is None else np.asarray(batches)
  rates = tokens_per_second(table, acceptance, batches)
  best = best_draft_len(table, acceptance, batches, min_draft_len=min_draft_len)
  return {"batches": batches.tolist(), "draft_lens": list(table.draft_lens),
          "best_draft_len": best.tolist(), "tokens_per_s": rates.tolist(),
          "acceptance": np.asarray(acceptance, np.float64).tolist()}


def plot_table(table: CostTable, profiles: dict[str, np.ndarray], path: str | pathlib.Path,
               *, title_note: str = "") -> pathlib.Path:
  """PNG: K*(B) staircases (one line per acceptance profile) and throughput vs K per
  batch bucket (for the first profile)."""
  plt = pyplot()
  batches = np.arange(1, max(table.batches) + 1)
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
  for name, acceptance in profiles.items():
    left.step(batches, best_draft_len(table, acceptance, batches), where="mid", label=name)
  left.set_xscale("log", base=2)
  left.set_xlabel("batch B")
  left.set_ylabel("K* (draft length)")
  left.set_title("draft-length table K*(B)")
  left.legend(fontsize=8)
  first_name, first = next(iter(profiles.items()))
  draft_lens = np.asarray(table.draft_lens)
  for batch in table.batches:
    rates = tokens_per_second(table, first, batch)
    right.plot(draft_lens, rates / rates.max(), marker="o", label=f"B={batch}")
  right.set_xlabel("K")
  right.set_ylabel("tokens/s relative to the best K")
  right.set_title(f"throughput vs K per B ({first_name})")
  right.legend(fontsize=7, ncol=2)
  source = table.provenance.get("source", "?")
  fig.suptitle(f"{table.device_kind} {table.target} + {table.drafter} ({source}){title_note}")
  fig.tight_layout()
  return save_figure(fig, path)
