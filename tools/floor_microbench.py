"""The harness's ceilings, source by source (GPU), and what the floor model then predicts
for the public int8 kernel's measured walks.

  python tools/floor_microbench.py [--out floor_microbench.json]

``floor.measure_ceilings`` takes the best of the XLA reductions and a streaming kernel
for HBM and L2 bandwidth, and of our kernel's step exchange and the bare grid barrier
(``wts_jax.bench.microbench``); this prints each source and the floor at the chosen
ceilings for the public int8 kernel's B = 1/4/16/64 walks (``floor.PUBLIC_INT8_US``).
A prediction above a measured figure means the model is wrong, not the kernel (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys

import jax

from wts_jax.bench.registry import gpu_reason


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=None, help="results JSON path")
  parser.add_argument("--hbm-mb", type=int, default=2048)
  parser.add_argument("--l2-mb", type=int, default=24)
  args = parser.parse_args(argv)
  reason = gpu_reason()
  if reason is not None:
    print(f"error: {reason}", file=sys.stderr)
    return 2
  from wts_jax import device
  from wts_jax.bench import floor
  ceilings = floor.measure_ceilings(hbm_bytes=args.hbm_mb << 20, l2_bytes=args.l2_mb << 20)
  result = {"device_kind": device.current().kind, "jax_version": jax.__version__,
            "num_sms": device.current().num_sms, "ceilings": ceilings.as_record(),
            "public_int8": floor.public_int8_check(ceilings)}
  sources = ceilings.details
  print(f"{result['device_kind']}: HBM {ceilings.hbm_gbps:.0f} GB/s (XLA "
        f"{sources['hbm_read_gbps']:.0f}, stream {sources.get('stream_hbm_gbps', 0):.0f}), "
        f"L2 {ceilings.l2_gbps:.0f} GB/s (XLA {sources['l2_chained_gbps']:.0f} / "
        f"{sources['l2_fused_gbps']:.0f}, stream {sources.get('stream_l2_gbps', 0):.0f}), "
        f"sync {ceilings.sync_us:.2f} µs ({ceilings.sync_source}; barrier "
        f"{sources.get('barrier_us', float('nan')):.2f})"
        + (f"; microbenchmarks failed: {sources['microbenchmark_error']}"
           if "microbenchmark_error" in sources else ""))
  for batch, row in result["public_int8"].items():
    print(f"public int8 B={batch:<3} measured {row['measured_us']:6.1f} µs, floor "
          f"{row['floor_us']:6.1f} µs{'' if row['below'] else '  MODEL WRONG'}")
  if args.out:
    with open(args.out, "w") as handle:
      json.dump(result, handle, indent=1)
  return 0 if all(row["below"] for row in result["public_int8"].values()) else 1


if __name__ == "__main__":
  sys.exit(main())
