"""TableTune's controller as two Pallas (Triton) kernels: ``choose`` and ``observe`` are
one launch each of one program, where the jax.numpy controller compiles to some thirty
small XLA kernels an iteration, each a launch of about a microsecond inside the decode
loop (docs/decisions.md, "The controller in two kernels").

The arithmetic is the reference's (``controller.TableTuneController``, the oracle and
the CPU path), on tiles padded to powers of two (Triton's tensor sizes): rows, draft
positions, draft lengths, buckets and cost cells beyond the real ones are masked. A value
at a traced index is a one-hot sum; the cumulative product is a loop over the (static)
draft positions. The state keeps the reference's shapes — the kernels load and store it
masked — so the two implementations share one state and are checked against each other
(tests/test_tabletune_controller_kernel.py, the kernels in Pallas interpret mode).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.special
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from wts_jax.tabletune import acceptance as acc
from wts_jax.tabletune.controller_state import NEVER_RUN, ControllerState

NUM_WARPS = 4
# A ``controller.TableTuneController`` (not imported: that module imports this one).
Controller = Any


def _pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class _Dims:
  """The real sizes and their power-of-two tiles."""

  rows: int
  positions: int      # K, the longest draft
  lens: tuple[int, ...]
  buckets: int

  @property
  def cells(self) -> int:
    return self.buckets * len(self.lens)


def _iota(n: int, axis: int = 0, ndim: int = 1):
  shape = [1] * ndim
  shape[axis] = n
  return jnp.arange(n, dtype=jnp.int32).reshape(shape)


def _load1(ref, n: int, other=0):
  i = _iota(_pow2(n))
  return plgpu.load(ref.at[i], mask=i < n, other=other)


def _store1(ref, n: int, value):
  i = _iota(_pow2(n))
  plgpu.store(ref.at[i], value, mask=i < n)


def _load2(ref, shape, other=0):
  r, c = _iota(_pow2(shape[0]), 0, 2), _iota(_pow2(shape[1]), 1, 2)
  return plgpu.load(ref.at[r, c], mask=(r < shape[0]) & (c < shape[1]), other=other)


def _store2(ref, shape, value):
  r, c = _iota(_pow2(shape[0]), 0, 2), _iota(_pow2(shape[1]), 1, 2)
  plgpu.store(ref.at[r, c], value, mask=(r < shape[0]) & (c < shape[1]))


def _take(tile, index, axis: int = 0):
  """``tile`` at a traced ``index`` along ``axis`` (a one-hot sum: exact); ``index`` may
  vary along the other axes (broadcast against the tile)."""
  hit = _iota(tile.shape[axis], axis, tile.ndim) == index
  return jnp.sum(jnp.where(hit, tile, 0), axis=axis)


def _argmax(vector):
  """jnp.argmax's answer (the first of equal maxima)."""
  n = vector.shape[0]
  return jnp.min(jnp.where(vector == jnp.max(vector), _iota(n), n))


def _where(cond, a, b):
  """jnp.where with Python numbers made typed constants first: the Triton lowering gives
  a select of two untyped literals its predicate's type."""
  def typed(x):
    return jnp.float32(x) if isinstance(x, float) else jnp.int32(x) if isinstance(x, int) else x
  return jnp.where(cond, typed(a), typed(b))


def _count(mask):
  return jnp.sum(_where(mask, 1, 0))


def _any(mask):
  return _count(mask) > 0


def _lens_vector(d: _Dims):
  """draft_lens as an int32 tile (0 beyond the real ones)."""
  i = _iota(_pow2(len(d.lens)))
  lens = jnp.zeros(i.shape, jnp.int32)
  for j, value in enumerate(d.lens):
    lens = jnp.where(i == j, value, lens)
  return lens


def _cumprod(p, positions: int):
  """The cumulative product along the last axis up to ``positions`` (0 beyond)."""
  col = _iota(p.shape[-1], p.ndim - 1, p.ndim)
  run = jnp.ones(p.shape[:-1], p.dtype)
  out = jnp.zeros_like(p)
  for q in range(positions):
    run = run * jnp.sum(jnp.where(col == q, p, 0.0), axis=-1)
    out = jnp.where(col == q, run[..., None] if p.ndim > 1 else run, out)
  return out


