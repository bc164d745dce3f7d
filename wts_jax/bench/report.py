"""The benchmark's outputs: speedup ratios, the JSON file, the stdout and Markdown
tables, and the plot (time per walk against batch, one line per path, the floor dashed).
"""

from __future__ import annotations

import json
import math
import sys

from wts_jax import result_files

POINT_KEYS = ("shape", "head", "rank", "w2_dtype", "confidence", "return_logits", "mode",
              "l2", "k", "batch")


def point_key(record: dict) -> tuple:
  return tuple(record.get(key) for key in POINT_KEYS)


def _timed(record: dict) -> bool:
  value = record.get("median_us")
  return isinstance(value, (int, float)) and math.isfinite(value)


def add_speedups(records: list[dict]) -> None:
  """``speedup_vs[other] = median(other) / median(this)`` at the same point and L2 state.

  Above 1: this path is that many times faster than ``other``.
  """
  by_point: dict[tuple, list[dict]] = {}
  for record in records:
    by_point.setdefault(point_key(record), []).append(record)
  for group in by_point.values():
    for record in group:
      if not _timed(record):
        record.pop("speedup_vs", None)
        continue
      # A median at or below zero (timing noise on a tiny CPU case) has no ratio.
      record["speedup_vs"] = {
          other["path"]: (other["median_us"] / record["median_us"]
                          if record["median_us"] > 0 and other["median_us"] > 0 else None)
          for other in group if other is not record and _timed(other)}


# --- JSON ------------------------------------------------------------------------------

