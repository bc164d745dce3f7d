"""The controller inside the end-to-end decode loop (tiny models, CPU). The loop's own
tests show that any policy's k and caps keep the output exact; this one shows that the
controller is such a policy in the real ``lax.while_loop`` and drafts multi-token blocks.
Skipped where the loop (wts_jax.specdecode.loop) is absent. About half a minute: the loop
compiles one branch per draft length."""

import numpy as np
import pytest

loop = pytest.importorskip("wts_jax.specdecode.loop")
qwen3 = pytest.importorskip("wts_jax.specdecode.qwen3")
dspark = pytest.importorskip("wts_jax.specdecode.dspark")

import jax.numpy as jnp  # pylint: disable=wrong-import-position

from wts_jax.tabletune.controller import TableTuneController  # pylint: disable=wrong-import-position
from wts_jax.tabletune.cost_model import modelled_cost_fn  # pylint: disable=wrong-import-position
from wts_jax.tabletune.profile import profile_costs  # pylint: disable=wrong-import-position
from wts_jax.tabletune.traces import regime_profile  # pylint: disable=wrong-import-position


def _tiny_models():
  """A 6-token vocabulary (so that a random drafter still gets drafts accepted), two
  layers, blocks of three: the target and the drafter in fp32."""
  target_config = qwen3.Qwen3Config.tiny(vocab_size=6, num_layers=2)
  drafter_config = dspark.DSparkConfig.tiny(target_config, block_size=3,
                                            target_layer_ids=(0, 1))
  return (qwen3.make_qwen3(target_config, seed=0, param_dtype=jnp.float32,
                           dtype=jnp.float32),
          dspark.make_dspark(drafter_config, seed=1, param_dtype=jnp.float32,
                             dtype=jnp.float32))


def test_controller_drives_generate():
  target, drafter = _tiny_models()
  block = drafter.config.block_size
  costs = profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled",
                        target="qwen3-8b", drafter="dspark", max_draft_len=block,
                        batches=(1, 4, 16), source="modelled")
  # K = 0 among the choices (the table's draft lengths are 0..block).
  controller = TableTuneController.from_table(costs, regime_profile("code", block))
  assert controller.draft_lens[0] == 0
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, target.config.vocab_size, n).tolist() for n in (3, 6, 4)]
  plain = loop.generate(target, drafter, prompts, 12, draft_len=0, walk_impl="xla")
  tuned = loop.generate(target, drafter, prompts, 12, draft_len=controller, walk_impl="xla")
  assert tuned.rows() == plain.rows()
  assert int(np.sum(tuned.accepted)) > 0 and int(tuned.iterations) < 12

  # The table and the prior are operands: another table (and a controller starting from
  # what the last call learnt) runs in the same executable.
  compiled = len(loop.EXECUTABLES)
  dearer = TableTuneController.from_table(costs.scaled(1.1, "10 % dearer"), regime_profile("code", block))
  again = loop.generate(target, drafter, prompts, 12, draft_len=dearer, walk_impl="xla")
  learnt = controller.with_learned_costs(tuned.policy_state)
  resumed = loop.generate(target, drafter, prompts, 12, draft_len=learnt, walk_impl="xla")
  assert len(loop.EXECUTABLES) == compiled
  assert again.rows() == resumed.rows() == plain.rows()


def test_a_controller_that_expects_no_acceptance_probes_its_way_back_to_drafting():
  """A prior of zero acceptance makes every K >= 1 a loss, so the controller starts at
  K = 0 (the target alone); this drafter's blocks do pass, and only its budgeted probes
  can see it: they run, drafts get accepted, and the tokens stay the target's own."""
  target, drafter = _tiny_models()
  costs = profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled",
                        target="qwen3-8b", drafter="dspark", max_draft_len=3,
                        batches=(1, 4, 16), source="modelled")
  # A budget that probes every few iterations (a probe here loses ~ 20 %): 32 tokens
  # are a few dozen iterations, enough probes for some to pass (whether one probe's
  # draft passes depends on where in this tiny model's repeating output it lands).
  controller = TableTuneController.from_table(costs, np.zeros(3), probe_budget=0.05)
  prompts = [[1, 2, 3]] * 2
  out = loop.generate(target, drafter, prompts, 32, draft_len=controller, walk_impl="xla")
  plain = loop.generate(target, drafter, prompts, 32, draft_len=0, walk_impl="xla")
  assert out.rows() == plain.rows()
  assert int(out.policy_state.probes) >= 1 and int(np.sum(out.accepted)) > 0


def test_the_profilers_loop_cost_compiles_a_point_once():
  """A contested point is timed again: its compiled iteration is reused (timing it again
  traces and compiles nothing), and the figure is a positive time."""
  import jax  # pylint: disable=import-outside-toplevel
  from wts_jax.tabletune.profile import loop_cost_fn  # pylint: disable=import-outside-toplevel
  target, drafter = _tiny_models()
  compiles = []

  def count(event, seconds, **_):
    del seconds
    if event.endswith("backend_compile_duration"):
      compiles.append(event)
  jax.monitoring.register_event_duration_secs_listener(count)
  try:
    cost = loop_cost_fn(target, drafter, prompt_len=8, repeats=1, walk_impl="xla")
    first = cost(2, 2)
    compiled = len(compiles)
    again = cost(2, 2)
  finally:
    jax.monitoring.unregister_event_duration_listener(count)
  assert compiled > 0 and len(compiles) == compiled
  assert first > 0 and again > 0


def test_the_profiler_compiles_a_bucket_before_timing_it():
  """``profile_costs`` has the loop's cost compile each bucket's draft lengths at once
  (``LoopCost.prepare``, before the bucket's first timing); the timings then run those
  executables (a ``Compiled`` cannot compile again) and add none, and every figure is a
  positive time."""
  import jax  # pylint: disable=import-outside-toplevel
  from wts_jax.tabletune.profile import loop_cost_fn, profile_costs  # pylint: disable=import-outside-toplevel
  target, drafter = _tiny_models()
  cost = loop_cost_fn(target, drafter, prompt_len=8, repeats=1, walk_impl="xla")
  calls = []

  class Recorded:
    def prepare(self, batch, lens):
      spent = cost.prepare(batch, lens)
      calls.append(("prepare", batch, dict(cost.runs)))
      assert set(spent) == {"trace_s", "compile_s"} and min(spent.values()) >= 0
      return spent

    def __call__(self, batch, draft_len):
      calls.append(("time", batch, None))
      return cost(batch, draft_len)
  lines = []
  table = profile_costs(Recorded(), device_kind="cpu", target="tiny", drafter="tiny",
                        max_draft_len=2, batches=(1, 2), draft_lens=(0, 2), log=lines.append)
  assert len(lines) == 2 and all(", trace " in line and ", compile " in line
                                 for line in lines)
  assert [c[:2] for c in calls] == [("prepare", 1), ("time", 1), ("time", 1),
                                    ("prepare", 2), ("time", 2), ("time", 2)]
  compiled = calls[3][2]
  assert len(compiled) == 4 and {key[1:3] for key in compiled} == {
      (1, 0), (1, 2), (2, 0), (2, 2)}
  assert all(isinstance(run, jax.stages.Compiled) for run in compiled.values())
  assert cost.runs == compiled   # (the same executables: the timings built none)
  assert all(s > 0 for row in table.seconds for s in row)
