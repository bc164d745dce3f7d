"""The Pallas kernels (GPU). Submodules import their backend; this package does not."""


def measure_sync_latency_us(walks: int = 50) -> float:
  """The persistent kernel's measured per-step exchange cost (see ``sync_latency``)."""
  from wts_jax.pallas.sync_latency import measure_sync_latency_us as measure
  return measure(walks)
