"""TableTune's controller as two Pallas kernels (``controller_kernel``), in Pallas
interpret mode (and with ``-m gpu`` compiled on the GPU), against the jax.numpy
controller: from the same state each call
chooses the same K and leaves the same state (to f32 rounding), over random traffic
with new requests, idle rows, measured and unmeasured iterations; a replayed trace drafts
the same K at every iteration; and compiled for the H200, an iteration of the decode
loop's controller is two kernels, where the jax.numpy one is some thirty."""

import dataclasses
import os
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.specdecode.policy import FixedDraftLength, MeasuredIteration
from wts_jax.tabletune.controller import TableTuneController
from wts_jax.tabletune.cost_model import modelled_cost_fn
from wts_jax.tabletune.profile import profile_costs
from wts_jax.tabletune.simulate import replay
from wts_jax.tabletune.traces import Phase, make_trace, regime_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import hlo_traffic  # noqa: E402

K = 7


@pytest.fixture(scope="module")
def costs():
  return profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled", target="qwen3-8b",
                       drafter="dspark", max_draft_len=K, batches=(1, 4, 16, 32, 64, 128),
                       source="modelled")


ON_GPU = bool(os.environ.get("WTS_GPU_TESTS")) and jax.default_backend() == "gpu"


def _pair(costs, draft_lens, *, interpret=True):
  reference = TableTuneController.from_table(costs, regime_profile("chat", K),
                                             draft_lens=draft_lens, impl="xla")
  return reference, dataclasses.replace(reference, impl="pallas", interpret=interpret)


_choose = jax.jit(lambda c, s, a, n, r: c.choose(s, a, n, r))
_choose_plain = jax.jit(lambda c, s, a: c.choose(s, a))
_observe = jax.jit(lambda c, s, k, accepted, a, m: c.observe(s, k, accepted, None, a, m))
_observe_untimed = jax.jit(lambda c, s, k, accepted, a: c.observe(s, k, accepted, None, a))


def _assert_states_close(want, got, where):
  for name, a, b in zip(want._fields, want, got):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=2e-4, atol=2e-6,
                                 err_msg=f"{where}: {name}")


CASES = [(1, (0, 1, 2, 3, 5, 7)), (5, None), (16, (1, 2, 3, 4, 5, 6, 7))]


@pytest.mark.parametrize("batch,draft_lens", CASES)
def test_each_call_equals_the_reference(costs, batch, draft_lens):
  """Both from the reference's state at every iteration: the same K and the same state."""
  _check_each_call(costs, batch, draft_lens, interpret=True)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1")
@pytest.mark.parametrize("batch,draft_lens", CASES + [(64, None), (128, (0, 1, 2, 3, 5, 7))])
def test_gpu_each_call_equals_the_reference(costs, batch, draft_lens):
  _check_each_call(costs, batch, draft_lens, interpret=False)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1")
def test_gpu_a_replayed_trace_drafts_what_the_reference_drafts(costs):
  _check_replay(costs, interpret=False)


def _check_each_call(costs, batch, draft_lens, *, interpret):
  reference, kernel = _pair(costs, draft_lens, interpret=interpret)
  rng = np.random.default_rng(batch)
  state = reference.init(batch)
  # A stale table (every cost 8 % dear) so that the cost filter moves.
  seconds = rng.choice([0.9, 1.0, 1.08]) * np.asarray(costs.cost(batch)).min()
  for it in range(24):
    active = jnp.asarray(rng.random(batch) < (0.0 if it == 5 else 0.85))
    new = jnp.asarray(rng.random(batch) < 0.15)
    rows = jnp.int32(max(int(active.sum()), 1))
    if it % 6 == 2:   # the loop's call without new-request flags and rows
      want_k, want_cap, want = _choose_plain(reference, state, active)
      got_k, got_cap, got = _choose_plain(kernel, state, active)
    else:
      want_k, want_cap, want = _choose(reference, state, active, new, rows)
      got_k, got_cap, got = _choose(kernel, state, active, new, rows)
    assert int(got_k) == int(want_k), f"iteration {it}"
    np.testing.assert_array_equal(np.asarray(got_cap), np.asarray(want_cap))
    _assert_states_close(want, got, f"choose, iteration {it}")
    k = int(want_k)
    accepted = jnp.asarray(rng.integers(0, k + 1, batch), jnp.int32)
    if 12 <= it < 18:   # every draft accepted for a while: a shift upwards
      accepted = jnp.full(batch, k, jnp.int32)
    measured = MeasuredIteration(
        jnp.float32(np.nan if it % 7 == 3 else seconds * np.exp(0.05 * rng.normal())),
        jnp.int32(k), rows)
    if it % 5 == 4:
      want_next = _observe_untimed(reference, want, want_k, accepted, active)
      got_next = _observe_untimed(kernel, want, want_k, accepted, active)
    else:
      want_next = _observe(reference, want, want_k, accepted, active, measured)
      got_next = _observe(kernel, want, want_k, accepted, active, measured)
    _assert_states_close(want_next, got_next, f"observe, iteration {it}")
    state = want_next
  assert int(state.timed) > 10
  # The shift raises a drift alarm (over several rows; one row's spread is too wide for
  # six blocks): the path that restarts the long-run counts from the batch's is compared.
  assert batch < 5 or int(state.drifts) > 0


