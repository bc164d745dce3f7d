"""``wts-bench`` with the kernel's tuning variants registered as extra paths.

  python tools/bench_variants.py --paths wts,wts-triton,wts-m-r4s3,... [wts-bench args]

``wts-triton`` is the Triton kernel; ``wts-m-r{R}s{S}`` the Mosaic GPU kernel with R
resident 64-row chunks per block and an S-slot TMA ring; ``wts-mw-r{R}s{S}`` the same
with its GEMV on tensor cores (WGMMA). Development sweeps only: the
paths every report compares are registered in ``wts_jax.bench.paths``.
"""

import sys

from wts_jax.bench import cli, paths

# bf16 W2 fits at most 6 slots per block at the Qwen3 shape; int8 (16 KB chunks) 13.
MOSAIC_SPLITS = ((3, 3), (4, 2), (6, 1), (2, 4), (0, 6), (0, 3), (6, 0), (9, 3), (10, 2))


def register_variants():
  if "wts-triton" not in paths.PATHS:
    paths.register_path("wts-triton", paths.available_wts,
                        paths._wts_variant(backend="triton"),
                        description="the persistent Triton kernel")
  for prefix, gemv, label in (("wts-m", "registers", "register GEMV"),
                              ("wts-mw", "wgmma", "WGMMA GEMV (NOTES v5)")):
    for resident, stages in MOSAIC_SPLITS:
      name = f"{prefix}-r{resident}s{stages}"
      if name not in paths.PATHS:
        paths.register_path(
            name, paths.available_wts,
            paths._wts_variant(backend="mosaic", mosaic_gemv=gemv,
                               residency=resident * 64, num_stages=stages),
            description=f"Mosaic kernel, {label}, {resident} resident chunks, "
                        f"{stages}-slot ring")


if __name__ == "__main__":
  register_variants()
  sys.exit(cli.main(sys.argv[1:]))
