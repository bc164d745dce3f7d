"""The TableTune controller's state: what ``choose`` and ``observe`` carry from one
iteration of the decode loop to the next (the jax.numpy controller and its kernels
share it)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from wts_jax.tabletune import acceptance as acc

NEVER_RUN = 1 << 20   # ``since_run`` of a draft length not run yet


class ControllerState(NamedTuple):
  counts: acc.AcceptanceCounts       # [K]: the batch's censored counts
  row_counts: acc.AcceptanceCounts   # [B, K]: each row's (its request's) counts
  draft_len: jnp.ndarray             # int32: the K in use (a probe does not change it)
  drift_up: jnp.ndarray              # f32: Page-Hinkley sums (standard errors)
  drift_down: jnp.ndarray
  residual_var: jnp.ndarray          # f32: EMA of rows x the squared residual (tokens^2)
  drifts: jnp.ndarray                # int32: shifts detected so far
  since_run: jnp.ndarray             # [len(draft_lens)] int32: iterations since each K ran
  probes: jnp.ndarray                # int32: probe iterations so far
  cost_error: jnp.ndarray            # [cells] f32: log(true / table) of each cell, mean
  cost_cov: jnp.ndarray              # [cells, cells] f32: its covariance
  timed: jnp.ndarray                 # int32: measured iterations folded in
  population: acc.AcceptanceCounts   # [K]: the traffic's long-run counts (slow forgetting)
