"""The draft-length policy protocol and its trivial implementation."""

import jax.numpy as jnp
import pytest

from wts_jax.spec.policy import DraftPolicy, FixedDraftLength, as_policy


def test_fixed_draft_length_follows_the_protocol():
  policy = as_policy(3)
  assert isinstance(policy, DraftPolicy) and policy == FixedDraftLength(3)
  assert policy.max_draft_len == 3
  state = policy.init(2)
  k, cap, state = policy.choose(state, jnp.array([True, False]))
  assert int(k) == 3 and cap.dtype == jnp.int32 and cap.tolist() == [3, 3]
  assert policy.observe(state, k, jnp.array([1, 0]), None, jnp.array([True, False])) == state


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_bad_draft_len_is_named(bad):
  with pytest.raises((ValueError, TypeError), match="draft_len"):
    as_policy(bad)
