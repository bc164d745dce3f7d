"""The backend seam: the registry's choice, its refusals, the configs, the tuned table.

Planning needs no GPU: ``backend.choose(..., require_gpu=False, device=H200)`` plans as
on the H200 (its tuned table included); ``PLANNERS``, a device of the H200's facts
without a table, plans by the planners' rules alone.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import wts_jax
from wts_jax.device import H200
from wts_jax.heads import HeadConfig
from wts_jax.pallas import backend, mosaic_batched_backend, preference
from wts_jax.quantize import quantize_w2
from wts_jax.walk_config import MosaicBatchedConfig, MosaicRowConfig

PLANNERS = dataclasses.replace(H200, kind="a device without a table")


def _head(head_type="vanilla", rank=256, vocab=151936):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=64, head_type=head_type)
  return jax.eval_shape(lambda: wts_jax.make_head(config))


def _choose(head, batch=1, impl="auto", config=None, greedy=True, device=H200, **shapes):
  return backend.choose(head, backend.WalkShapes(batch=batch, steps=7, greedy=greedy,
                                                 **shapes),
                        impl, config, require_gpu=False, device=device)


def _mosaic_plan(head, shapes, config=None, device=PLANNERS):
  """The plan of the Mosaic kernel ``impl="mosaic"`` takes (the planners' own, by
  default), or the refusal of the one ``config`` names."""
  try:
    return backend.choose(head, shapes, "mosaic", config, require_gpu=False,
                          device=device).plan
  except ValueError as err:
    return backend.Refusal(str(err))


def test_rank_192_runs_on_mosaic_where_triton_refuses():
  choice = _choose(_head(rank=192))
  assert choice.impl == "mosaic_row"
  assert dict(choice.refusals)["triton"].startswith("rank=192 must be a power of two")


def test_a_named_backend_that_cannot_run_lists_its_reason():
  with pytest.raises(ValueError, match=r"impl='mosaic' cannot run this walk: mosaic_row: "
                                       r"the Mosaic row kernel runs the vanilla and gated "
                                       r"heads"):
    _choose(_head("rnn"), impl="mosaic", config=MosaicRowConfig())
  # impl="mosaic" runs the gated and rnn heads on the batched kernel from one row.
  for head_type in ("gated", "rnn"):
    choice = _choose(_head(head_type), impl="mosaic")
    assert choice.impl == "mosaic_batched" and choice.plan.plan.split
  int8_rnn = jax.eval_shape(lambda h: quantize_w2(h, "int8"), _head("rnn"))
  # An int8 W2 without planes: the batched kernel widens it to bf16 (its row scales in
  # the epilogue), also past the Triton kernel's rows.
  widened = _choose(int8_rnn, batch=300, impl="pallas")
  assert widened.impl == "mosaic_batched" and widened.plan.plan.w2_row_scale
  assert dict(widened.refusals)["triton"].startswith("batch B=300")
  assert _choose(int8_rnn, batch=300).impl == "mosaic_batched"
  assert _choose(_head("rnn"), batch=300).impl == "mosaic_batched"   # 64-row launches
  # Past the Triton kernel's rows the batched Mosaic kernel runs (one launch per 64).
  assert _choose(_head(), batch=300).impl == "mosaic_batched"


def test_config_types_and_the_backends_they_name():
  with pytest.raises(TypeError, match=r"config=\{'residency': 'none'\} must be None or"):
    _choose(_head(), config={"residency": "none"})
  with pytest.raises(TypeError, match="config=3"):
    _choose(_head(), config=3)
  with pytest.raises(ValueError, match="is not for impl='triton'"):
    _choose(_head(), impl="triton", config=MosaicRowConfig())
  with pytest.raises(ValueError, match="is not for impl='mosaic_row'"):
    _choose(_head(), impl="mosaic_row", config=MosaicBatchedConfig())
  # A kernel's own config names it, also where "auto" would pick another.
  assert _choose(_head(), batch=4, config=MosaicRowConfig()).impl == "mosaic_row"
  assert _choose(_head(), config=wts_jax.TritonConfig()).impl == "triton"
  assert _choose(_head(), config=MosaicBatchedConfig()).impl == "mosaic_batched"
  with pytest.raises(ValueError, match="impl='lava'"):
    _choose(_head(), impl="lava")


def test_configs_name_their_bad_values():
  with pytest.raises(ValueError, match="gemv='tensor'"):
    MosaicRowConfig(gemv="tensor")
  with pytest.raises(ValueError, match="ring_stages=-1"):
    MosaicBatchedConfig(ring_stages=-1)
  with pytest.raises(ValueError, match="num_blocks=0"):
    wts_jax.MosaicStackedConfig(num_blocks=0)
  with pytest.raises(TypeError):
    MosaicRowConfig(warpgroups=2)   # (the batched kernel's option)


def test_the_device_says_which_kernels_it_runs():
  """A kernel runs where the device's compute capability has its instructions: the
  Mosaic kernels on Hopper (WGMMA), the Triton kernel from Ampere on; XLA everywhere."""
  ampere = dataclasses.replace(H200, kind="NVIDIA A100", compute_capability=(8, 0))
  choice = _choose(_head(), device=ampere)
  assert choice.impl == "triton"
  assert "compute capability (9, 0)" in dict(choice.refusals)["mosaic_row"]
  cpu = dataclasses.replace(H200, kind="cpu", compute_capability=None)
  choice = _choose(_head(), device=cpu)
  assert choice.impl == "xla" and "not a CUDA GPU" in dict(choice.refusals)["triton"]


def test_the_h200_table_is_data_every_entry_plans():
  """Every entry of the committed table names a backend and a config that plan its walk
  (at its range's first batch); off the table the planners' order decides."""
  entries = preference.tuned_table("NVIDIA H200")
  assert entries and {e["impl"] for e in entries} <= set(backend.KERNELS)
  forms = {"bfloat16": lambda h: h, "int8": lambda h: quantize_w2(h, "int8"),
           "int8_planes": lambda h: quantize_w2(h, "int8", state="planes")}
  tables = {None: lambda h: h, "gate": wts_jax.with_gate_table,
            "joint": wts_jax.with_joint_table}
  for entry in entries[::7]:
    head = jax.eval_shape(lambda: tables[entry["table"]](forms[entry["w2"]](
        wts_jax.make_head(HeadConfig.qwen3_4b(entry["head"], rank=entry["rank"])))))
    shapes = backend.WalkShapes(batch=entry["batch"][0], steps=7,
                                greedy=entry["mode"] == "greedy")
    if not mosaic_batched_backend.BATCH_ON_N_LOWERS:
      assert preference.tuned_entry("NVIDIA H200", head, shapes) is None
      continue
    assert preference.tuned_entry("NVIDIA H200", head, shapes) == entry
    choice = backend.choose(head, shapes, "auto", require_gpu=False, device=H200)
    assert choice.impl == entry["impl"], entry


def test_auto_choices_at_the_qwen3_shape():
  head, int8 = _head(), jax.eval_shape(lambda h: quantize_w2(h, "int8"), _head())
  planes = jax.eval_shape(lambda h: quantize_w2(h, "int8", state="planes"), _head())
  for device in (H200, PLANNERS):   # (the table says what the planners say)
    def impl(head, **kwargs):
      return _choose(head, device=device, **kwargs).impl
    assert impl(head) == "mosaic_row"
    assert impl(int8) == ("mosaic_batched" if mosaic_batched_backend.BATCH_ON_N_LOWERS
                          else "mosaic_row")   # (widened in registers on N)
    assert impl(head, batch=4) == "mosaic_batched"       # on N
    assert impl(head, greedy=False) == "mosaic_row"
    assert impl(head, batch=64) == "mosaic_batched"      # on M
    assert impl(head, batch=16, greedy=False) == "mosaic_batched"
    assert impl(head, batch=128) == "triton"
    assert impl(head, return_logits=True) == "triton"
    assert impl(planes) == impl(planes, batch=64) == "mosaic_stacked"
    assert impl(planes, greedy=False) == "mosaic_row"
    assert impl(_head("gated")) == "mosaic_batched"   # the gate split over the blocks
    assert impl(_head("gated"), greedy=False) == "mosaic_batched"
    assert impl(_head("gated"), batch=4) == "mosaic_batched"
    assert impl(_head("rnn")) == "mosaic_batched"
    assert impl(_head("rnn"), greedy=False) == "mosaic_batched"
    for head_type in ("gated", "rnn"):   # an int8 W2 widened to bf16 on the batched kernel
      int8_head = jax.eval_shape(lambda h: quantize_w2(h, "int8"), _head(head_type))
      for batch in (1, 4, 16, 64):
        for greedy in (True, False):
          choice = _choose(int8_head, batch=batch, greedy=greedy, device=device)
          assert choice.impl == "mosaic_batched" and choice.plan.plan.w2_row_scale
    assert impl(_head("rnn"), batch=16, greedy=False) == "mosaic_batched"
  assert _choose(head, config=wts_jax.TritonConfig(interpret=True)).impl == "triton"


@pytest.mark.mosaic
def test_lowering_fingerprint_lowers_each_backends_case():
  """``tools/lowering_fingerprint.py`` (the refactors' proof) lowers a case of each kernel
  for CUDA, and the same case twice gives the same text."""
  path = pathlib.Path(__file__).parent.parent / "tools" / "lowering_fingerprint.py"
  spec = importlib.util.spec_from_file_location("lowering_fingerprint", path)
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  for name, kernel in (("mosaic-stages3", "mosaic_gpu"), ("triton-tuned", "triton"),
                       ("auto-vanilla-b1-greedy-bf16", "mosaic_gpu")):
    text = tool.fingerprint(tool.CASES[name])
    assert not text.startswith("error:"), text
    assert kernel in text and text == tool.fingerprint(tool.CASES[name]), name


@pytest.mark.parametrize("impl, config", [
    ("triton", wts_jax.TritonConfig(interpret=True)),
    pytest.param("mosaic", wts_jax.MosaicRowConfig(interpret=True, gemv="registers"),
                 marks=[pytest.mark.mosaic, pytest.mark.skipif(
                     jax.__version_info__ < (0, 11),
                     reason="jax 0.10's Mosaic GPU interpreter cannot run tiled "
                            "shared-memory loads")]),
])
def test_each_backend_by_name_walks_like_the_reference(impl, config):
  from wts_jax.inputs import random_inputs
  head_config = HeadConfig(vocab_size=1000, rank=64, hidden_size=48)
  head = wts_jax.make_head(head_config, seed=0)
  base, first, _ = random_inputs(head_config, 1, 3, jax.random.key(1))
  out = wts_jax.walk(head, base, first, impl=impl, config=config)
  ref = wts_jax.walk(head, base, first, impl="xla")
  assert (out.tokens == ref.tokens).all() and int(out.status) == 0


def test_planner_takes_one_warpgroup_where_its_second_does_not_fit():
  """The rnn head's sampled walk on M takes two warpgroups; with its int8 W2 widened
  through a bf16 tile a warpgroup the second does not fit, and the planner plans one
  instead of refusing the kernel; two asked for by the config are refused, naming why."""
  head = jax.eval_shape(lambda h: quantize_w2(h, "int8"), _head("rnn"))
  shapes = backend.WalkShapes(batch=64, steps=7, greedy=False)
  plan = mosaic_batched_backend.plan
  assert plan(head, shapes, MosaicBatchedConfig(), H200).plan.warpgroups == 2
  smem = plan(head, shapes, MosaicBatchedConfig(w2_widening="smem"), H200).plan
  assert (smem.warpgroups, smem.w2_widening) == (1, "smem")
  refused = plan(head, shapes, MosaicBatchedConfig(w2_widening="smem", warpgroups=2), H200)
  assert isinstance(refused, backend.Refusal) and "W2 chunk" in refused.reason


@pytest.mark.parametrize("batch,w2,greedy,want", [
    (1, "bf16", True, "rows"), (4, "bf16", True, ("n", 1)), (4, "bf16", False, ("n", 2)),
    (16, "int8p", True, ("n", 2)), (16, "bf16", True, ("n", 1)),
    (32, "bf16", True, ("n", 2)), (32, "int8p", True, ("n", 2)),
    (64, "bf16", False, ("m", 2)), (64, "bf16", True, ("m", 1)),
    (64, "int8p", True, ("m", 2)), (64, "int8p", False, ("m", 2)),
    (1, "int8p", True, "stacked"), (2, "int8p", True, "stacked"),
    (64, "int8p", True, "stacked")])
@pytest.mark.parametrize("n_lowers", [True, False], ids=["jax-0.11", "jax-0.10"])
def test_mosaic_planner_picks_kernel_axis_and_warpgroups(batch, w2, greedy, want, n_lowers,
                                                          monkeypatch):
  """The Mosaic planners' measured choices: the row kernel at one row, else
  the batched kernel, the batch on N up to 32 rows where jax lowers it; two computing
  warpgroups for sampling, for int8 planes, and for bf16 greedy past 16 rows, with a
  producer for greedy walks; warpgroup 1's bests merged unreduced on N up to 16 rows,
  and there greedy walks' WGMMAs overlapping epilogues in pairs;
  a ring up to 4 slots deep before chunks stay resident, and on M with two warpgroups a
  1-slot base ring; the gated head one warpgroup but for sampling past 16 rows or on
  M, and for bf16 greedy walks past 32 rows, no producer; the rnn head one but for
  sampling on M and bf16 greedy walks past 32 rows (``docs/decisions.md``).
  The planners are the same arithmetic on either jax; whether jax lowers the batch on N
  is set here, so both cases run on either. A greedy int8-planes walk is the stacked
  kernel's from one row: there the batched kernel's plan is asked for by name."""
  monkeypatch.setattr(mosaic_batched_backend, "BATCH_ON_N_LOWERS", n_lowers)
  from wts_jax.pallas.batched.auto import AUTO_RING_PREFERENCE
  from wts_jax.pallas.batched.plan import DEFAULT_BASE_STAGES
  head = _head()
  if w2 == "int8p":
    head = jax.eval_shape(lambda h: quantize_w2(h, "int8", state="planes"), head)
  shapes = backend.WalkShapes(batch=batch, steps=7, greedy=greedy)
  stacked = w2 == "int8p" and greedy and batch >= preference.STACKED_MIN_BATCH
  config = MosaicBatchedConfig() if stacked and want != "stacked" else None
  spec = _mosaic_plan(head, shapes, config)
  if want == "stacked":
    from wts_jax.pallas.stacked.spec import StackedSpec
    assert isinstance(spec, StackedSpec) and spec.batch == batch
    return
  if want == "rows":
    assert not hasattr(spec.plan, "batch_axis")
    return
  axis, warpgroups = want
  if not n_lowers:   # jax 0.10: on M, bf16 greedy one warpgroup
    axis, warpgroups = "m", 2 if w2 == "int8p" or not greedy else 1
  plan = spec.plan
  assert (plan.batch_axis, plan.warpgroups) == (axis, warpgroups)
  assert plan.producer == (warpgroups == 2 and greedy)
  assert plan.merge_tiles == (warpgroups == 2 and axis == "n" and batch <= 16)
  assert plan.overlap_chunks == (2 if greedy and axis == "n" and batch <= 16 else 0)
  assert plan.base_stages == (1 if axis == "m" and warpgroups == 2 else DEFAULT_BASE_STAGES)
  # The ring first: as deep as the preference or the W2 slots allow, the rest resident.
  assert plan.ring_stages == min(AUTO_RING_PREFERENCE, plan.ring_stages
                                 + plan.resident_chunks, plan.wg_chunks)
  assert plan.ring_stages >= 2
  # Stated choices win over the planner's.
  base_stages = 2 if plan.base_stages == 1 else 1
  stated = _mosaic_plan(head, shapes, MosaicBatchedConfig(
      batch_axis=axis, warpgroups=warpgroups, ring_stages=1, base_stages=base_stages,
      merge_tiles=False, producer=not greedy)).plan
  assert (stated.ring_stages, stated.base_stages, stated.merge_tiles, stated.producer) == (
      1, base_stages, False, not greedy)
  assert stated.overlap_chunks == 0   # (one slot cannot overlap chunks: a deadlock)
  # The gated head (bf16): the batched kernel, one warpgroup but for sampling past 16
  # rows or on M and for greedy walks past 32 rows (on M), there with a 1-slot base ring;
  # no producer, no merged tiles.
  gated_plan = _mosaic_plan(_head("gated"), shapes).plan
  assert gated_plan.gated and not gated_plan.producer and not gated_plan.merge_tiles
  two_on_m = gated_plan.batch_axis == "m" and (not greedy or batch > 32)
  assert gated_plan.warpgroups == (2 if two_on_m or (not greedy and batch > 16) else 1)
  assert gated_plan.base_stages == (1 if two_on_m else min(DEFAULT_BASE_STAGES,
                                                           gated_plan.wg_chunks))
  # The rnn head: one warpgroup but on M for sampling and for greedy walks past 32 rows,
  # there two with a 1-slot base ring.
  rnn_plan = _mosaic_plan(_head("rnn"), shapes).plan
  rnn_two = rnn_plan.batch_axis == "m" and (not greedy or batch > 32)
  assert (rnn_plan.warpgroups, rnn_plan.producer) == (2 if rnn_two else 1, False)
  assert rnn_plan.overlap_chunks == gated_plan.overlap_chunks == 0
  assert rnn_plan.base_stages == (1 if rnn_two else min(DEFAULT_BASE_STAGES,
                                                        rnn_plan.wg_chunks))
  # The row kernel keeps walks the batched kernel cannot run, and row-kernel options.
  def with_fp32_w1(head):   # (the row kernel's register GEMV takes an fp32 W1)
    w1 = head.markov_head.markov_w1
    w1.weight = nnx.Param(w1.weight[...].astype(jnp.float32))
    return head
  gated_fp32 = jax.eval_shape(with_fp32_w1, _head("gated"))
  assert not hasattr(_mosaic_plan(gated_fp32, shapes if batch <= 4 else
                                  backend.WalkShapes(batch=4, steps=7)).plan, "batch_axis")
  assert not hasattr(_mosaic_plan(_head(), backend.WalkShapes(batch=4, steps=7),
                                  MosaicRowConfig(gemv="registers")).plan, "batch_axis")


@pytest.mark.parametrize("kwargs,match", [
    (dict(merge_tiles="yes"), "merge_tiles='yes' must be one of"),
    (dict(warpgroups=3), "warpgroups=3 must be one of"),
    (dict(batch_axis="k"), "batch_axis='k' must be one of"),
    (dict(base_stages=0), "base_stages=0 must be >= 1")])
def test_batched_config_refuses_bad_options(kwargs, match):
  with pytest.raises(ValueError, match=match):
    MosaicBatchedConfig(**kwargs)


def test_stated_merge_tiles_without_two_warpgroups_on_n_is_refused():
  """merge_tiles=True where the plan has one computing warpgroup: Mosaic refuses the
  walk, with the reason."""
  shapes = backend.WalkShapes(batch=16, steps=7, greedy=True)
  refusal = mosaic_batched_backend.plan(
      _head(), shapes, MosaicBatchedConfig(warpgroups=1, merge_tiles=True), H200)
  assert isinstance(refusal, backend.Refusal)
  assert "merge_tiles needs two computing warpgroups" in refusal.reason


def test_planner_gathers_int8_planes_rows_by_four_warps_on_m_only():
  """The measured choice (``auto_warp_gather``): int8 planes on M (64 rows, greedy and
  sampled) gather z by the leader's four warps; on N (16 rows), and bf16 on M, one
  thread issues the copies."""
  planes = jax.eval_shape(lambda h: quantize_w2(h, "int8", state="planes"), _head())

  def plan(head, batch, greedy=True):
    shapes = backend.WalkShapes(batch=batch, steps=7, greedy=greedy)
    return mosaic_batched_backend.plan(head, shapes, MosaicBatchedConfig(), H200).plan
  for greedy in (True, False):
    on_m = plan(planes, 64, greedy)
    assert on_m.batch_axis == "m" and on_m.warp_gather
  assert not plan(_head(), 64).warp_gather
  on_n = plan(planes, 16)
  if on_n.batch_axis == "n":
    assert not on_n.warp_gather


def test_a_one_slot_ring_never_overlaps_chunks(monkeypatch):
  """Overlapped, a chunk's slot is awaited before the chunk before it releases its own:
  with one ring slot the warpgroup would wait on itself for ever (a 1-slot ring asked
  for at 16 rows hung on the H200). The planner computes such a plan's chunks in turn,
  and a plan built with both is refused naming the values."""
  monkeypatch.setattr(mosaic_batched_backend, "BATCH_ON_N_LOWERS", True)   # (either jax)
  planes = jax.eval_shape(lambda h: quantize_w2(h, "int8", state="planes"), _head())
  shapes = backend.WalkShapes(batch=16, steps=7, greedy=True)
  plans = {stages: mosaic_batched_backend.plan(
      planes, shapes, MosaicBatchedConfig(batch_axis="n", ring_stages=stages), H200).plan
           for stages in (1, 2)}
  assert plans[1].ring_stages == 1 and plans[1].streamed_chunks > 0
  assert plans[1].overlap_chunks == 0
  assert plans[2].overlap_chunks == 2   # (two slots overlap, as measured)
  with pytest.raises(ValueError, match=r"overlap_chunks=2 .*ring_stages=1"):
    dataclasses.replace(plans[1], overlap_chunks=2)
  # Every chunk resident: no ring, nothing awaited on one, the overlap stays.
  resident = dataclasses.replace(plans[2], resident_chunks=plans[2].wg_chunks,
                                 ring_stages=0)
  assert resident.overlap_chunks == 2


def test_int8_planes_at_rank_64_go_on_m():
  """At r = 64 int8 planes with the batch on N do not lower (Mosaic has no conflict-free
  copy for the z staging): the planner puts them on M at every batch, and a config that
  asks for N gets a refusal naming the rank, not a lowering error."""
  plan = mosaic_batched_backend.plan
  planes = jax.eval_shape(lambda h: quantize_w2(h, "int8", state="planes"),
                          _head(rank=64, vocab=712))
  for batch in (2, 8, 32):
    shapes = backend.WalkShapes(batch=batch, steps=7, greedy=True)
    spec = plan(planes, shapes, MosaicBatchedConfig(), H200)
    assert spec.plan.batch_axis == "m", batch
  refused = plan(planes, backend.WalkShapes(batch=8, steps=7, greedy=True),
                                MosaicBatchedConfig(batch_axis="n"), H200)
  assert isinstance(refused, backend.Refusal)
  if mosaic_batched_backend.BATCH_ON_N_LOWERS:   # (jax 0.10 refuses N for every walk first)
    assert "rank=64" in refused.reason, refused.reason
  at_128 = jax.eval_shape(lambda h: quantize_w2(h, "int8", state="planes"),
                          _head(rank=128, vocab=712))
  spec = plan(at_128, backend.WalkShapes(batch=8, steps=7, greedy=True),
                             MosaicBatchedConfig(), H200)
  assert spec.plan.batch_axis == ("n" if mosaic_batched_backend.BATCH_ON_N_LOWERS else "m")
