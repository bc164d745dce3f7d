"""End-to-end speculative decoding: a Qwen3 target, the DSpark drafter, the walk,
verification, one jitted decode loop (see docs/e2e.md)."""

from wts_jax.specdecode.dspark import DSparkConfig, DSparkDrafter, load_dspark, make_dspark
from wts_jax.specdecode.autoregressive import decode_autoregressive
from wts_jax.specdecode.generate_output import GenerateError, GenerateOutput
from wts_jax.specdecode.loop import generate
from wts_jax.specdecode.policy import DraftPolicy, FixedDraftLength, as_policy
from wts_jax.specdecode.qwen3 import KVCache, Qwen3, Qwen3Config, load_qwen3, make_qwen3
from wts_jax.specdecode.timing import iteration_cost

__all__ = [
    "DSparkConfig", "DSparkDrafter", "DraftPolicy", "FixedDraftLength", "GenerateError",
    "GenerateOutput", "KVCache", "Qwen3", "Qwen3Config", "as_policy",
    "decode_autoregressive", "generate", "iteration_cost", "load_dspark", "load_qwen3",
    "make_dspark", "make_qwen3",
]