def _estimate(ctl: Controller, survived, reached, prior, w=None):
  """``acc.shifted_prior`` then ``acc.conditional_acceptance``: the batch's estimate (or,
  of the long-run counts with their prior weight ``w``, the population's)."""
  w = ctl.prior_weight if w is None else w
  logit = jax.scipy.special.logit
  prior = jnp.clip(prior, 0.02, 0.98)
  estimate = jnp.clip((survived + w * prior) / (reached + w), 0.02, 0.98)
  offset = (jnp.sum(reached * (logit(estimate) - logit(prior)))
            / jnp.maximum(jnp.sum(reached), 1e-6))
  shifted = jax.nn.sigmoid(logit(prior) + offset)
  return (survived + w * shifted) / (reached + w)


def _bucket(d: _Dims, batches, rows):
  """``cost_table.bucket_weights``: (lower bucket, its weight, the next one's)."""
  valid = _iota(batches.shape[0]) < d.buckets
  batch = jnp.maximum(rows.astype(jnp.float32), _take(batches, 0))
  at_or_below = _count(valid & (batches <= batch))
  lower = jnp.clip(at_or_below - 1, 0, d.buckets - 2)
  low, high = _take(batches, lower), _take(batches, lower + 1)
  fraction = (batch - low) / (high - low)
  return lower, 1.0 - fraction, fraction


class _CostRows(NamedTuple):
  """The two buckets the cost at the batch's rows interpolates: their weights, and each
  draft length's table seconds and exp(learnt error) in both ([lens] tiles)."""

  lower: jax.Array
  w_low: jax.Array
  w_high: jax.Array
  s_low: jax.Array
  s_high: jax.Array
  e_low: jax.Array
  e_high: jax.Array


def _cost_rows(d: _Dims, batches_ref, seconds_ref, error_ref, rows) -> _CostRows:
  lens_n = len(d.lens)
  seconds = _load2(seconds_ref, (d.buckets, lens_n), 0.0)              # [buckets, len]
  b, l = _iota(seconds.shape[0], 0, 2), _iota(seconds.shape[1], 1, 2)
  error = plgpu.load(error_ref.at[b * lens_n + l], mask=(b < d.buckets) & (l < lens_n),
                     other=0.0)
  lower, w_low, w_high = _bucket(d, _load1(batches_ref, d.buckets, 0.0), rows)
  factor = jnp.exp(error)
  return _CostRows(lower, w_low, w_high, _take(seconds, lower), _take(seconds, lower + 1),
                   _take(factor, lower), _take(factor, lower + 1))


def _rates(ctl: Controller, d: _Dims, upto, population_p, row_survived, row_reached, active,
           cost: _CostRows, real_len):
  """``TableTuneController._rates``: each row's expected tokens at every K (its counts
  shrunk to the long-run estimate), summed over the active rows, over the believed cost
  (-inf past the real draft lengths)."""
  w = ctl.row_prior_weight
  row_p = (row_survived + w * population_p[None, :]) / (row_reached + w)   # [rows, pos]
  row_s = _cumprod(row_p, d.positions)
  row_tokens = 1.0 + jnp.sum(upto[None] * row_s[:, None, :], axis=2)    # [rows, len]
  tokens = jnp.sum(jnp.where(active[:, None], row_tokens, 0.0), axis=0)
  seconds = jnp.maximum(cost.w_low * (cost.s_low * cost.e_low)
                        + cost.w_high * (cost.s_high * cost.e_high), 1e-9)
  return jnp.where(real_len, tokens / seconds, -jnp.inf)


