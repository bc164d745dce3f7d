"""The TableTune controller: the DraftPolicy contract, its static/array split, K = 0 and
probing, live cost correction, labels, per-slot resets, shifts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.specdecode.policy import DraftPolicy, MeasuredIteration, as_policy
from wts_jax.tabletune import acceptance as acc
from wts_jax.tabletune.controller import MODELLED_DRAFT_LEN_SD, TableTuneController
from wts_jax.tabletune.cost_model import modelled_cost_fn
from wts_jax.tabletune.cost_table import CostTable
from wts_jax.tabletune.profile import profile_costs
from wts_jax.tabletune.simulate import replay
from wts_jax.tabletune.table import best_draft_len
from wts_jax.tabletune.traces import Phase, Trace, make_trace, measured_profile, regime_profile

K = 7


@pytest.fixture(scope="module")
def costs():
  return profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled", target="qwen3-8b",
                       drafter="dspark", max_draft_len=K, batches=(1, 4, 16, 32, 64),
                       source="modelled")


def verify_bound_costs(draft_lens=tuple(range(K + 1))) -> CostTable:
  """A loop whose verification dominates at large B: drafting costs 0.6 ms a token a
  row past B = 16, so that not drafting wins there when acceptance is low."""
  batches = (1, 16, 64, 128)
  seconds = [[0.010 + 1e-3 * (k > 0) + 0.6e-3 * k * max(b - 16, 0) / 16 for k in draft_lens]
             for b in batches]
  return CostTable("x", "t", "d", batches, tuple(draft_lens),
                   tuple(map(tuple, seconds)), {"source": "test"})


def test_is_a_draft_policy_with_static_and_array_parts(costs):
  controller = TableTuneController.from_table(costs, regime_profile("chat", K))
  assert isinstance(controller, DraftPolicy) and as_policy(controller) is controller
  assert controller.draft_lens == tuple(range(K + 1)) and controller.max_draft_len == K
  leaves, treedef = jax.tree.flatten(controller)
  assert [leaf.shape for leaf in leaves] == [(5,), (5, K + 1), (K,)]
  hash(treedef)  # the static part keys the compiled loop
  with pytest.raises(ValueError, match="decay"):
    TableTuneController.from_table(costs, regime_profile("chat", K), decay=0.0)
  with pytest.raises(ValueError, match="prior_acceptance"):
    TableTuneController.from_table(costs, regime_profile("chat", 3))
  with pytest.raises(ValueError, match="not in the table's draft_lens"):
    TableTuneController.from_table(costs.restricted((0, 1, 2, 3, 5, 7)),
                                   regime_profile("chat", K), draft_lens=(0, 4, 7))


def test_new_numbers_never_recompile(costs):
  """The cost table, the prior and the learnt costs are operands; the draft lengths and
  options are the compiled program's."""
  calls = []

  @jax.jit
  def first_choice(controller):
    calls.append(1)
    k, _, _ = controller.choose(controller.init(8), jnp.ones(8, bool))
    return k

  controller = TableTuneController.from_table(costs, regime_profile("chat", K))
  first_choice(controller)
  cheaper = dataclasses.replace(controller, seconds=controller.seconds * 0.5,
                                prior=controller.prior * 0.9)
  first_choice(cheaper)
  first_choice(TableTuneController.from_table(costs.with_noise(0.05, 1),
                                              regime_profile("code", K)))
  assert len(calls) == 1
  first_choice(dataclasses.replace(controller, hysteresis=0.05))
  assert len(calls) == 2


