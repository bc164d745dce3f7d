"""XLA options for an executable that launches the persistent Mosaic GPU kernel.

Why: XLA's GPU runtime puts custom calls into command buffers (CUDA graphs) by default,
and records the Mosaic kernel's call into the graph again on every execution of the
executable; the device waits meanwhile: on the H200 that host time per walk exceeded the
int8 walk's whole kernel (docs/decisions.md, "No custom calls in command buffers").
Without custom calls in
command buffers the launch is a plain stream launch.

Pass ``KERNEL_COMPILER_OPTIONS`` to the executable that calls ``wts_jax.walk``:
``jax.jit(decode_step, compiler_options=wts_jax.KERNEL_COMPILER_OPTIONS)``, or set
``XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUDNN`` for the
process.
"""

from __future__ import annotations

# Command buffers for fusions and library calls, not for custom calls.
COMMAND_BUFFERS_WITHOUT_CUSTOM_CALLS = "FUSION,CUBLAS,CUBLASLT,CUDNN"
KERNEL_COMPILER_OPTIONS = {"xla_gpu_enable_command_buffer":
                           COMMAND_BUFFERS_WITHOUT_CUSTOM_CALLS}
# No command buffers at all: every op a plain stream launch (measured beside the above).
NO_COMMAND_BUFFERS = {"xla_gpu_enable_command_buffer": ""}
# Weight products unmerged: XLA's dot merger joins the products that share an input (the
# drafter's per-layer context keys and values), and a merged product reads its weights
# from a concatenated copy made at every call, on cuBLAS and Triton alike. The
# speculative loop compiles with these at every batch size.
UNMERGED_PRODUCTS = {"xla_gpu_dot_merger_threshold_mb": 0}
# Every weight product on cuBLAS (XLA's Triton GEMMs off), unmerged. The speculative loop
# compiles with these from ``specdecode.loop.CUBLAS_MIN_BATCH`` rows on.
CUBLAS_PRODUCTS = {"xla_gpu_enable_triton_gemm": False, **UNMERGED_PRODUCTS}
