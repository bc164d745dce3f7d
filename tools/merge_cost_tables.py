"""One TableTune cost table from several profiles of the same device + model that measured
different batch buckets (e.g. the 5-minute profile and a later run of the buckets it
skipped).

  python tools/merge_cost_tables.py --table a.json --table b.json --out merged.json

The tables must agree on device kind, target, drafter and draft lengths (their column
labels), and no bucket may be in two of them. The provenance keeps each part's own.
"""

from __future__ import annotations

import argparse
import os
import sys

from wts_jax.tabletune.cost_table import CostTable


def merge(tables: list[CostTable], paths: list[str]) -> CostTable:
  first = tables[0]
  for path, table in zip(paths, tables):
    key = (table.device_kind, table.target, table.drafter, table.draft_lens)
    if key != (first.device_kind, first.target, first.drafter, first.draft_lens):
      raise ValueError(f"--table={path!r} is for {key!r}, the first for "
                       f"{(first.device_kind, first.target, first.drafter, first.draft_lens)!r}")
  rows = {}
  for path, table in zip(paths, tables):
    for batch, row in zip(table.batches, table.seconds):
      if batch in rows:
        raise ValueError(f"batch {batch} of --table={path!r} is in an earlier table too")
      rows[batch] = row
  # (parts that were all measured make a measured table; the part's file by its name
  # only: where it lay on the machine that merged it says nothing)
  sources = {table.provenance.get("source") for table in tables}
  source = sources.pop() if len(sources) == 1 and None not in sources else "merged"
  return CostTable(device_kind=first.device_kind, target=first.target, drafter=first.drafter,
                   batches=tuple(sorted(rows)), draft_lens=first.draft_lens,
                   seconds=tuple(rows[b] for b in sorted(rows)),
                   provenance={"source": source,
                               "merged": True,
                               "parts": [{"path": os.path.basename(path),
                                          "batches": list(table.batches), **table.provenance}
                                         for path, table in zip(paths, tables)]})


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--table", action="append", required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  if len(args.table) < 2:
    parser.error(f"--table given {len(args.table)} time(s); merging needs >= 2")
  try:
    merged = merge([CostTable.load(path) for path in args.table], args.table)
  except (OSError, ValueError, KeyError) as err:
    parser.error(str(err))
  print(f"wrote {merged.save(args.out)} (batches {list(merged.batches)})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
