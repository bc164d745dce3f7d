"""The benchmark's vocabulary shared by its CLI and its runner: the head dtypes, the
quantized W2s, and the usage error."""

from __future__ import annotations

DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
QUANTIZED = ("int8", "fp8")   # a bf16 head with W2 quantized per row (wts_jax.quantize)
# int8 W2 meeting z as two int8 planes (quantize_w2(..., state="planes"): int8 tensor cores)
QUANTIZED_PLANES = "int8p"


class UsageError(Exception):
  """A bad argument found after parsing (argparse's own are one line too, through
  ``wts_jax.command_line``): ``main`` prints ``error: ...`` on one line and returns 2."""
