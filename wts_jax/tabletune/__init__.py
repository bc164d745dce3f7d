"""TableTune: profiled draft-length tables and a live controller for the decode loop.

``profile_costs`` measures c(B, K); ``best_draft_len`` gives K*(B) for an acceptance
profile; ``TableTuneController`` is a ``DraftPolicy`` that re-derives K every iteration
from the table and the live acceptance; ``wts-tabletune`` is the command line.
"""

from wts_jax.tabletune.controller import TableTuneController
from wts_jax.tabletune.cost_table import CostTable
from wts_jax.tabletune.profile import profile_costs
from wts_jax.tabletune.table import best_draft_len

__all__ = ["CostTable", "TableTuneController", "best_draft_len", "profile_costs"]