def _log_cost_information(ctl: Controller, d: _Dims, cov_ref, cost: _CostRows, current):
  """``TableTuneController._log_cost_information`` against the K at index ``current``:
  (each K's log-cost standard deviation, what one measurement of it would tell)."""
  lens_n = len(d.lens)
  believed_low = cost.w_low * cost.s_low * cost.e_low
  believed_high = cost.w_high * cost.s_high * cost.e_high
  total = jnp.maximum(believed_low + believed_high, 1e-9)
  share_low, share_high = believed_low / total, believed_high / total
  cells, lens_p = _pow2(d.cells), share_low.shape[0]
  bb, ll, cc = _iota(_pow2(d.buckets), 0, 3), _iota(lens_p, 1, 3), _iota(cells, 2, 3)
  # The covariance rows of the lower and upper bucket's cells: [len, cells] each.
  cov = plgpu.load(cov_ref.at[bb * lens_n + ll, cc],
                   mask=(bb < d.buckets) & (ll < lens_n) & (cc < d.cells), other=0.0)
  cov_low, cov_high = _take(cov, cost.lower), _take(cov, cost.lower + 1)
  own = _iota(lens_p, 0, 2)
  cell_low, cell_high = cost.lower * lens_n + own, (cost.lower + 1) * lens_n + own

  def at(rows_tile, cell):
    return _take(rows_tile, cell, axis=1)

  own_var = jnp.maximum(
      share_low * at(cov_low, cell_low) * share_low + share_low * at(cov_low, cell_high)
      * share_high + share_high * at(cov_high, cell_low) * share_low
      + share_high * at(cov_high, cell_high) * share_high, 0.0)
  current_low = cost.lower * lens_n + current
  current_high = (cost.lower + 1) * lens_n + current
  share_current_low = _take(share_low, current)
  share_current_high = _take(share_high, current)
  covariance = (share_low * (at(cov_low, current_low) * share_current_low
                             + at(cov_low, current_high) * share_current_high)
                + share_high * (at(cov_high, current_low) * share_current_low
                                + at(cov_high, current_high) * share_current_high))
  information = jnp.abs(own_var - covariance) / jnp.sqrt(own_var + ctl.timing_sd ** 2)
  return jnp.sqrt(own_var), information


def _tokens_spread(ctl: Controller, d: _Dims, upto, batch_p, reached):
  """``TableTuneController._tokens_spread``: the batch estimate's binomial spread carried
  to each K's expected tokens (relative)."""
  p = jnp.clip(batch_p, 0.01, 0.99)
  var_p = p * (1.0 - p) / (reached + ctl.prior_weight + 1.0)
  survival = _cumprod(p, d.positions)
  later = _iota(p.shape[0], 2, 3) >= _iota(p.shape[0], 1, 3)            # [1, j, j']
  tail = jnp.sum(jnp.where(later, (upto * survival[None, :])[:, None, :], 0.0), axis=2)
  grad = upto * tail / p[None, :]
  tokens = 1.0 + jnp.sum(upto * survival[None, :], axis=1)
  return jnp.sqrt(jnp.sum(grad ** 2 * var_p[None, :], axis=1)) / tokens