@pytest.mark.parametrize("measured", [False, True])
def test_jittable_inside_while_loop(costs, measured):
  controller = TableTuneController.from_table(costs, regime_profile("chat", K))
  batch = 6
  active = jnp.array([True] * 5 + [False])

  @jax.jit
  def run(controller, key):
    def body(carry):
      i, state, key, ks = carry
      key, sub, new_key = jax.random.split(key, 3)
      new_request = jax.random.bernoulli(new_key, 0.1, (batch,)) & active
      k, cap, state = controller.choose(state, active, new_request, jnp.int32(batch))
      accepted = jnp.minimum(jax.random.randint(sub, (batch,), 0, K + 1), cap)
      timing = (MeasuredIteration(jnp.float32(0.01), k, jnp.int32(batch)) if measured
                else None)
      state = controller.observe(state, k, accepted, None, active, timing)
      return i + 1, state, key, ks.at[i].set(k)
    init = (0, controller.init(batch), key, jnp.zeros(20, jnp.int32))
    return jax.lax.while_loop(lambda c: c[0] < 20, body, init)

  _, state, _, ks = run(controller, jax.random.PRNGKey(0))
  assert np.all((np.asarray(ks) >= 0) & (np.asarray(ks) <= K))
  assert jax.tree.map(jnp.shape, state) == jax.tree.map(jnp.shape, controller.init(batch))
  assert int(state.timed) == (20 if measured else 0)


def _primitives(jaxpr) -> set[str]:
  names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for param in eqn.params.values():
      for sub in (param if isinstance(param, (tuple, list)) else (param,)):
        inner = getattr(sub, "jaxpr", sub)   # a closed jaxpr holds its jaxpr
        if hasattr(inner, "eqns"):
          names |= _primitives(inner)
  return names


def test_an_iteration_of_the_controller_runs_no_loop_of_its_own(costs):
  """choose + observe (with a timing) and the loop's branch index are straight-line code:
  a loop inside them (jnp.searchsorted's default search) would run a kernel and a host
  check a step inside every iteration of the decode loop on a GPU."""
  from wts_jax.specdecode.policy import branch_index
  controller = TableTuneController.from_table(costs, regime_profile("chat", K))
  batch = 6
  active = jnp.ones((batch,), bool)

  def iteration(controller, state):
    k, cap, state = controller.choose(state, active, active, jnp.int32(batch))
    state = controller.observe(state, k, cap, None, active,
                               MeasuredIteration(jnp.float32(0.01), k, jnp.int32(batch)))
    return branch_index(controller.draft_lens, k), state

  jaxpr = jax.make_jaxpr(iteration)(controller, controller.init(batch)).jaxpr
  assert not _primitives(jaxpr) & {"while", "scan"}


def test_turns_drafting_off_where_it_loses_and_back_on():
  """Low acceptance at 128 rows: K = 0 wins and is chosen; chat-like traffic at the same
  batch: drafting wins again, found by the probes (an iteration without a draft says
  nothing about acceptance)."""
  table = verify_bound_costs()
  rows, half, after = 128, 450, 500
  trace = make_trace("off-on", "", [Phase(half, rows, {"hard": 1}),
                                    Phase(after, rows, {"chat": 1})],
                     batch=rows, max_draft_len=K, profiled_regime="hard", seed=4)
  hard = measured_profile(dataclasses.replace(trace, active=trace.active & (
      np.arange(half + after) < half)[:, None]))
  assert int(best_draft_len(table, hard, rows)) == 0
  controller = TableTuneController.from_table(table, regime_profile("hard", K))
  draft_len = replay(controller, trace, table)["draft_len"]
  assert np.mean(draft_len[50:half] == 0) > 0.9
  # Back on within a probe interval (the loss of a probe over the budget: K = 1 loses
  # ~10 % here, so ~330 iterations).
  assert np.mean(draft_len[half + 350:] > 0) > 0.95
  # The probes while off cost about the budget: a few per cent of the iterations.
  assert 0 < np.mean(draft_len[50:half] > 0) < 0.1


def test_while_no_draft_runs_departing_requests_fade_the_evidence():
  """At K = 0 no acceptance evidence arrives, but requests leave: the batch's evidence
  fades by the share of new rows, so its estimate's spread grows (and a drafting K is
  probed sooner); while drafting, fresh evidence arrives and nothing fades."""
  controller = TableTuneController.from_table(verify_bound_costs(),
                                              regime_profile("hard", K))
  rows = 64
  active = jnp.ones(rows, bool)
  state = controller.init(rows)
  for _ in range(20):
    state = controller.observe(state, jnp.int32(K), jnp.zeros(rows, jnp.int32), None,
                               active)
  off = state._replace(draft_len=jnp.int32(0))
  quarter = jnp.arange(rows) < rows // 4
  _, _, kept = controller.choose(off, active, jnp.zeros(rows, bool))
  _, _, faded = controller.choose(off, active, quarter)
  _, _, drafting = controller.choose(state._replace(draft_len=jnp.int32(K)), active,
                                     quarter)
  np.testing.assert_allclose(kept.counts.reached, state.counts.reached)
  np.testing.assert_allclose(faded.counts.reached, 0.75 * state.counts.reached, rtol=1e-6)
  np.testing.assert_allclose(drafting.counts.reached, state.counts.reached)
  spread = controller._tokens_spread  # pylint: disable=protected-access
  assert np.all(np.asarray(spread(faded))[1:] > np.asarray(spread(kept))[1:])
  assert float(spread(kept)[0]) == 0.0   # K = 0: one token, no doubt


