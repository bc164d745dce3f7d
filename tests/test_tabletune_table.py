"""Cost tables, the profiler and the draft-length table."""

import dataclasses
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from wts_jax.tabletune.cost_model import modelled_cost_fn
from wts_jax.tabletune.cost_table import CostTable, table_filename
from wts_jax.tabletune.profile import bucket_order, profile_costs, remeasure_contested
from wts_jax.tabletune.table import best_draft_len, profile_from_rate, tokens_per_second

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


@pytest.fixture(scope="module")
def modelled():
  return profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled", target="qwen3-8b",
                       drafter="dspark", max_draft_len=7, batches=BATCHES, source="modelled")


def test_interpolation_exact_at_buckets_linear_between_and_beyond(modelled):
  seconds = modelled.array()
  np.testing.assert_allclose(modelled.cost(np.array(BATCHES)), seconds)
  np.testing.assert_allclose(modelled.cost(24), 0.5 * (seconds[4] + seconds[5]))
  np.testing.assert_allclose(modelled.cost(192), 2 * seconds[-1] - seconds[-2])
  np.testing.assert_allclose(modelled.cost(0.5), seconds[0])


def test_json_round_trip_and_validation(tmp_path, modelled):
  path = modelled.save(tmp_path / table_filename("NVIDIA H200", "qwen3-8b", "dspark"))
  assert path.name == "costs_nvidia-h200_qwen3-8b_dspark.json"
  assert CostTable.load(path) == modelled
  data = json.loads(path.read_text())
  assert data["draft_lens"] == list(range(8)) and data["provenance"]["source"] == "modelled"
  with pytest.raises(ValueError, match="strictly increasing"):
    dataclasses.replace(modelled, batches=(1, 1) + BATCHES[2:])
  with pytest.raises(ValueError, match="seconds"):
    dataclasses.replace(modelled, seconds=((1.0, -1.0),) * len(BATCHES))
  with pytest.raises(ValueError, match="schema"):
    CostTable.from_json({**data, "schema": "other"})


def test_profiler_budget_keeps_the_ends_and_records_what_it_skipped():
  now = [0.0]
  def clock():
    return now[0]
  def cost(batch, draft_len):
    now[0] += 10.0  # every point takes 10 s
    return 1e-3 * (1 + batch * (draft_len + 1))
  table = profile_costs(cost, device_kind="x", target="t", drafter="d", max_draft_len=3,
                        batches=BATCHES, budget_s=130.0, clock=clock)
  # 40 s a bucket: the two ends (80 s) and one more (120 s) fit; the fourth would not.
  assert table.batches == (1, 8, 128)
  assert table.provenance["skipped_batches"] == [2, 4, 16, 32, 64]
  assert bucket_order(BATCHES)[:3] == [1, 128, 8]
  with pytest.raises(ValueError, match="max_draft_len"):
    profile_costs(cost, device_kind="x", target="t", drafter="d", max_draft_len=0)


def test_table_staircase_in_acceptance(modelled):
  batches = np.arange(1, 129)
  previous = np.zeros_like(batches)
  for rate in np.linspace(0.3, 0.98, 15):
    best = best_draft_len(modelled, profile_from_rate(rate, 7, 0.97), batches)
    assert np.all(best >= previous), rate
    previous = best
  assert previous[0] == 7 and best_draft_len(modelled, profile_from_rate(0.3, 7), 128) <= 1


def test_table_monotone_in_cost_and_batch(modelled):
  profile = profile_from_rate(0.8, 7, 0.97)
  batches = np.arange(1, 129)
  best = best_draft_len(modelled, profile, batches)
  assert np.all(np.diff(best) <= 0)  # larger batches draft less on this cost model
  # Making every draft position dearer can only shorten the best draft.
  for extra in (0.5e-3, 2e-3, 8e-3):
    dearer = dataclasses.replace(modelled, seconds=tuple(
        tuple(s + extra * k for k, s in enumerate(row)) for row in modelled.seconds))
    shorter = best_draft_len(dearer, profile, batches)
    assert np.all(shorter <= best)
    best = shorter
  rates = tokens_per_second(modelled, profile, 16)
  assert rates.shape == (8,) and rates.argmax() == best_draft_len(modelled, profile, 16)


def test_profiler_labels_the_draft_lengths_it_measured():
  asked = []
  def cost(batch, draft_len):
    asked.append(draft_len)
    return 1e-3 * batch * (1 + draft_len ** 2)
  table = profile_costs(cost, device_kind="x", target="t", drafter="d", max_draft_len=4,
                        batches=(1, 2), draft_lens=(0, 2, 4))
  assert sorted(set(asked)) == [0, 2, 4] and table.draft_lens == (0, 2, 4)
  np.testing.assert_allclose(table.array()[0], [1e-3, 5e-3, 17e-3])
  # Between labels the cost is linear in K; a K outside them is refused.
  assert table.cost(1, 3) == pytest.approx(11e-3)
  with pytest.raises(ValueError, match="draft_len=5"):
    table.cost(1, 5)
  with pytest.raises(ValueError, match="draft_lens"):
    profile_costs(cost, device_kind="x", target="t", drafter="d", max_draft_len=4,
                  draft_lens=(0, 2))