def _choose_kernel(ctl: Controller, d: _Dims, has_new: bool, has_rows: bool, *refs):
  (batches_ref, seconds_ref, prior_ref, survived_ref, reached_ref, row_survived_ref,
   row_reached_ref, draft_len_ref, since_run_ref, probes_ref, error_ref, cov_ref, timed_ref,
   population_survived_ref, population_reached_ref, active_ref, *refs) = refs
  new_ref = refs.pop(0) if has_new else None
  rows_ref = refs.pop(0) if has_rows else None
  (k_out, draft_len_out, since_run_out, probes_out, survived_out, reached_out,
   row_survived_out, row_reached_out) = refs
  lens_n, big_k = len(d.lens), d.positions
  lens = _lens_vector(d)
  real_len = _iota(lens.shape[0]) < lens_n
  # (every input is read before the first store: the outputs alias them)
  active = _load1(active_ref, d.rows, False)
  survived, reached = _load1(survived_ref, big_k, 0.0), _load1(reached_ref, big_k, 0.0)
  row_survived = _load2(row_survived_ref, (d.rows, big_k), 0.0)
  row_reached = _load2(row_reached_ref, (d.rows, big_k), 0.0)
  draft_len, since_run = draft_len_ref[...], _load1(since_run_ref, lens_n, 0)
  probes, timed = probes_ref[...], timed_ref[...]
  if has_new:
    new = _load1(new_ref, d.rows, False)
    keep = _where(new, 0.0, 1.0)[:, None]
    # (the reference's fade: the batch's evidence by the share of new rows while K = 0)
    new_rows = _count(new & active)
    fade = jnp.where(draft_len == 0, 1.0 - new_rows.astype(jnp.float32)
                     / jnp.maximum(_count(active), 1).astype(jnp.float32),
                     1.0)
    row_survived, row_reached = keep * row_survived, keep * row_reached
    survived, reached = fade * survived, fade * reached
  rows = (rows_ref[...] if has_rows else _count(active)).astype(jnp.float32)
  prior = _load1(prior_ref, big_k, 0.0)
  batch_p = _estimate(ctl, survived, reached, prior)
  population_p = _estimate(ctl, _load1(population_survived_ref, big_k, 0.0),
                           _load1(population_reached_ref, big_k, 0.0), prior,
                           ctl.population_prior_weight)
  upto = _where(_iota(batch_p.shape[0], 1, 2) < lens[:, None], 1.0, 0.0)   # [len, pos]
  cost = _cost_rows(d, batches_ref, seconds_ref, error_ref, rows)
  rate = _rates(ctl, d, upto, population_p, row_survived, row_reached, active, cost,
                real_len)

  busy = _any(active)
  current = _argmax(_where(real_len & (lens == draft_len), 1, 0))
  best = _argmax(rate)
  switch = (_take(rate, best) > _take(rate, current) * (1.0 + ctl.hysteresis)) & busy
  index = jnp.where(switch, best, current)
  others = jnp.where(_iota(rate.shape[0]) == index, -jnp.inf, rate)
  runner_up = _argmax(others)
  losses = jnp.maximum(1.0 - others / jnp.maximum(_take(rate, index), 1e-30), 0.0)
  own_sd, information = _log_cost_information(ctl, d, cov_ref, cost, index)
  margin = ctl.explore_sd * information - losses
  doubtful = ((margin > 0) & (own_sd >= _take(own_sd, index)) & (others > -jnp.inf)
              & (timed > 0))
  doubt = _argmax(jnp.where(doubtful, margin, -jnp.inf))
  doubt_tokens = ctl.explore_sd * _tokens_spread(ctl, d, upto, batch_p, reached)
  due = ((_take(since_run, runner_up) + 1.0) * ctl.probe_budget
         >= jnp.maximum(_take(losses, runner_up) - _take(doubt_tokens, runner_up),
                        ctl.hysteresis))
  any_doubt = _any(doubtful)
  probe = busy & (any_doubt | due)
  runner_up = jnp.where(any_doubt, doubt, runner_up)
  chosen = jnp.where(probe, runner_up, index)
  k_out[...] = _take(lens, chosen)
  draft_len_out[...] = _take(lens, index)
  probes_out[...] = probes + probe.astype(jnp.int32)
  _store1(since_run_out, lens_n, jnp.where(_iota(lens.shape[0]) == chosen, 0,
                                           jnp.minimum(since_run + 1, NEVER_RUN)))
  _store1(survived_out, big_k, survived)
  _store1(reached_out, big_k, reached)
  _store2(row_survived_out, (d.rows, big_k), row_survived)
  _store2(row_reached_out, (d.rows, big_k), row_reached)


def _dims(ctl: Controller, rows: int) -> _Dims:
  return _Dims(rows=rows, positions=ctl.max_draft_len, lens=tuple(ctl.draft_lens),
               buckets=ctl.seconds.shape[0])


