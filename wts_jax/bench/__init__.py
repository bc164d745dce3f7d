"""The benchmark harness (``wts-bench``): every path side by side, with the floor model.

``paths`` (the registry of walk implementations and the correctness gate), ``timing``
(device time per walk; ``timing.METHOD`` states the method), ``floor`` (the ceilings and
the floor model), ``report`` (tables, JSON, plot), ``cli`` (the grid).
"""

from wts_jax.bench.paths import (PATHS, BenchMode, Prepared, SkipPath, jax_prepared,
                                 register_path, unregister_path)
from wts_jax.bench.timing import METHOD

__all__ = ["METHOD", "PATHS", "BenchMode", "Prepared", "SkipPath", "jax_prepared",
           "register_path", "unregister_path"]