def _clean(value):
  """JSON-safe: NaN/inf become null, tuples lists, unknown objects strings."""
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, dict):
    return {str(key): _clean(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [_clean(item) for item in value]
  if value is None or isinstance(value, (bool, int, str)):
    return value
  try:
    return _clean(value.item())   # numpy scalars
  except Exception:  # noqa: BLE001
    return str(value)


def write_json(results: dict, path: str) -> None:
  """Written atomically (``result_files``), non-finite floats as null."""
  result_files.write_json(_clean(results), path)


def read_json(path: str) -> dict:
  with open(path) as handle:
    return json.load(handle)


def merge(results_list: list[dict]) -> dict:
  """One results dict from several runs on one device kind (e.g. one run per head, to
  keep each under a time limit). Records keep the ratios of the run that measured them;
  ``runs`` lists each run's command, timestamp, ceilings, timing settings and whether it
  was cut short; the lists of records, sanity lines, point errors, point times and
  skipped points are concatenated."""
  if not results_list:
    raise ValueError("merge needs at least one results JSON")
  kinds = {results.get("device_kind") for results in results_list}
  if len(kinds) != 1:
    raise ValueError(f"cannot merge runs from different devices: {sorted(map(str, kinds))}")
  merged = {key: value for key, value in results_list[0].items()
            if key not in MERGED_LISTS}
  merged["runs"] = [{key: results.get(key) for key in RUN_KEYS}
                    for results in results_list]
  for key in MERGED_LISTS:
    merged[key] = [entry for results in results_list for entry in results.get(key) or []]
  return merged


MERGED_LISTS = ("records", "sanity", "point_errors", "point_times", "skipped_points")
RUN_KEYS = ("command", "timestamp", "ceilings", "timing", "elapsed_s", "time_budget_s",
            "interrupted")


# --- tables ----------------------------------------------------------------------------

def _paths_in_order(records: list[dict]) -> list[str]:
  seen: dict[str, None] = {}
  for record in records:
    seen.setdefault(record["path"], None)
  return list(seen)


def _cell(record: dict | None) -> str:
  if record is None:
    return "-"
  if _timed(record):
    text = f"{record['median_us']:.1f}"
    if record.get("x_floor"):
      text += f" ({record['x_floor']:.2f}×)"
    return text
  check = record.get("check") or ""
  if record.get("error"):
    return "error"
  if check.startswith("mismatch"):
    return "MISMATCH"
  if check.startswith("skipped"):
    return "skip"
  if check.startswith("error"):
    return "error"
  return "-"


def _rows(results: dict) -> tuple[list[str], list[list[str]]]:
  records = results.get("records", [])
  path_names = _paths_in_order(records)
  groups: dict[tuple, dict[str, dict]] = {}
  for record in records:
    groups.setdefault(point_key(record), {})[record["path"]] = record
  header = ["shape", "head", "r", "w2", "mode", "L2", "K", "B", "floor µs",
            "step-wise floor µs", *path_names]
  rows = []
  for key, by_path in groups.items():
    any_record = next(iter(by_path.values()))
    floor = any_record.get("floor_us")
    stepwise = any_record.get("stepwise_floor_us")
    rows.append([str(any_record.get("shape")), str(any_record.get("head")),
                 str(any_record.get("rank")), str(any_record.get("w2_dtype")),
                 str(any_record.get("mode")), str(any_record.get("l2")),
                 str(any_record.get("k")), str(any_record.get("batch")),
                 f"{floor:.1f}" if floor else "-", f"{stepwise:.1f}" if stepwise else "-",
                 *[_cell(by_path.get(name)) for name in path_names]])
  return header, rows


def _first_line(text: str, limit: int = 300) -> str:
  line = text.strip().splitlines()[0] if text.strip() else ""
  return line if len(line) <= limit else line[:limit] + "…"


def _problems(results: dict) -> list[str]:
  """One line per (path, problem): skipped, failed its check, or failed to time, with
  the points it happened at (counted when more than one)."""
  found: dict[tuple, list[str]] = {}
  for record in results.get("records", []):
    check = record.get("check") or ""
    text = record.get("error") or ("" if check.startswith("ok") else check)
    if not text:
      continue
    where = (f"{record.get('head')} B={record.get('batch')} K={record.get('k')} "
             f"{record.get('w2_dtype')} {record.get('mode')} {record.get('l2')}")
    found.setdefault((record["path"], _first_line(text)), []).append(where)
  lines = []
  for (path, text), points in found.items():
    if text.startswith("skipped"):
      lines.append(f"{path}: {text}")
    elif len(points) == 1:
      lines.append(f"{path} ({points[0]}): {text}")
    else:
      lines.append(f"{path} ({len(points)} points, e.g. {points[0]}): {text}")
  return lines


def _ceilings_line(results: dict) -> str:
  ceilings = results.get("ceilings") or {}
  if not ceilings or "hbm_gbps" not in ceilings:
    return f"ceilings: not measured ({ceilings.get('error', 'none')})"
  line = (f"ceilings (measured in this run): HBM read {ceilings['hbm_gbps']:.0f} GB/s, "
          f"L2 {ceilings['l2_gbps']:.0f} GB/s, grid sync {ceilings['sync_us']:.2f} µs "
          f"({ceilings['sync_source']})")
  above = [batch for batch, entry in (ceilings.get("public_int8_check") or {}).items()
           if not entry["below"]]
  if above:
    line += ("; the floor is above the public int8 kernel's measured walk at B = "
             + ", ".join(above) + ": these ceilings are too low")
  return line


def _sanity_lines(results: dict) -> list[str]:
  lines = []
  for entry in results.get("sanity", []):
    where = f"{entry['framework']} empty walk ({entry.get('kind', '?')}) B={entry['batch']} " \
            f"L2 {entry['l2']}"
    if entry.get("error"):
      lines.append(f"{where}: error {entry['error']}")
    else:
      lines.append(f"{where}: {_us(entry['median_us'])} (min {_us(entry['min_us'])}, "
                   f"p90 {_us(entry['p90_us'])})")
  return lines


def _us(value: float) -> str:
  """A per-walk time; below zero it is a chain that ran faster than the subtracted
  flush-only chain's median: noise larger than the walk, not a time."""
  return f"{value:.2f} µs" if value >= 0 else "< 0 (the clock's noise)"


def _skipped_lines(results: dict) -> list[str]:
  """One line per reason that points were not run for (time budget, interruption)."""
  by_reason: dict[str, list[str]] = {}
  for point in results.get("skipped_points") or []:
    reason = _first_line(str(point.get("reason", "")))
    by_reason.setdefault(reason.split(":")[0], []).append(
        f"{point.get('head')} B={point.get('batch')} K={point.get('k')}")
  return [f"{len(points)} point(s) not run ({reason}): {', '.join(points)}"
          for reason, points in by_reason.items()]


def render_table(results: dict) -> str:
  """The stdout table: one row per point, one column per path (µs, × floor)."""
  header, rows = _rows(results)
  widths = [max(len(header[i]), *(len(row[i]) for row in rows)) if rows else len(header[i])
            for i in range(len(header))]
  fmt = lambda cells: "  ".join(cell.rjust(width) for cell, width in zip(cells, widths))
  lines = [f"{results.get('device_kind')} | jax {results.get('jax_version')} | torch "
           f"{results.get('torch_version')} | triton {results.get('triton_version')}",
           _ceilings_line(results), *_sanity_lines(results), "",
           "median µs per walk (× floor)", fmt(header), fmt(["-" * w for w in widths])]
  lines += [fmt(row) for row in rows]
  problems = _problems(results) + _skipped_lines(results)
  if problems:
    lines += ["", "not timed / failed:", *(f"  {line}" for line in problems)]
  return "\n".join(lines)


def render_markdown(results_list) -> str:
  """Markdown tables of results JSONs, one section each."""
  if isinstance(results_list, dict):
    results_list = [results_list]
  sections = []
  for results in results_list:
    header, rows = _rows(results)
    lines = [f"## {results.get('device_kind')} — {results.get('timestamp', '')[:19]}", "",
             f"jax {results.get('jax_version')} (jaxlib {results.get('jaxlib_version')}), "
             f"torch {results.get('torch_version')}, triton "
             f"{results.get('triton_version')}; `{results.get('command', '')}`", "",
             _ceilings_line(results) + ".", ""]
    sanity = _sanity_lines(results)
    if sanity:
      lines += ["Method sanity check:", "", *(f"- {line}" for line in sanity), ""]
    lines += ["Median µs per walk (multiple of the floor model); L2 cold = flushed "
              "between walks. Method: `wts_jax.bench.timing.METHOD`.", "",
              "| " + " | ".join(header) + " |",
              "| " + " | ".join("---:" if i >= 6 else "---" for i in range(len(header)))
              + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    problems = _problems(results) + _skipped_lines(results)
    if problems:
      lines += ["", "Not timed or failed:", "", *(f"- {line}" for line in problems)]
    sections.append("\n".join(lines))
  return "\n\n".join(sections) + "\n"


# --- the plot --------------------------------------------------------------------------

def plot(results: dict, path: str) -> bool:
  """Time per walk against batch, one line per path, the floor dashed; one panel per
  (head, K, mode, ...) at the headline L2 state (cold when measured). False if skipped."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except Exception as err:  # noqa: BLE001
    print(f"plot skipped: matplotlib is not importable ({type(err).__name__}: {err})",
          file=sys.stderr)
    return False
  records = [r for r in results.get("records", []) if r.get("batch") is not None]
  l2_states = {r.get("l2") for r in records}
  headline = "cold" if "cold" in l2_states else "warm"
  records = [r for r in records if r.get("l2") == headline]
  panel_keys = ("shape", "head", "rank", "w2_dtype", "mode", "k")
  panels: dict[tuple, list[dict]] = {}
  for record in records:
    panels.setdefault(tuple(record.get(key) for key in panel_keys), []).append(record)
  if not panels:
    print("plot skipped: no records", file=sys.stderr)
    return False
  path_names = _paths_in_order(records)
  colors = {name: f"C{i % 10}" for i, name in enumerate(path_names)}
  count = len(panels)
  cols = min(3, count)
  rows = math.ceil(count / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
  for ax, (key, group) in zip(axes.flat, sorted(panels.items(), key=lambda kv: str(kv[0]))):
    for name in path_names:
      points = sorted((r["batch"], r["median_us"]) for r in group
                      if r["path"] == name and _timed(r) and r["median_us"] > 0)
      if points:
        ax.plot(*zip(*points), marker="o", color=colors[name], label=name)
    floors = sorted({(r["batch"], r["floor_us"]) for r in group if r.get("floor_us")})
    if floors:
      ax.plot(*zip(*floors), linestyle="--", color="black", label="floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("µs per walk")
    shape, head, rank, w2, mode, steps = key
    ax.set_title(f"{shape} {head} r={rank} {w2} {mode} K={steps} (L2 {headline})",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
  for ax in list(axes.flat)[count:]:
    ax.set_visible(False)
  fig.suptitle(f"{results.get('device_kind')}: time per walk (jax "
               f"{results.get('jax_version')}, torch {results.get('torch_version')})",
               fontsize=10)
  fig.tight_layout()
  result_files.save_figure(fig, path, dpi=120)
  return True