def choose(ctl: Controller, state: ControllerState, active, new_request=None,
           rows=None, *, interpret: bool = False):
  """``TableTuneController.choose`` in one kernel launch."""
  d = _dims(ctl, active.shape[0])
  i32, f32 = jnp.int32, jnp.float32
  operands = [ctl.batches, ctl.seconds, ctl.prior, state.counts.survived, state.counts.reached,
              state.row_counts.survived, state.row_counts.reached,
              jnp.asarray(state.draft_len, i32), state.since_run, jnp.asarray(state.probes, i32),
              state.cost_error, state.cost_cov, jnp.asarray(state.timed, i32),
              state.population.survived, state.population.reached,
              jnp.asarray(active, bool)]
  if new_request is not None:
    operands.append(jnp.asarray(new_request, bool))
  if rows is not None:
    operands.append(jnp.asarray(rows, i32))
  scalar = jax.ShapeDtypeStruct((), i32)
  out_shape = (scalar, scalar, jax.ShapeDtypeStruct(state.since_run.shape, i32), scalar,
               jax.ShapeDtypeStruct(state.counts.survived.shape, f32),
               jax.ShapeDtypeStruct(state.counts.reached.shape, f32),
               jax.ShapeDtypeStruct(state.row_counts.survived.shape, f32),
               jax.ShapeDtypeStruct(state.row_counts.reached.shape, f32))
  kernel = lambda *refs: _choose_kernel(ctl, d, new_request is not None, rows is not None,
                                        *refs)
  (k, draft_len, since_run, probes, survived, reached, row_survived,
   row_reached) = pl.pallas_call(
       kernel, out_shape=out_shape, interpret=interpret, name="tabletune_choose",
       # The state is updated in place: in the decode loop's carry, not copied into it.
       input_output_aliases={7: 1, 8: 2, 9: 3, 3: 4, 4: 5, 5: 6, 6: 7},
       compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS))(*operands)
  state = state._replace(
      counts=acc.AcceptanceCounts(survived, reached),
      row_counts=acc.AcceptanceCounts(row_survived, row_reached),
      draft_len=draft_len, probes=probes, since_run=since_run)
  return k, jnp.full(active.shape, k, i32), state


