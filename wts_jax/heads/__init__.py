"""Flax NNX modules for the DSpark serial heads."""

from wts_jax.heads.base import SerialHead
from wts_jax.heads.confidence import ConfidenceHead
from wts_jax.heads.config import HEAD_TYPES, HeadConfig
from wts_jax.heads.draft_head import HEAD_CLASSES, DraftHead, make_head
from wts_jax.heads.layers import Embedding, Linear
from wts_jax.heads.markov import GatedMarkovHead, VanillaMarkovHead
from wts_jax.heads.recurrent import RecurrentHead, with_joint_hidden

__all__ = [
    "ConfidenceHead", "DraftHead", "Embedding", "GatedMarkovHead", "HEAD_CLASSES",
    "HEAD_TYPES", "HeadConfig", "Linear", "RecurrentHead", "SerialHead",
    "VanillaMarkovHead", "make_head", "with_joint_hidden",
]
