"""The Pallas kernels (GPU). Submodules import their backend; this package does not."""