def _observe_kernel(ctl: Controller, d: _Dims, has_measured: bool, *refs):
  (prior_ref, survived_ref, reached_ref, row_survived_ref, row_reached_ref, drift_up_ref,
   drift_down_ref, residual_var_ref, drifts_ref, k_ref, accepted_ref, active_ref,
   population_survived_ref, population_reached_ref, *refs) = refs
  if has_measured:
    (batches_ref, seconds_ref, error_ref, cov_ref, drift_cov_ref, timed_ref,
     measured_seconds_ref, measured_k_ref, measured_rows_ref, *refs) = refs
  (survived_out, reached_out, row_survived_out, row_reached_out, drift_up_out,
   drift_down_out, residual_var_out, drifts_out, population_survived_out,
   population_reached_out, *refs) = refs
  big_k = d.positions
  k = k_ref[...]
  drafted = k > 0
  survived, reached = _load1(survived_ref, big_k, 0.0), _load1(reached_ref, big_k, 0.0)
  batch_p = _estimate(ctl, survived, reached, _load1(prior_ref, big_k, 0.0))
  position = _iota(batch_p.shape[0])
  survival = _cumprod(batch_p, big_k)
  predicted = (1.0 + jnp.sum(jnp.where(position < jnp.clip(k, 0, big_k), survival, 0.0))
               ) - 1.0
  active = _load1(active_ref, d.rows, False)
  accepted = _load1(accepted_ref, d.rows, 0)
  shape = (d.rows, big_k)
  # (every aliased input is read before its output's store)
  old_row_survived = _load2(row_survived_ref, shape, 0.0)
  old_row_reached = _load2(row_reached_ref, shape, 0.0)
  residual_var = residual_var_ref[...]
  drift_up_old, drift_down_old = drift_up_ref[...], drift_down_ref[...]
  drifts = drifts_ref[...]
  n_active = jnp.maximum(_count(active), 1).astype(jnp.float32)
  residual = (jnp.sum(jnp.where(active, accepted, 0)).astype(jnp.float32) / n_active
              - predicted)
  # (``acc.accepted_variance`` of one row at K: the floor of the spread)
  mean_a = jnp.sum(jnp.where(position < k, survival, 0.0))
  row_var = (jnp.sum(jnp.where(position < k, (2.0 * position.astype(jnp.float32) + 1.0)
                               * survival, 0.0)) - mean_a ** 2)
  standardized = residual / jnp.sqrt(jnp.maximum(residual_var, row_var) / n_active + 1e-6)
  drift_up = jnp.maximum(0.0, drift_up_old + standardized - ctl.drift_delta)
  drift_down = jnp.maximum(0.0, drift_down_old - standardized - ctl.drift_delta)
  drift = drafted & ((drift_up > ctl.drift_threshold) | (drift_down > ctl.drift_threshold))
  keep = _where(drift, ctl.drift_keep, 1.0)
  decay = _where(drafted, ctl.decay, 1.0) * keep
  pos = _iota(batch_p.shape[0], 1, 2)
  row_accepted = accepted[:, None]
  live = active[:, None]
  row_reached = _where((pos < k) & (pos <= row_accepted) & live, 1.0, 0.0)
  row_survived = _where((pos < jnp.minimum(row_accepted, k)) & live, 1.0, 0.0)
  new_survived = decay * survived + jnp.sum(row_survived, axis=0)
  new_reached = decay * reached + jnp.sum(row_reached, axis=0)
  _store1(survived_out, big_k, new_survived)
  _store1(reached_out, big_k, new_reached)
  # (the long-run counts: slow forgetting, and after a shift the recent evidence)
  population_decay = _where(drafted, ctl.population_decay, 1.0)
  population_survived = (population_decay * _load1(population_survived_ref, big_k, 0.0)
                         + jnp.sum(row_survived, axis=0))
  population_reached = (population_decay * _load1(population_reached_ref, big_k, 0.0)
                        + jnp.sum(row_reached, axis=0))
  _store1(population_survived_out, big_k, jnp.where(drift, new_survived, population_survived))
  _store1(population_reached_out, big_k, jnp.where(drift, new_reached, population_reached))
  row_decay = jnp.where(active & drafted, ctl.row_decay * keep, 1.0)[:, None]
  _store2(row_survived_out, shape, row_decay * old_row_survived + row_survived)
  _store2(row_reached_out, shape, row_decay * old_row_reached + row_reached)
  new_var = ((1.0 - ctl.residual_weight) * residual_var
             + ctl.residual_weight * jnp.minimum(n_active * residual ** 2,
                                                 4.0 * residual_var + 1.0))
  drift_up_out[...] = jnp.where(drift, 0.0, jnp.where(drafted, drift_up, drift_up_old))
  drift_down_out[...] = jnp.where(drift, 0.0, jnp.where(drafted, drift_down, drift_down_old))
  residual_var_out[...] = jnp.where(drafted, new_var, residual_var)
  drifts_out[...] = drifts + drift.astype(jnp.int32)
  if has_measured:
    _fold_in_cost(ctl, d, batches_ref, seconds_ref, error_ref, cov_ref, drift_cov_ref,
                  timed_ref, measured_seconds_ref, measured_k_ref, measured_rows_ref, *refs)


def _fold_in_cost(ctl, d: _Dims, batches_ref, seconds_ref, error_ref, cov_ref, drift_cov_ref,
                  timed_ref, measured_seconds_ref, measured_k_ref, measured_rows_ref,
                  error_out, cov_out, timed_out):
  """``TableTuneController._fold_in_cost``: one Kalman update of the cells' log errors."""
  lens_n, cells = len(d.lens), d.cells
  lens = _lens_vector(d)
  seconds = measured_seconds_ref[...]
  k = measured_k_ref[...]
  real_len = _iota(lens.shape[0]) < lens_n
  column = jnp.clip(_count(real_len & (lens < k)), 0, lens_n - 1)
  valid = jnp.isfinite(seconds) & (seconds > 0) & (_take(lens, column) == k)
  lower, w_low, w_high = _bucket(d, _load1(batches_ref, d.buckets, 0.0), measured_rows_ref[...])
  cell_low, cell_high = lower * lens_n + column, (lower + 1) * lens_n + column
  table = _load1(seconds_ref, cells, 0.0)
  error = _load1(error_ref, cells, 0.0)
  part_low = w_low * _take(table, cell_low) * jnp.exp(_take(error, cell_low))
  part_high = w_high * _take(table, cell_high) * jnp.exp(_take(error, cell_high))
  predicted = jnp.maximum(part_low + part_high, 1e-9)
  share_low, share_high = part_low / predicted, part_high / predicted
  relax = _where(valid, ctl.cost_relax, 0.0)
  shape = (cells, cells)
  cov = (1.0 - relax) * _load2(cov_ref, shape, 0.0) + relax * _load2(drift_cov_ref, shape, 0.0)
  cov_share = (_take(cov, cell_low, axis=1) * share_low
               + _take(cov, cell_high, axis=1) * share_high)
  innovation_var = (share_low * _take(cov_share, cell_low)
                    + share_high * _take(cov_share, cell_high) + ctl.timing_sd ** 2)
  spread = jnp.sqrt(innovation_var)
  innovation = jnp.clip(jnp.log(jnp.where(valid, seconds, 1.0)) - jnp.log(predicted),
                        -3.0 * spread, 3.0 * spread)
  gain = jnp.where(valid, cov_share / innovation_var, 0.0)
  _store1(error_out, cells, error + gain * innovation)
  _store2(cov_out, shape, cov - gain[:, None] * cov_share[None, :])
  timed_out[...] = timed_ref[...] + valid.astype(jnp.int32)


