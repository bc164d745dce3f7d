"""The floor model's ceilings from dedicated microbenchmarks (GPU), and what the model
then predicts for the public int8 kernel's measured walks.

  python tools/floor_microbench.py [--out floor_microbench.json]

HBM and L2 read bandwidth from a streaming kernel, the exchange from the cheapest grid
barrier (``wts_jax.bench.microbench``), each beside the harness's own estimate (XLA
reductions, our kernel's exchange); then the floor at those ceilings for the public
int8 kernel's B = 1/4/16/64 walks (``floor.PUBLIC_INT8_US``). A prediction above a
measured figure means the model is wrong, not the kernel.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=None, help="results JSON path")
  parser.add_argument("--hbm-mb", type=int, default=2048)
  parser.add_argument("--l2-mb", type=int, default=24)
  parser.add_argument("--l2-passes", type=int, default=50)
  parser.add_argument("--rounds", type=int, default=256, help="barriers timed")
  args = parser.parse_args(argv)
  if jax.default_backend() != "gpu":
    print(f"error: needs a GPU (JAX backend is {jax.default_backend()!r})", file=sys.stderr)
    return 2
  from wts_jax import device
  from wts_jax.bench import floor, microbench
  sms = device.current().num_sms
  result = {"device_kind": device.current().kind, "jax_version": jax.__version__,
            "num_sms": sms}
  result["stream_hbm_gbps"] = microbench.stream_gbps(args.hbm_mb << 20, programs=4 * sms)
  result["stream_l2_gbps"] = microbench.stream_gbps(args.l2_mb << 20, programs=4 * sms,
                                                    passes=args.l2_passes)
  result["barrier_us"] = microbench.barrier_us(programs=sms, rounds=args.rounds)
  harness = floor.measure_ceilings(hbm_bytes=args.hbm_mb << 20, l2_bytes=args.l2_mb << 20)
  result["harness"] = {"hbm_gbps": harness.hbm_gbps, "l2_gbps": harness.l2_gbps,
                       "sync_us": harness.sync_us, "sync_source": harness.sync_source}
  ceilings = floor.Ceilings(
      hbm_gbps=max(result["stream_hbm_gbps"], harness.hbm_gbps),
      l2_gbps=max(result["stream_l2_gbps"], harness.l2_gbps),
      sync_us=min(result["barrier_us"], harness.sync_us), sync_source="microbenchmark")
  result["ceilings"] = ceilings.as_record()
  result["public_int8"] = {}
  for batch, measured in floor.PUBLIC_INT8_US.items():
    predicted = floor.public_int8_floor(ceilings, batch)
    result["public_int8"][batch] = {"measured_us": measured,
                                    "floor_us": predicted["floor_us"],
                                    "floor_hbm_us": predicted["floor_hbm_us"],
                                    "floor_sync_us": predicted["floor_sync_us"],
                                    "below_measured": predicted["floor_us"] <= measured}
  print(f"{result['device_kind']}: stream HBM {result['stream_hbm_gbps']:.0f} GB/s "
        f"(harness {harness.hbm_gbps:.0f}), stream L2 {result['stream_l2_gbps']:.0f} GB/s "
        f"(harness {harness.l2_gbps:.0f}), barrier {result['barrier_us']:.2f} µs "
        f"(harness {harness.sync_us:.2f}, {harness.sync_source})")
  for batch, row in result["public_int8"].items():
    print(f"public int8 B={batch:<3} measured {row['measured_us']:6.1f} µs, floor "
          f"{row['floor_us']:6.1f} µs (HBM {row['floor_hbm_us']:.1f} + sync "
          f"{row['floor_sync_us']:.1f}){'' if row['below_measured'] else '  MODEL WRONG'}")
  if args.out:
    with open(args.out, "w") as handle:
      json.dump(result, handle, indent=1)
  return 0 if all(row["below_measured"] for row in result["public_int8"].values()) else 1


if __name__ == "__main__":
  sys.exit(main())