def test_live_cost_correction_converges_to_the_measured_costs(costs):
  """A table 8 % off (drafting dearer, K = 0 cheaper) and 3 % noisy: measured iterations
  at the true costs pull the table the controller uses to them, cell by cell, with
  ~2 % timing noise, and the cells never measured move with the ones that were."""
  stale = costs.with_noise(0.03, seed=2).scaled(
      np.where(np.asarray(costs.draft_lens) > 0, 1.08, 0.95), "test: 8 % off")
  controller = TableTuneController.from_table(stale, regime_profile("chat", K))
  rng = np.random.default_rng(0)
  observe = jax.jit(controller.observe)
  state = controller.init(4)
  active = jnp.ones(4, bool)
  measured_k = [0, 2, 5, 7]
  for i in range(2000):
    batch = int(costs.batches[i % len(costs.batches)])
    k = measured_k[(i // len(costs.batches)) % len(measured_k)]
    seconds = float(costs.cost(batch, k)) * float(np.exp(0.02 * rng.standard_normal()))
    state = observe(state, jnp.int32(0), jnp.zeros(4, jnp.int32), None, active,
                    MeasuredIteration(jnp.float32(seconds), jnp.int32(k), jnp.int32(batch)))
  believed = np.asarray(controller.corrected_seconds(state)) / costs.array()
  np.testing.assert_allclose(believed[:, measured_k], 1.0, atol=0.015)
  # Never measured: K = 1, 3, 4, 6 — the shared error (8 % on drafting) is learnt from
  # the others; what is left is their own profiling noise.
  unmeasured = [1, 3, 4, 6]
  before = np.abs(np.log(stale.array() / costs.array()))[:, unmeasured]
  after = np.abs(np.log(believed))[:, unmeasured]
  assert after.mean() < 0.5 * before.mean() and after.mean() < 0.035
  assert int(state.timed) == 2000
  # The learnt table carries over to a new run without a new compile.
  learned = controller.with_learned_costs(state)
  assert jax.tree.structure(learned) == jax.tree.structure(controller)
  # Unmeasured iterations (NaN) and a K the controller does not know change nothing.
  for bad in (MeasuredIteration(jnp.float32(jnp.nan), jnp.int32(2), jnp.int32(4)),
              MeasuredIteration(jnp.float32(0.01), jnp.int32(9), jnp.int32(4))):
    after = observe(state, jnp.int32(0), jnp.zeros(4, jnp.int32), None, active, bad)
    np.testing.assert_array_equal(after.cost_error, state.cost_error)


def test_a_table_with_its_costs_wrong_recovers_the_throughput(costs):
  """Simulated end to end: a table whose drafting costs are 10 % off steers the static
  choice wrong (not drafting); the controller reading measured iteration times gets
  within 1 % of the controller given the true table."""
  table = verify_bound_costs()
  stale = table.scaled(np.where(np.asarray(table.draft_lens) > 0, 1.10, 1.0), "test")
  trace = make_trace("s", "", [Phase(400, 64, {"hard": 1})], batch=64,
                     max_draft_len=K, profiled_regime="hard", seed=5)
  prior = measured_profile(trace)
  assert int(best_draft_len(stale, prior, 64)) != int(best_draft_len(table, prior, 64))
  fresh = replay(TableTuneController.from_table(table, prior), trace, table)
  corrected = replay(TableTuneController.from_table(stale, prior), trace, table)
  assert corrected["tokens_per_s"] > 0.99 * fresh["tokens_per_s"]


def test_chooses_only_the_tables_draft_lengths(costs):
  """A table measured at K = 0, 1, 2, 3, 5, 7 offers those six (never 4 or 6)."""
  table = costs.restricted((0, 1, 2, 3, 5, 7))
  controller = TableTuneController.from_table(table, regime_profile("chat", K))
  assert controller.draft_lens == (0, 1, 2, 3, 5, 7)
  trace = make_trace("mix", "", [Phase(150, 32, {"chat": 1}), Phase(150, 4, {"code": 1}),
                                 Phase(150, 64, {"reasoning": 1})],
                     batch=64, max_draft_len=K, profiled_regime="chat", seed=6)
  chosen = set(np.unique(replay(controller, trace, table)["draft_len"]).tolist())
  assert chosen <= {0, 1, 2, 3, 5, 7} and len(chosen) > 1
  no_zero = TableTuneController.from_table(table, regime_profile("chat", K),
                                           draft_lens=(1, 3, 7))
  chosen = set(np.unique(replay(no_zero, trace, table)["draft_len"]).tolist())
  assert chosen <= {1, 3, 7}


def test_a_new_request_starts_its_slot_afresh(costs):
  controller = TableTuneController.from_table(costs, regime_profile("reasoning", K))
  active = jnp.ones(4, bool)
  state = controller.init(4)
  observe, choose = jax.jit(controller.observe), jax.jit(controller.choose)
  for _ in range(30):  # row 0 accepts everything, the others nothing
    state = observe(state, jnp.int32(K), jnp.array([K, 0, 0, 0], jnp.int32), None, active)
  rows = np.asarray(controller._row_acceptance(state))  # pylint: disable=protected-access
  assert rows[0, 0] > 0.7 and rows[1, 0] < 0.2
  _, _, kept = choose(state, active, jnp.zeros(4, bool))
  _, _, fresh = choose(state, active, jnp.array([True, False, False, False]))
  population = np.asarray(
      controller._population_acceptance(state))  # pylint: disable=protected-access
  kept_rows = np.asarray(controller._row_acceptance(kept))  # pylint: disable=protected-access
  fresh_rows = np.asarray(controller._row_acceptance(fresh))  # pylint: disable=protected-access
  assert kept_rows[0, 0] > 0.7
  np.testing.assert_allclose(fresh_rows[0], population, rtol=1e-6)
  np.testing.assert_allclose(fresh_rows[1:], rows[1:], rtol=1e-6)


def test_a_new_request_starts_from_the_long_run_level_not_the_recent_batch(costs):
  """The recent batch's estimate is a few dozen particular requests (and, while K = 0
  runs, frozen at the level that turned drafting off); a new request is a fresh draw
  from the traffic, so its estimate starts from the long-run counts."""
  controller = TableTuneController.from_table(costs, regime_profile("reasoning", K))
  state = controller.init(4)
  low = acc.AcceptanceCounts(jnp.full((K,), 30.0), jnp.full((K,), 100.0))
  high = acc.AcceptanceCounts(jnp.full((K,), 700.0), jnp.full((K,), 1000.0))
  state = state._replace(counts=low, population=high)
  _, _, fresh = controller.choose(state, jnp.ones(4, bool), jnp.ones(4, bool))
  rows = np.asarray(controller._row_acceptance(fresh))  # pylint: disable=protected-access
  batch = np.asarray(controller._batch_acceptance(fresh))  # pylint: disable=protected-access
  assert np.all(np.abs(rows - 0.7) < 0.01) and np.all(np.abs(batch - 0.3) < 0.02)


def test_the_residual_spread_is_per_row_and_never_below_the_estimates_own():
  """A batch that starts without drafting has learnt no spread of its residuals: one
  probe far off the estimate is already an alarm (the spread of the mean the estimate
  predicts at 128 rows is small). And the spread learnt at 16 rows holds at 128 (it is
  kept per row)."""
  controller = TableTuneController.from_table(verify_bound_costs(), regime_profile("hard", K))
  rows = 128
  active = jnp.ones(rows, bool)
  state = controller.init(rows)
  observe = jax.jit(controller.observe)
  for _ in range(100):
    state = observe(state, jnp.int32(0), jnp.zeros(rows, jnp.int32), None, active)
  probed = observe(state, jnp.int32(3), jnp.full(rows, 3, jnp.int32), None, active)
  assert int(state.drifts) == 0 and int(probed.drifts) == 1
  rng = np.random.default_rng(0)
  def learnt_spread(batch):
    state = controller.init(batch)
    for _ in range(200):
      outcomes = rng.random((batch, K)) < regime_profile("hard", K)
      accepted = jnp.asarray(np.cumprod(outcomes[:, :3], 1).sum(1), jnp.int32)
      state = observe(state, jnp.int32(3), accepted, None, jnp.ones(batch, bool))
    return float(state.residual_var)
  narrow, wide = learnt_spread(16), learnt_spread(128)
  assert 0.5 < wide / narrow < 2.0


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
  # Iterations without a draft say nothing: no alarm, no forgetting.
  for _ in range(50):
    state = observe(state, jnp.int32(0), jnp.zeros(16, jnp.int32), None, active)
  assert int(state.drifts) == 0
  for _ in range(15):
    state = observe(state, jnp.int32(K), blocks(regime_profile("reasoning", K)), None, active)
  assert int(state.drifts) >= 1
  estimate = np.asarray(controller._batch_acceptance(state))  # pylint: disable=protected-access
  # With decay 0.995 alone, 15 iterations would leave the estimate near the code level.
  assert abs(estimate[0] - regime_profile("reasoning", K)[0]) < 0.1


def test_hysteresis_holds_k(costs):
  """Nothing accepted: shorter drafts become better, but not by the margin; with probing
  off the K in use runs on."""
  sticky = TableTuneController.from_table(costs, regime_profile("chat", K), hysteresis=10.0,
                                          probe_budget=0.0, explore_sd=0.0)
  @jax.jit
  def step(state):
    k, _, state = sticky.choose(state, jnp.ones(8, bool))
    return k, sticky.observe(state, k, jnp.zeros(8, jnp.int32), None, jnp.ones(8, bool))
  state = sticky.init(8)
  assert int(state.draft_len) == K
  ks = []
  for _ in range(20):
    k, state = step(state)
    ks.append(int(k))
  assert ks == [K] * 20
  rate = sticky._rates(state, jnp.ones(8, bool), jnp.float32(8))  # pylint: disable=protected-access
  assert int(jnp.argmax(rate)) < K  # it would have switched without the margin


def test_a_better_runner_up_within_the_margin_is_probed_not_run_throughout(costs):
  """A runner-up inside the hysteresis margin is probed every hysteresis / probe_budget
  iterations; the K in use keeps running (and keeps its estimates fresh)."""
  controller = TableTuneController.from_table(costs, regime_profile("chat", K),
                                              hysteresis=0.5, probe_budget=0.05,
                                              explore_sd=0.0)
  @jax.jit
  def step(state):
    k, _, state = controller.choose(state, jnp.ones(8, bool))
    return k, controller.observe(state, k, jnp.zeros(8, jnp.int32), None, jnp.ones(8, bool))
  state = controller.init(8)
  ks = []
  for _ in range(40):
    k, state = step(state)
    ks.append(int(k))
  held = int(state.draft_len)
  probes = [(t, k) for t, k in enumerate(ks) if k != held]
  assert held == K and 2 <= len(probes) <= 8
  # A K is probed again only once its staleness pays for the margin: 0.5 / 0.05 = 10
  # iterations after it last ran (a runner-up that never ran is probed at once).
  for draft_len in {k for _, k in probes}:
    times = [t for t, k in probes if k == draft_len]
    assert all(b - a >= 10 for a, b in zip(times, times[1:]))


def test_a_cost_measured_as_well_as_a_measurement_tells_is_not_measured_again():
  """K = 1 runs, K = 0 is within 1 % of it and was measured at the start: a measurement
  of K = 0 (3 % timing spread) would move its cost belief by less than that loss, so the
  cost exploration leaves it alone. Budgeted probes off: only the exploration can run it.
  (Exploring by the whole uncertainty of the cost difference, which relaxes a little
  every iteration, ran K = 0 in 61 of these 700 iterations.)"""
  table = verify_bound_costs()
  iterations, rows = 800, 64
  # 18 or 19 of 64 rows accept position 0 and none position 1: K = 1 tokens 1.289 a row
  # per 12.8 ms, K = 0 1 per 10 ms: K = 0 loses 0.7 %, K >= 2 more.
  t, b = np.arange(iterations)[:, None], np.arange(rows)[None, :]
  outcomes = np.zeros((iterations, rows, K), bool)
  outcomes[..., 0] = (b + 7 * t) % rows < np.where(t % 2 == 0, 18, 19)
  active = np.ones((iterations, rows), bool)
  new_request = np.zeros_like(active)
  new_request[0] = True
  signals = np.zeros((iterations, rows, K), np.float32)
  trace = Trace("near tie", "", active, new_request, outcomes.astype(np.float32), outcomes,
                signals, signals, np.zeros(iterations, np.float32),
                np.zeros(iterations, np.int32), "hard", ("hard",))
  controller = TableTuneController.from_table(table, regime_profile("hard", K),
                                              probe_budget=0.0)
  draft_len = replay(controller, trace, table, timing_sd=0.0)["draft_len"]
  assert np.mean(draft_len[100:] == 1) > 0.98
  assert 0 < np.sum(draft_len[:100] == 0)         # the new table was measured at K = 0
  assert np.sum(draft_len[100:] == 0) < 10


def test_without_a_device_clock_costs_are_not_explored(costs):
  """A loop that measures no iteration (no device clock) never corrects its table, so
  a probe to learn a cost only loses tokens, and with no measurement to settle the
  doubt it would be probed again at every iteration (ungated, these cases ran K = 7 or
  K = 4 throughout for a best K of 4 or 3). Budgeted probes off: while no timing has
  arrived the controller runs the table's best K at every iteration."""
  controller = TableTuneController.from_table(costs, regime_profile("hard", K),
                                              probe_budget=0.0)
  for rows in (1, 16):
    state = controller.init(rows)
    active = jnp.ones((rows,), bool)
    chosen = []
    for _ in range(10):
      k, _, state = controller.choose(state, active)
      chosen.append(int(k))
    assert int(state.timed) == 0
    assert set(chosen) == {int(state.draft_len)}, (rows, chosen)


def test_a_modelled_table_is_measured_where_its_shape_may_be_wrong():
  """A table that prices K = 7 13 % too dear, so K = 6 is chosen where K = 7 wins: from a
  profile (its column shape measured) the controller takes it at its word; from a model
  (provenance "modelled…") the wider column spread gets K = 7 run, its cost learnt, and
  the throughput of the controller given the true table."""
  truth = profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled",
                        target="qwen3-8b", drafter="dspark", max_draft_len=K,
                        batches=(1, 4, 16, 32, 64), source="measured")
  dear = truth.scaled(np.where(np.asarray(truth.draft_lens) == K, 1.13, 1.0), "test")
  trace = make_trace("s", "", [Phase(600, 8, {"chat": 1})], batch=8, max_draft_len=K,
                     profiled_regime="chat", seed=1)
  prior = measured_profile(trace)
  assert int(best_draft_len(truth, prior, 8)) == K
  assert int(best_draft_len(dear, prior, 8)) == K - 1
  fresh = replay(TableTuneController.from_table(truth, prior), trace, truth)["tokens_per_s"]
  rate = {}
  for source in ("measured", "modelled"):
    table = dataclasses.replace(dear, provenance={**dear.provenance, "source": source})
    rate[source] = replay(TableTuneController.from_table(table, prior), trace,
                          truth)["tokens_per_s"] / fresh
  assert rate["modelled"] > 0.995 and rate["measured"] < 0.99
  # An explicit column spread wins over the table's provenance.
  modelled = dataclasses.replace(dear, provenance={"source": "modelled"})
  assert (TableTuneController.from_table(modelled, prior).cost_draft_len_sd
          == MODELLED_DRAFT_LEN_SD)
  assert TableTuneController.from_table(modelled, prior,
                                        cost_draft_len_sd=0.1).cost_draft_len_sd == 0.1
