"""Verification rules and the per-row commit on hand-made inputs."""

import jax
import jax.numpy as jnp
import numpy as np

from wts_jax.specdecode.verify import commit, verify_greedy, verify_sampling

NO_EOS = jnp.array([-1], jnp.int32)


def one_hot_logits(tokens, vocab=8):
  return jnp.where(jax.nn.one_hot(jnp.asarray(tokens), vocab) > 0, 5.0, 0.0)


def test_greedy_accepts_the_matching_prefix_then_the_targets_token():
  target = one_hot_logits([[3, 4, 5, 6], [3, 4, 5, 6], [3, 4, 5, 6]])
  draft = jnp.array([[3, 4, 1], [2, 4, 5], [3, 4, 5]])
  accepted, bonus = verify_greedy(draft, target, jnp.array([3, 3, 1]))
  assert accepted.tolist() == [2, 0, 1]          # row 2 capped at one draft
  assert bonus.tolist() == [5, 3, 4]


def test_sampling_accepts_everything_when_draft_equals_target_and_honours_caps():
  logits = jax.random.normal(jax.random.key(0), (2, 4, 8))
  draft = jnp.argmax(logits[:, :3], -1)
  accepted, bonus = verify_sampling(draft, logits[:, :3], logits, 1.0, jax.random.key(1),
                                    jnp.array([3, 2]))
  assert accepted.tolist() == [3, 2]
  assert bonus.shape == (2,) and bonus.dtype == jnp.int32


def test_sampling_rejects_tokens_the_target_cannot_produce_and_resamples_off_them():
  target = jnp.where(jnp.arange(8) == 6, -1e9, 0.0)[None, None].repeat(3, 1)  # p(6) = 0
  draft_logits = jnp.where(jnp.arange(8) == 6, 10.0, 0.0)[None, None].repeat(2, 1)
  draft = jnp.array([[6, 6]])
  for seed in range(5):
    accepted, bonus = verify_sampling(draft, draft_logits, target, 1.0,
                                      jax.random.key(seed), jnp.array([2]))
    assert int(accepted[0]) == 0 and int(bonus[0]) != 6


def test_commit_cuts_at_eos_mid_block_and_at_the_budget():
  draft = jnp.array([[1, 7, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])
  accepted = jnp.array([4, 4, 2, 4])
  bonus = jnp.array([5, 5, 6, 5])
  length = jnp.array([10, 20, 30, 40])
  generated = jnp.array([1, 1, 1, 8])
  active = jnp.array([True, True, True, False])
  done = commit(draft, accepted, bonus, length, generated, active, 9,
                jnp.array([7], jnp.int32))
  assert done.count.tolist() == [2, 5, 3, 0]       # EOS kept; row 3 already finished
  assert done.finished.tolist() == [True, False, False, False]
  assert done.tokens[2, :3].tolist() == [1, 2, 6]  # the bonus after the accepted prefix
  assert done.new_length.tolist() == [15, 25, 33, 40]
  budget = commit(draft, accepted, bonus, length, jnp.array([6, 1, 1, 1]), active, 9,
                  NO_EOS)
  assert budget.count.tolist()[0] == 3 and bool(budget.finished[0])
  assert np.all(np.asarray(budget.count[1:3]) == [5, 3])
