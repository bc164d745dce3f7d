"""The controller inside the end-to-end decode loop (tiny models, CPU). The loop's own
tests show that any policy's k and caps keep the output exact; this one shows that the
controller is such a policy in the real ``lax.while_loop`` and drafts multi-token blocks.
Skipped where the loop (wts_jax.spec.loop) is absent. About half a minute: the loop
compiles one branch per draft length."""

import numpy as np
import pytest

loop = pytest.importorskip("wts_jax.spec.loop")
qwen3 = pytest.importorskip("wts_jax.spec.qwen3")
dspark = pytest.importorskip("wts_jax.spec.dspark")

import jax.numpy as jnp  # pylint: disable=wrong-import-position

from wts_jax.tabletune.controller import TableTuneController  # pylint: disable=wrong-import-position
from wts_jax.tabletune.cost_model import modelled_cost_fn  # pylint: disable=wrong-import-position
from wts_jax.tabletune.profile import profile_costs  # pylint: disable=wrong-import-position
from wts_jax.tabletune.traces import regime_profile  # pylint: disable=wrong-import-position


def test_controller_drives_generate():
  # A 6-token vocabulary, so that a random drafter still gets drafts accepted.
  target_config = qwen3.Qwen3Config.tiny(vocab_size=6, num_layers=2)
  drafter_config = dspark.DSparkConfig.tiny(target_config, block_size=3,
                                            target_layer_ids=(0, 1))
  block = drafter_config.block_size
  target = qwen3.make_qwen3(target_config, seed=0, param_dtype=jnp.float32, dtype=jnp.float32)
  drafter = dspark.make_dspark(drafter_config, seed=1, param_dtype=jnp.float32,
                               dtype=jnp.float32)
  costs = profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled",
                        target="qwen3-8b", drafter="dspark", max_draft_len=block,
                        batches=(1, 4, 16), source="modelled")
  # K >= 1 only: the loop as it stands compiles a branch for 1..max (K = 0 joins the
  # choices once the loop runs the target alone for it).
  controller = TableTuneController.from_table(costs, regime_profile("code", block),
                                              draft_lens=tuple(range(1, block + 1)))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, target_config.vocab_size, n).tolist() for n in (3, 6, 4)]
  tuned = loop.generate(target, drafter, prompts, 12, draft_len=controller, walk_impl="xla")
  assert [len(row) for row in tuned.rows()] == [12] * len(prompts)
  assert int(np.sum(tuned.accepted)) > 0 and int(tuned.iterations) < 12
