"""The TableTune controller: the DraftPolicy contract, jit inside while_loop, shifts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.spec.policy import DraftPolicy, as_policy
from wts_jax.tabletune.controller import TableTuneController
from wts_jax.tabletune.cost_model import modelled_cost_fn
from wts_jax.tabletune.profile import profile_costs
from wts_jax.tabletune.simulate import replay
from wts_jax.tabletune.table import best_draft_len
from wts_jax.tabletune.traces import Phase, make_trace, regime_profile

K = 7


@pytest.fixture(scope="module")
def costs():
  return profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled", target="qwen3-8b",
                       drafter="dspark", max_draft_len=K, batches=(1, 4, 16, 32, 64),
                       source="modelled")


def test_is_a_draft_policy(costs):
  controller = TableTuneController.from_table(costs, regime_profile("chat", K))
  assert isinstance(controller, DraftPolicy) and as_policy(controller) is controller
  assert controller.max_draft_len == K
  hash(controller)  # a static argument of jit
  with pytest.raises(ValueError, match="decay"):
    TableTuneController.from_table(costs, regime_profile("chat", K), decay=0.0)
  with pytest.raises(ValueError, match="prior_acceptance"):
    TableTuneController.from_table(costs, regime_profile("chat", 3))


@pytest.mark.parametrize("options", [{}, {"confidence_bins": 4, "row_stop_survival": 0.3},
                                     {"cost_at_active_batch": False}])
def test_jittable_inside_while_loop(costs, options):
  controller = TableTuneController.from_table(costs, regime_profile("chat", K), **options)
  batch = 6
  active = jnp.array([True] * 5 + [False])

  @jax.jit
  def run(key):
    def body(carry):
      i, state, key, ks = carry
      key, sub = jax.random.split(key)
      k, cap, state = controller.choose(state, active)
      accepted = jnp.minimum(jax.random.randint(sub, (batch,), 0, K + 1), cap)
      confidence = jax.random.normal(sub, (batch, K))
      state = controller.observe(state, k, accepted, confidence, active)
      return i + 1, state, key, ks.at[i].set(k)
    init = (0, controller.init(batch), key, jnp.zeros(20, jnp.int32))
    return jax.lax.while_loop(lambda c: c[0] < 20, body, init)

  _, state, _, ks = run(jax.random.PRNGKey(0))
  assert np.all((np.asarray(ks) >= 1) & (np.asarray(ks) <= K))
  assert jax.tree.map(jnp.shape, state) == jax.tree.map(jnp.shape, controller.init(batch))
  # observe also takes confidence=None (a drafter without a confidence head)
  controller.observe(state, jnp.int32(3), jnp.zeros(batch, jnp.int32), None, active)


def test_converges_after_a_shift(costs):
  rows, half = 32, 250
  trace = make_trace("shift", "", [Phase(half, rows, {"chat": 1}),
                                   Phase(half, rows, {"code": 1})],
                     batch=rows, max_draft_len=K, profiled_regime="chat", seed=3)
  controller = TableTuneController.from_table(costs, regime_profile("chat", K))
  draft_len = replay(controller, trace, costs)["draft_len"]
  # What the table says for the traffic's acceptance, estimated from the trace itself.
  def table_k(phase):
    outcomes = trace.outcomes[phase][:, :rows]
    reached = np.cumprod(np.concatenate([np.ones(outcomes.shape[:-1] + (1,), bool),
                                         outcomes[..., :-1]], -1), -1)
    profile = (outcomes & reached).sum((0, 1)) / reached.sum((0, 1))
    return int(best_draft_len(costs, profile, rows, min_draft_len=1))
  chat_k, code_k = table_k(slice(0, half)), table_k(slice(half, None))
  assert chat_k < code_k
  settle = 40
  assert np.mean(np.abs(draft_len[settle:half] - chat_k) <= 1) > 0.9
  assert np.mean(np.abs(draft_len[half + settle:] - code_k) <= 1) > 0.9
  # Per-row estimates may sit one below the pooled table (rows differ); it must move.
  assert np.median(draft_len[half + settle:]) > np.median(draft_len[settle:half])


def test_drift_detection_resets_the_estimate(costs):
  controller = TableTuneController.from_table(costs, regime_profile("code", K), decay=0.995)
  state = controller.init(16)
  active = jnp.ones(16, bool)
  rng = np.random.default_rng(0)
  observe = jax.jit(controller.observe)
  def blocks(profile):
    outcomes = rng.random((16, K)) < profile
    return jnp.asarray(np.cumprod(outcomes, 1).sum(1), jnp.int32)
  for _ in range(100):
    state = observe(state, jnp.int32(K), blocks(regime_profile("code", K)), None, active)
  assert int(state.drifts) == 0
  for _ in range(15):
    state = observe(state, jnp.int32(K), blocks(regime_profile("reasoning", K)), None, active)
  assert int(state.drifts) >= 1
  estimate = np.asarray(controller._batch_acceptance(state))  # pylint: disable=protected-access
  # With decay 0.995 alone, 15 iterations would leave the estimate near the code level.
  assert abs(estimate[0] - regime_profile("reasoning", K)[0]) < 0.1


def test_hysteresis_holds_k(costs):
  sticky = TableTuneController.from_table(costs, regime_profile("chat", K), hysteresis=10.0)
  @jax.jit
  def step(state):
    k, _, state = sticky.choose(state, jnp.ones(8, bool))
    return k, sticky.observe(state, k, jnp.zeros(8, jnp.int32), None, jnp.ones(8, bool))
  state = sticky.init(8)
  k0 = int(state.draft_len)
  for _ in range(20):
    k, state = step(state)
  assert int(k) == k0
