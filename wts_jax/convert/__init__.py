"""Converting DeepSpec Qwen3 DSpark/DFlash drafter checkpoints (PyTorch) to wts_jax.

``convert(src, dst)`` writes an orbax directory that ``wts_jax.load`` reads;
``inspect_checkpoint(src)`` reports what a checkpoint holds and whether it converts;
the ``wts-convert`` console script (``wts_jax.convert.cli``) wraps both. Every refusal
raises ``ConversionError`` naming the key, file or config value; ``wts_jax.load`` raises
its subclass ``CheckpointError`` for a damaged or edited converted directory.
"""

from wts_jax.convert.converter import convert
from wts_jax.convert.drafter_config import DrafterConfig, parse_config
from wts_jax.convert.errors import CheckpointError, ConversionError
from wts_jax.convert.report import inspect_checkpoint

__all__ = ["CheckpointError", "ConversionError", "DrafterConfig", "convert",
           "inspect_checkpoint", "parse_config"]
