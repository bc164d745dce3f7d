"""End-to-end speculative decoding: a Qwen3 target, the DSpark drafter, the walk,
verification, one jitted decode loop."""

from wts_jax.spec.policy import DraftPolicy, FixedDraftLength, as_policy

__all__ = ["DraftPolicy", "FixedDraftLength", "as_policy"]