def test_a_replayed_trace_drafts_what_the_reference_drafts(costs):
  """The kernels inside the replay's own loop (free running, each with its own state):
  the same K at every iteration of a trace with a shift, and the same tokens."""
  _check_replay(costs, interpret=True)


def _check_replay(costs, *, interpret):
  reference, kernel = _pair(costs, None, interpret=interpret)
  rows = 12
  trace = make_trace("shift", "", [Phase(80, rows, {"chat": 1}), Phase(40, 3, {"hard": 1}),
                                   Phase(80, rows, {"code": 1})],
                     batch=rows, max_draft_len=K, profiled_regime="chat", seed=3)
  want = replay(reference, trace, costs)
  got = replay(kernel, trace, costs)
  np.testing.assert_array_equal(np.asarray(got["draft_len"]), np.asarray(want["draft_len"]))
  assert got["tokens_per_s"] == pytest.approx(want["tokens_per_s"], rel=1e-6)


def test_refuses_an_unknown_impl(costs):
  with pytest.raises(ValueError, match="impl='triton'"):
    TableTuneController.from_table(costs, regime_profile("chat", K), impl="triton")


def _kernels_of_the_loop_body(policy, batch: int) -> list[str]:
  """The kernels (fusions, library and custom calls, copies) of one iteration of
  ``overhead``'s policy loop, compiled for the H200."""
  from wts_jax.tabletune import overhead
  loop = overhead._policy_loop(batch, 100)
  text = hlo_traffic.compile_hlo(loop, *hlo_traffic.abstract(
      (policy, jax.random.PRNGKey(0)), hlo_traffic.h200_sharding()))
  found = hlo_traffic.computations(text)
  body = max((name for name in found if name.startswith("region_")),
             key=lambda name: len(found[name]))
  kinds = []
  for line in found[body]:
    match = re.match(r"\s*(?:ROOT )?%\S+ = .+? ([a-z\-]+)\(", line)
    if match and match.group(1) in ("fusion", "custom-call", "copy", "copy-start"):
      kinds.append("pallas" if 'custom_call_target="__gpu$xla.gpu.triton"' in line
                   else match.group(1))
  return kinds


@pytest.mark.skipif(not hlo_traffic.cuda_available(),
                    reason="compiling for the H200 needs jax[cuda12]")
def test_compiled_for_the_h200_the_controller_is_two_kernels_an_iteration(costs):
  """choose and observe are one kernel each, and the state is updated in place (no copy
  into the loop's carry); the rest is the timing loop's own work (random traffic, its
  new-request flags and rows), a few kernels beside the fixed-K loop's."""
  batch = 16
  reference = TableTuneController.from_table(costs, regime_profile("chat", K), impl="xla")
  kernel = dataclasses.replace(reference, impl="pallas")
  fixed = _kernels_of_the_loop_body(FixedDraftLength(K), batch)
  fused = _kernels_of_the_loop_body(kernel, batch)
  unfused = _kernels_of_the_loop_body(reference, batch)
  assert fused.count("pallas") == 2 and "copy" not in fused, fused
  assert len(fused) <= len(fixed) + 6, (fused, fixed)
  assert len(unfused) >= len(fused) + 15, (unfused, fused)