def test_labels_are_honoured_and_a_mismatch_refused(tmp_path):
  """A table measured at K = 0, 1, 2, 3, 5, 7 is not K = 0..5 (issue 54, item 4)."""
  lens = [0, 1, 2, 3, 5, 7]
  flat_in_k = [[0.010 + 0.0001 * k for k in lens], [0.012 + 0.0001 * k for k in lens]]
  data = {"schema": "wts_jax.tabletune.cost_table/1", "device_kind": "x", "target": "t",
          "drafter": "d", "batches": [1, 4], "draft_lens": lens, "seconds": flat_in_k}
  table = CostTable.from_json(data)
  assert table.draft_lens == tuple(lens) and table.max_draft_len == 7
  # High acceptance, flat costs: the longest draft wins, labelled 7.
  assert int(best_draft_len(table, profile_from_rate(0.95, 7), 1)) == 7
  assert table.column(5) == 4 and table.cost(1, 5) == pytest.approx(0.0105)
  for bad, message in [({**data, "draft_lens": list(range(8))}, "labels 8 columns"),
                       ({**data, "draft_lens": [0, 1, 2, 3, 7, 5]}, "increasing"),
                       ({k: v for k, v in data.items() if k != "draft_lens"},
                        "no 'draft_lens'")]:
    with pytest.raises(ValueError, match=message):
      CostTable.from_json(bad)
  with pytest.raises(ValueError, match="not in the table's draft_lens"):
    table.restricted((0, 4))
  assert table.restricted((0, 7)).array().tolist() == [[0.010, 0.0107], [0.012, 0.0127]]


def test_remeasure_contested_averages_only_the_deciding_points(modelled):
  calls = []
  def cost(batch, draft_len):
    calls.append((batch, draft_len))
    return float(modelled.cost(batch, draft_len))
  noisy = modelled.with_noise(0.05, seed=3)
  fixed = remeasure_contested(noisy, cost, rounds=1)
  assert 0 < len(calls) < modelled.array().size
  assert fixed.provenance["remeasured_points"] == len(calls)
  for batch, draft_len in calls:  # averaged with one exact measurement: half the error
    i = modelled.batches.index(batch)
    error = fixed.array()[i, draft_len] - modelled.array()[i, draft_len]
    assert error == pytest.approx(0.5 * (noisy.array()[i, draft_len]
                                         - modelled.array()[i, draft_len]))


def test_remeasure_contested_stops_before_overrunning_its_budget(modelled):
  now = [0.0]
  def clock():
    return now[0]
  def cost(batch, draft_len):
    now[0] += 5.0  # every point takes 5 s
    return float(modelled.cost(batch, draft_len))
  fixed = remeasure_contested(modelled.with_noise(0.05, seed=3), cost, budget_s=12.0,
                              clock=clock)
  # 5 s and 10 s fit; a third point would end at 15 s > 12 s.
  assert fixed.provenance["remeasured_points"] == 2
  assert fixed.provenance["remeasure_seconds"] <= 12.0
  # Before the first point its time is the caller's estimate.
  assert remeasure_contested(modelled.with_noise(0.05, seed=3), cost, budget_s=4.0,
                             point_seconds=5.0, clock=clock).provenance[
                                 "remeasured_points"] == 0


def test_merge_cost_tables_joins_disjoint_buckets_and_refuses_overlaps(modelled, tmp_path):
  path = pathlib.Path(__file__).parents[1] / "tools" / "merge_cost_tables.py"
  spec = importlib.util.spec_from_file_location("merge_cost_tables", path)
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  low = dataclasses.replace(modelled, batches=BATCHES[:3], seconds=modelled.seconds[:3])
  high = dataclasses.replace(modelled, batches=BATCHES[3:], seconds=modelled.seconds[3:])
  low.save(tmp_path / "low.json")
  high.save(tmp_path / "high.json")
  out = tmp_path / "merged.json"
  assert tool.main(["--table", str(tmp_path / "high.json"), "--table",
                    str(tmp_path / "low.json"), "--out", str(out)]) == 0
  merged = CostTable.load(out)
  assert merged.batches == BATCHES
  np.testing.assert_allclose(merged.array(), modelled.array())
  assert [part["batches"] for part in merged.provenance["parts"]] == [list(BATCHES[3:]),
                                                                      list(BATCHES[:3])]
  # (parts of one source keep it; each part named by its file, not where it lay)
  assert merged.provenance["source"] == modelled.provenance["source"]
  assert merged.provenance["merged"] is True
  assert [part["path"] for part in merged.provenance["parts"]] == ["high.json", "low.json"]
  mixed = tool.merge([low, dataclasses.replace(high, provenance={"source": "measured"})],
                     ["a", "b"])
  assert mixed.provenance["source"] == "merged"
  # (parts that name no source make a table that says it was merged, not one of none)
  unnamed = [dataclasses.replace(t, provenance={}) for t in (low, high)]
  assert tool.merge(unnamed, ["a", "b"]).provenance["source"] == "merged"
  with pytest.raises(ValueError, match="batch 1 .* earlier table"):
    tool.merge([low, low], ["a", "b"])
  with pytest.raises(ValueError, match="is for"):
    tool.merge([low, dataclasses.replace(high, target="other")], ["a", "b"])
  with pytest.raises(ValueError, match="is for"):
    tool.merge([low, high.restricted((0, 1, 2, 3, 5, 7))], ["a", "b"])
