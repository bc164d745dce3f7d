"""The walk across devices: a head split along the vocabulary, walked where it lies.

``wts_jax.walk`` dispatches here when the head's W2 is split along V over a mesh axis
(its ``NamedSharding``, or ``vocab_axis=``); docs/sharded.md has the API and the design.
"""

from wts_jax.sharded.placement import Placement, placement
from wts_jax.sharded.walk import check_inputs, implementation, sharded_walk

__all__ = ["Placement", "check_inputs", "implementation", "placement", "sharded_walk"]