def observe(ctl: Controller, state: ControllerState, k, accepted, active,
            measured=None, *, interpret: bool = False) -> ControllerState:
  """``TableTuneController.observe`` in one kernel launch."""
  d = _dims(ctl, active.shape[0])
  i32, f32 = jnp.int32, jnp.float32
  operands = [ctl.prior, state.counts.survived, state.counts.reached,
              state.row_counts.survived, state.row_counts.reached,
              jnp.asarray(state.drift_up, f32), jnp.asarray(state.drift_down, f32),
              jnp.asarray(state.residual_var, f32), jnp.asarray(state.drifts, i32),
              jnp.asarray(k, i32), jnp.asarray(accepted, i32), jnp.asarray(active, bool),
              state.population.survived, state.population.reached]
  scalar_f, scalar_i = jax.ShapeDtypeStruct((), f32), jax.ShapeDtypeStruct((), i32)
  out_shape = [jax.ShapeDtypeStruct(state.counts.survived.shape, f32),
               jax.ShapeDtypeStruct(state.counts.reached.shape, f32),
               jax.ShapeDtypeStruct(state.row_counts.survived.shape, f32),
               jax.ShapeDtypeStruct(state.row_counts.reached.shape, f32),
               scalar_f, scalar_f, scalar_f, scalar_i,
               jax.ShapeDtypeStruct(state.population.survived.shape, f32),
               jax.ShapeDtypeStruct(state.population.reached.shape, f32)]
  if measured is not None:
    operands += [ctl.batches, ctl.seconds.reshape(-1), state.cost_error, state.cost_cov,
                 ctl.cost_prior(drift=True), jnp.asarray(state.timed, i32),
                 jnp.asarray(measured.seconds, f32), jnp.asarray(measured.draft_len, i32),
                 jnp.asarray(measured.rows, i32)]
    out_shape += [jax.ShapeDtypeStruct(state.cost_error.shape, f32),
                  jax.ShapeDtypeStruct(state.cost_cov.shape, f32), scalar_i]
  kernel = lambda *refs: _observe_kernel(ctl, d, measured is not None, *refs)
  aliases = {1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 5, 7: 6, 8: 7, 12: 8, 13: 9}
  if measured is not None:
    aliases.update({16: 10, 17: 11, 19: 12})
  out = pl.pallas_call(kernel, out_shape=tuple(out_shape), interpret=interpret,
                       name="tabletune_observe", input_output_aliases=aliases,
                       compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS))(*operands)
  (survived, reached, row_survived, row_reached, drift_up, drift_down, residual_var,
   drifts, population_survived, population_reached) = out[:10]
  state = state._replace(
      counts=acc.AcceptanceCounts(survived, reached),
      row_counts=acc.AcceptanceCounts(row_survived, row_reached),
      drift_up=drift_up, drift_down=drift_down, residual_var=residual_var, drifts=drifts,
      population=acc.AcceptanceCounts(population_survived, population_reached))
  if measured is not None:
    state = state._replace(cost_error=out[10], cost_cov=out[11], timed=out[12])
  return state
