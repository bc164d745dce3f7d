"""The censored online acceptance estimator."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.tabletune import acceptance as acc


def test_full_block_is_censored_not_a_rejection():
  # Row 0 accepted its whole block of 2; row 1 rejected position 1.
  reached, survived = acc.block_outcomes(2, jnp.array([2, 1]), 4)
  np.testing.assert_array_equal(reached, [[1, 1, 0, 0], [1, 1, 0, 0]])
  np.testing.assert_array_equal(survived, [[1, 1, 0, 0], [1, 0, 0, 0]])


def test_inactive_rows_and_per_row_drafted_lengths():
  reached, survived = acc.block_outcomes(jnp.array([3, 1, 3]), jnp.array([0, 1, 3]), 3,
                                         jnp.array([True, True, False]))
  np.testing.assert_array_equal(reached, [[1, 0, 0], [1, 0, 0], [0, 0, 0]])
  np.testing.assert_array_equal(survived, [[0, 0, 0], [1, 0, 0], [0, 0, 0]])


def _simulate_blocks(profile, drafted, rows, seed):
  rng = np.random.default_rng(seed)
  outcomes = rng.random((rows, len(profile))) < profile
  leading = np.cumprod(outcomes, axis=1).sum(1)
  return np.minimum(leading, drafted)


def test_censoring_recovers_the_profile_where_naive_counting_is_biased():
  profile = np.array([0.9, 0.85, 0.8, 0.75, 0.7, 0.6])
  drafted = np.random.default_rng(1).choice([2, 6], size=40_000)
  accepted = _simulate_blocks(profile, drafted, drafted.size, seed=2)
  estimate = acc.fit_profile(accepted, drafted, 6)
  np.testing.assert_allclose(estimate, profile, atol=0.015)
  # Counting a fully accepted short block as a rejection at position k underestimates.
  naive_reached = (np.arange(6) <= accepted[:, None]).sum(0)
  naive_survived = (np.arange(6) < accepted[:, None]).sum(0)
  assert naive_survived[2] / naive_reached[2] < profile[2] - 0.1


def test_expected_tokens_matches_monte_carlo():
  profile = np.array([0.8, 0.7, 0.9, 0.5])
  tokens = acc.expected_tokens(profile)
  assert tokens[0] == 1.0 and tokens.shape == (5,)
  for k in range(5):
    accepted = _simulate_blocks(profile, k, 100_000, seed=k)
    assert tokens[k] == pytest.approx(1 + accepted.mean(), abs=0.02)
  # jnp in, jnp out, batched
  batched = acc.expected_tokens(jnp.asarray(np.stack([profile, profile])))
  assert isinstance(batched, jax.Array) and batched.shape == (2, 5)


def test_forgetting_follows_a_shift():
  counts = acc.empty_counts((3,))
  for accepted in [3] * 200:  # everything accepted
    counts = acc.update(counts, 3, jnp.array([accepted]), decay=0.9)
  for _ in range(60):  # then everything rejected at position 0
    counts = acc.update(counts, 3, jnp.array([0]), decay=0.9)
  p = acc.conditional_acceptance(counts, 0.5, 1.0)
  assert float(p[0]) < 0.05


def test_shifted_prior_lifts_unobserved_positions_to_the_observed_level():
  # Only 3 positions drafted, all at a high level; the prior says low everywhere.
  prior = np.array([0.6, 0.55, 0.5, 0.45, 0.4])
  truth = np.array([0.9, 0.88, 0.86, 0.84, 0.82])
  accepted = _simulate_blocks(truth, 3, 5000, seed=4)
  counts = acc.update(acc.empty_counts((5,)), 3, jnp.asarray(accepted))
  shifted = np.asarray(acc.shifted_prior(counts, prior, 4.0))
  assert np.all(np.diff(shifted) < 0)  # the prior's shape is kept
  np.testing.assert_allclose(shifted[3:], truth[3:], atol=0.05)
  estimate = np.asarray(acc.conditional_acceptance(counts, shifted, 4.0))
  np.testing.assert_allclose(estimate, truth, atol=0.05)
  # No evidence: the prior itself.
  np.testing.assert_allclose(acc.shifted_prior(acc.empty_counts((5,)), prior, 4.0), prior,
                             rtol=1e-5)


def test_one_block_moves_the_shifted_prior_by_one_blocks_worth():
  """A single rejected block at position 0 must not drag every position to the floor."""
  prior = np.full(5, 0.75)
  counts = acc.update(acc.empty_counts((5,)), 6, jnp.array([0]))
  shifted = np.asarray(acc.shifted_prior(counts, prior, 12.0))
  assert np.all(shifted > 0.65) and np.all(shifted < 0.75)
