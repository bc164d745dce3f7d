"""The draft-length policy protocol, its trivial implementation and the loop's helpers."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from wts_jax.specdecode.policy import (DraftPolicy, FixedDraftLength, MeasuredIteration,
                                       as_policy, branch_index, draft_lens_of, max_draft_len)


def test_fixed_draft_length_follows_the_protocol():
  policy = as_policy(3)
  assert isinstance(policy, DraftPolicy) and policy == FixedDraftLength(3)
  assert policy.draft_lens == (3,) and max_draft_len(policy) == 3
  state = policy.init(2)
  active = jnp.array([True, False])
  k, cap, state = policy.choose(state, active, jnp.array([True, False]), jnp.int32(2))
  assert int(k) == 3 and cap.dtype == jnp.int32 and cap.tolist() == [3, 3]
  measured = MeasuredIteration(jnp.float32(0.01), k, jnp.int32(2))
  assert policy.observe(state, k, jnp.array([1, 0]), None, active, measured) == state
  # The loop may leave out the new-request flags, the rows and the timing.
  assert int(policy.choose(state, active)[0]) == 3


def test_k0_is_a_draft_length():
  """K = 0: no draft, the target alone; a static pytree without leaves."""
  policy = as_policy(0)
  assert policy.draft_lens == (0,) and max_draft_len(policy) == 0
  k, cap, _ = policy.choose(policy.init(4), jnp.ones(4, bool))
  assert int(k) == 0 and cap.tolist() == [0] * 4
  assert jax.tree.leaves(policy) == []


def test_a_policy_may_give_max_draft_len_alone():
  @dataclasses.dataclass(frozen=True)
  class OnlyMax:
    max_draft_len: int = 3
    def init(self, batch): return ()
    def choose(self, state, active, new_request=None, rows=None): return 1, active, state
    def observe(self, state, k, accepted, confidence, active, measured=None): return state

  assert draft_lens_of(as_policy(OnlyMax())) == (1, 2, 3)


def test_branch_index_follows_the_labels():
  lens = (0, 1, 2, 3, 5, 7)
  assert [int(branch_index(lens, jnp.int32(k))) for k in lens] == list(range(6))
  assert int(jax.jit(lambda k: branch_index(lens, k))(jnp.int32(5))) == 4
  assert int(branch_index((4,), jnp.int32(4))) == 0


@pytest.mark.parametrize("bad", [-1, True, 2.0])
def test_bad_draft_len_is_named(bad):
  with pytest.raises((ValueError, TypeError), match="draft_len"):
    as_policy(bad)


@pytest.mark.parametrize("lens", [(), (2, 1), (1, 1), (-1, 2), (0.5, 1)])
def test_bad_draft_lens_are_named(lens):
  @dataclasses.dataclass(frozen=True)
  class Labelled:
    draft_lens: tuple
    def init(self, batch): return ()
    def choose(self, state, active, new_request=None, rows=None): return 1, active, state
    def observe(self, state, k, accepted, confidence, active, measured=None): return state

  with pytest.raises(ValueError, match="draft_lens"):
    as_policy(Labelled(lens))
  with pytest.raises(TypeError, match="no 'init'"):
    as_policy(object())
