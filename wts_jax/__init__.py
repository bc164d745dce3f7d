"""wts_jax: Weights That Stay — the serial head of parallel drafters as one persistent kernel.

Public surface: ``walk`` and its ``WalkOutput``, the heads (and ``head_from_arrays``, a
head over an engine's arrays), the kernels' configs (``TritonConfig``, ``MosaicRowConfig``,
``MosaicBatchedConfig``, ``MosaicStackedConfig``), ``load``. A head split along the
vocabulary over several devices is walked split (``wts_jax.sharded``; docs/sharded.md).
"""

from wts_jax.api import chosen_implementation, walk
from wts_jax.convert.errors import CheckpointError, ConversionError
from wts_jax.derived import stale_copies, with_fresh_copies
from wts_jax.gate_table import with_gate_table
from wts_jax.joint_table import with_joint_table
from wts_jax.launch_options import KERNEL_COMPILER_OPTIONS
from wts_jax.heads import (DraftHead, GatedMarkovHead, HeadConfig, RecurrentHead,
                           VanillaMarkovHead, make_head, with_joint_hidden)
from wts_jax.heads.engine import head_from_arrays
from wts_jax.loading import DrafterWeights, from_torch_state_dict, load, load_drafter
from wts_jax.output import WalkError, WalkOutput, check
from wts_jax.quantize import quantize_w2
from wts_jax.walk_config import (MosaicBatchedConfig, MosaicRowConfig, MosaicStackedConfig,
                                 TritonConfig)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "ConversionError", "DrafterWeights", "KERNEL_COMPILER_OPTIONS",
    "from_torch_state_dict", "load", "load_drafter",
    "quantize_w2", "stale_copies", "with_fresh_copies", "with_gate_table",
    "with_joint_hidden", "with_joint_table",
    "DraftHead", "GatedMarkovHead", "HeadConfig", "RecurrentHead", "VanillaMarkovHead",
    "MosaicBatchedConfig", "MosaicRowConfig", "MosaicStackedConfig", "TritonConfig",
    "WalkError", "WalkOutput", "chosen_implementation", "check",
    "head_from_arrays", "make_head", "walk",
]
