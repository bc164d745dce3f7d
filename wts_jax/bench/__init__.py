"""The benchmark harness (``wts-bench``): every path side by side, with the floor model.

``cli`` (the arguments and the grid), ``runner`` (runs the grid, writes the JSON),
``registry`` + ``paths`` (the walk implementations compared: ``jax_paths``,
``torch_paths``), ``gate`` (every path's tokens against the reference), ``timing`` (the
chained-walk device time; ``timing.METHOD`` states the method), ``flush`` (the L2 flush
step), ``floor`` (the ceilings and the floor model), ``report`` (tables, JSON, plot).
"""

from wts_jax.bench.paths import (PATHS, BenchMode, Prepared, SkipPath, jax_prepared,
                                 register_path, unregister_path)
from wts_jax.bench.timing import METHOD

__all__ = ["METHOD", "PATHS", "BenchMode", "Prepared", "SkipPath", "jax_prepared",
           "register_path", "unregister_path"]
