"""A TableTune cost table anchored to the H200's measured decode iterations.

  python tools/anchored_cost_table.py --e2e bench/results/h200_e2e_qwen3.json \
      --model qwen3_8b --out costs.json

``wts-e2e-bench`` measures, per batch, one iteration of plain autoregressive decoding
(K = 0) and one speculative iteration at K = 7 (persistent walk). This table takes those
two as they are and gives K = 1..6 the noise-free model's cost of the draft tokens
between K and 7, subtracted from the measured K = 7: c(B, K) = measured(B, 7) −
(model(B, 7) − model(B, K)). So the level is measured and only the marginal cost of a
draft token is modelled (the drafter's fixed cost is in both K = 1 and K = 7). The provenance says which entries are measured and which are anchored.
"""

from __future__ import annotations

import argparse
import json
import sys

from wts_jax.tabletune import cost_model
from wts_jax.tabletune.cost_table import CostTable


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--e2e", required=True)
  parser.add_argument("--model", required=True, help="qwen3_4b or qwen3_8b")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  report = json.load(open(args.e2e))
  rows = {r["batch"]: r for r in report["results"]
          if r["model"] == args.model and r["walk"] == "pallas"}
  if not rows:
    parser.error(f"--model {args.model!r}: no persistent-walk rows in {args.e2e}")
  batches = sorted(rows)
  steps = rows[batches[0]]["draft_len"]
  model = cost_model.modelled_cost_fn(args.model.replace("_", "-"))   # noise-free
  seconds = []
  for batch in batches:
    measured = rows[batch]
    seconds.append([measured["autoregressive_s"]]
                   + [measured["total_s"] - (model(batch, steps) - model(batch, k))
                      for k in range(1, steps + 1)])
  table = {
      "schema": "wts_jax.tabletune.cost_table/1",
      "device_kind": f"{report['device_kind']} (K = 0 and {steps} measured, "
                     f"1..{steps - 1} anchored)",
      "target": args.model.replace("_", "-"),
      "drafter": f"dspark-{args.model.replace('_', '-')}",
      "batches": batches, "draft_lens": list(range(steps + 1)), "seconds": seconds,
      "provenance": {"source": "anchored", "e2e": args.e2e,
                     "measured_draft_lens": [0, steps],
                     "anchored_draft_lens": list(range(1, steps)),
                     "jax_version": report["jax_version"]},
  }
  CostTable.from_json(table)   # the table loads as TableTune reads it
  with open(args.out, "w") as f:
    json.dump(table, f, indent=1)
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
