"""The stacked int8-planes walk (``wts_jax.pallas.stacked``): its plan on any JAX;
every option's CUDA lowering, and its inline PTX assembled where ptxas is; its kernel in
Mosaic GPU interpret mode (jax >= 0.11) against the XLA reference walk — both request
layouts (one block of 32 requests over four phases, two over two with shared rings), V
not a multiple of 64, greedy and sampled (the same key), a NaN reported; on the GPU
(``-m gpu``) at the Qwen3-4B shape, B 5 to 64."""

import dataclasses
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from mosaic_checks import assert_mosaic_matches_xla, planes_head
from wts_jax.inputs import random_inputs
from wts_jax.output import STATUS_NAN_LOGITS, STATUS_TOKEN_OUT_OF_RANGE
from wts_jax.pallas.stacked.launch import stacked_walk
from wts_jax.pallas.stacked.operands import BASE_SLOT_BYTES
from wts_jax.pallas.stacked.plan import StackedPlan, WARPGROUPS, fixed_smem_bytes, plan_stacked, tile_bytes
from wts_jax.pallas.stacked.spec import StackedLab, StackedSpec, w1_planes_operand, w2_operand
from wts_jax.pallas.head_operands import serial_operands
from wts_jax.validation import make_sampling

pytestmark = pytest.mark.mosaic

H200_SMEM = 232448
NEEDS_INTERPRETER = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11),
    reason="jax 0.10's Mosaic GPU interpreter cannot run tiled shared-memory loads")
ON_GPU = bool(os.environ.get("WTS_GPU_TESTS"))


LAB_FIELDS = {field.name for field in dataclasses.fields(StackedLab)}


def _spec(plan, batch, steps, **options):
  """A ``StackedSpec`` with ``options``, those of ``StackedLab`` in its lab overlay."""
  lab = {name: options.pop(name) for name in list(options) if name in LAB_FIELDS}
  return StackedSpec(plan, batch, steps, lab=StackedLab(**lab), **options)


def _walk(head, base, first, *, num_blocks, interpret, spec_options=None, temperature=0.0,
          key=None, **plan_options):
  plan = plan_stacked(vocab_size=head.config.vocab_size, rank=head.config.rank,
                      batch=base.shape[0], num_blocks=num_blocks,
                      smem_per_block=H200_SMEM, **plan_options)
  mode = make_sampling(temperature, key, base.shape[0])
  spec = _spec(plan, base.shape[0], base.shape[1], interpret=interpret,
               greedy=mode.greedy, **(spec_options or {}))
  ops = serial_operands(head, None)
  sampling = None if mode.greedy else (mode.score_scale, mode.noise_on, mode.seed)
  tokens, status = jax.jit(lambda *a: stacked_walk(spec, *a, sampling=sampling))(
      w2_operand(spec, ops), base, w1_planes_operand(spec, ops), first, ops["w2_scale"],
      ops["w1_plane_scale"])
  return np.asarray(tokens), int(status), plan


def _assert_walk_equals_the_reference(head, base, first, *, temperature=0.0, key=None,
                                      **walk_options):
  """The stacked walk (``_walk``'s options) gives the XLA walk's tokens, status clean."""
  want = np.asarray(wts_jax.walk(head, base, first, None, impl="xla",
                                 temperature=temperature, key=key).tokens)
  tokens, status, _ = _walk(head, base, first, temperature=temperature, key=key,
                            **walk_options)
  assert status == 0
  np.testing.assert_array_equal(tokens, want)


# --- the head's W1 in the threads' load order ----------------------------------------------
def test_the_head_carries_w1_in_fragment_order_and_the_api_reads_it():
  """``W1Planes.fragments`` is ``int8_state.fragment_ordered`` of the head's planes (each
  row's bytes moved, none lost), and the API's GPU plan reads it; interpreted, rows."""
  from wts_jax.int8_state import fragment_ordered
  from wts_jax.pallas import backend, mosaic_stacked_backend
  head, config = planes_head(1000)
  ops = serial_operands(head, None)
  planes, fragments = np.asarray(ops["w1_planes"]), np.asarray(ops["w1_fragments"])
  assert fragments.shape == planes.shape == (2000, config.rank)
  want = np.asarray(fragment_ordered(jnp.asarray(planes).reshape(1000, -1)))
  np.testing.assert_array_equal(fragments.reshape(1000, -1), want)
  np.testing.assert_array_equal(np.sort(fragments.reshape(1000, -1), axis=1),
                                np.sort(planes.reshape(1000, -1), axis=1))
  # a thread's first register of a row: plane bytes 16t + 4g + j, t = 0, g = 1 → 4..7
  np.testing.assert_array_equal(fragments.reshape(1000, -1)[:, config.rank // 4:
                                                            config.rank // 4 + 4],
                                planes.reshape(1000, -1)[:, 4:8])
  base = jax.ShapeDtypeStruct((16, 7, 1000), jnp.bfloat16)
  shapes = backend.WalkShapes.of(base, greedy=True)
  stacked, interpret = wts_jax.MosaicStackedConfig(), wts_jax.MosaicStackedConfig(
      interpret=True)
  gpu = mosaic_stacked_backend.plan(head, shapes, stacked, wts_jax.device.H200)
  interpreted = mosaic_stacked_backend.plan(head, shapes, interpret, wts_jax.device.H200)
  assert gpu.w1_order == "fragments" and interpreted.w1_order == "rows"
  # W2 in its threads' rows: held by a head whose V is a multiple of 64, read by the
  # GPU plan wherever it has base slots (async copies at B <= 32, TMA above).
  assert not hasattr(head.markov_head.markov_w2, "thread_rows") and gpu.w2_order == "rows"
  from wts_jax.int8_state import thread_rows_ordered
  head, _ = planes_head(1024)
  w2 = head.markov_head.markov_w2
  np.testing.assert_array_equal(np.asarray(serial_operands(head, None)["w2_thread_rows"]),
                                np.asarray(thread_rows_ordered(w2.weight[...])))
  for batch, order in ((16, "thread_rows"), (32, "thread_rows"), (64, "thread_rows")):
    base = jax.ShapeDtypeStruct((batch, 7, 1024), jnp.bfloat16)
    plan = mosaic_stacked_backend.plan(head, backend.WalkShapes.of(base, greedy=True),
                                       stacked, wts_jax.device.H200)
    assert plan.w2_order == order, batch
  interpreted = mosaic_stacked_backend.plan(
      head, backend.WalkShapes.of(base, greedy=True), interpret, wts_jax.device.H200)
  assert interpreted.w2_order == "rows"   # (no base slots in interpret mode)


# --- the plan ---------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [{}, dict(base_slots=2),
                                   dict(base_slots=2, base_copies="tma")],
                         ids=["defaults", "async-base", "tma-base"])
def test_the_plan_deals_the_qwen3_tiles_to_four_phases_or_two(extra):
  # (a shared ring of two slots above 32 rows; of one with the base logits by TMA)
  for batch, phases, stages in ((16, 4, 1),
                                (64, 2, 1 if extra.get("base_copies") == "tma" else 2)):
    plan = plan_stacked(vocab_size=151936, rank=256, batch=batch, num_blocks=132,
                        smem_per_block=H200_SMEM, **extra)
    assert plan.tiles == 18 and plan.phases == phases and plan.ring_stages == stages
    assert sum(len(plan.phase_tiles(p)) for p in range(phases)) == 18
    # Shared memory full: one more tile would not fit beside the fixed parts (with the
    # base slots).
    staged = WARPGROUPS * plan.base_slots * BASE_SLOT_BYTES
    used = plan.slots * tile_bytes(256) + fixed_smem_bytes(18, staged) + 3072
    assert used <= H200_SMEM < used + tile_bytes(256)
    for p in range(phases):
      order = plan.order(p)
      assert sorted(t for t, _, _ in order) == plan.phase_tiles(p)
      assert sum(kind for _, kind, _ in order) == plan.streamed(p)
      if plan.streamed(p):
        assert order[0][1], "a phase's first tile is streamed (it arrives in the exchange)"


def test_the_plan_names_what_it_cannot_do():
  with pytest.raises(ValueError, match="batch=65"):
    plan_stacked(vocab_size=1000, rank=256, batch=65, num_blocks=1,
                 smem_per_block=H200_SMEM)
  with pytest.raises(ValueError, match="vocab_size=1001"):
    plan_stacked(vocab_size=1001, rank=256, batch=4, num_blocks=1,
                 smem_per_block=H200_SMEM)
  with pytest.raises(ValueError, match="resident=40"):
    plan_stacked(vocab_size=151936, rank=256, batch=4, num_blocks=132,
                 smem_per_block=H200_SMEM, resident=40)
  plan = plan_stacked(vocab_size=1000, rank=256, batch=4, num_blocks=1,
                      smem_per_block=H200_SMEM)
  with pytest.raises(ValueError, match="w1_order='k_halves'"):
    StackedSpec(plan, 4, 2, w1_order="k_halves")
  with pytest.raises(ValueError, match="'narrow_mma': GPU only"):
    _spec(plan, 4, 2, interpret=True, timing_ablation="narrow_mma")
  with pytest.raises(ValueError, match="timing_ablation='slow'"):
    StackedLab(timing_ablation="slow")
  with pytest.raises(ValueError, match="status='summed'"):
    StackedSpec(plan, 4, 2, status="summed")
  with pytest.raises(ValueError, match="ring_stages=0"):
    StackedPlan(vocab_size=1000, rank=256, num_blocks=1, tiles=16, request_blocks=1,
                resident=(1, 1, 1, 1), ring_stages=0)


# --- the kernel, lowered for CUDA (no GPU needed) ------------------------------------------
LOWERED_OPTIONS = [dict(), dict(w1_order="fragments"), dict(greedy=False),
                   dict(prefetch_base=True), dict(plan=dict(base_slots=2)),
                   dict(greedy=False, plan=dict(base_slots=2)), dict(plan=dict(base_slots=3)),
                   dict(plan=dict(base_slots=2, base_copies="tma")),
                   dict(greedy=False, plan=dict(base_slots=3, base_copies="tma")),
                   dict(rotate_warps=True, skip_idle_warps=True,
                        plan=dict(base_slots=2, base_copies="tma")),
                   dict(greedy=False, rotate_warps=True, skip_idle_warps=True,
                        plan=dict(base_slots=2)),
                   dict(dependent_launch=True),
                   dict(timing_ablation="base", rotate_warps=True, skip_idle_warps=True,
                        plan=dict(base_slots=2, base_copies="tma")),
                   dict(timing_ablation="base", plan=dict(base_slots=2)),
                   dict(status="kernel", rotate_warps=True, skip_idle_warps=True,
                        plan=dict(base_slots=2, base_copies="tma")),
                   dict(timing_ablation="fold"),
                   dict(timing_ablation="narrow_mma", rotate_warps=True, skip_idle_warps=True,
                        plan=dict(base_slots=2))]


def _lowered_for_cuda(spec: StackedSpec) -> str:
  """The walk of ``spec`` at the Qwen3-4B shape lowered for CUDA (no GPU needed): the
  StableHLO text, the kernel's Mosaic module in it."""
  import sys
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import cuda_target
  vocab, rank, batch = spec.plan.vocab_size, spec.plan.rank, spec.batch
  shapes = ((vocab, rank), jnp.int8), ((batch, 7, vocab), jnp.bfloat16), \
      ((2 * vocab, rank), jnp.int8), ((batch,), jnp.int32), ((vocab,), jnp.float32), \
      ((vocab,), jnp.float32)
  args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
  sampling = None if spec.greedy else (
      jax.ShapeDtypeStruct((batch,), jnp.float32), jax.ShapeDtypeStruct((batch,), bool),
      jax.ShapeDtypeStruct((2,), jnp.uint32))
  with cuda_target():
    return jax.jit(lambda *a: stacked_walk(spec, *a[:6], sampling=a[6])).trace(
        *args, sampling).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("batch", [5, 64])
@pytest.mark.parametrize("options", LOWERED_OPTIONS,
                         ids=["defaults", "fragments", "sampled", "prefetch-base",
                              "async-base", "async-base-sampled", "async-base-3",
                              "tma-base", "tma-base-3-sampled", "rotated-skip-tma",
                              "rotated-skip-async-sampled", "dependent-launch",
                              "no-base-tma", "no-base-async", "status-in-kernel",
                              "fold-ablation", "narrow-mma-ablation"])
def test_every_option_lowers_for_cuda_at_the_qwen3_shape(options, batch):
  """Each option's kernel builds (its inline PTX and Mosaic ops) at the Qwen3-4B shape,
  the lab overlay's (``StackedLab``) too; a dependent launch waits first, and only it."""
  options = dict(options)
  plan = plan_stacked(vocab_size=151936, rank=256, batch=batch, num_blocks=132,
                      smem_per_block=H200_SMEM, **options.pop("plan", {}))
  spec = _spec(plan, batch, 7, **options)
  text = _lowered_for_cuda(spec)
  assert "mosaic_gpu" in text
  if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 11):
    # (jax 0.10 serializes the kernel's module: its PTX is not in the text)
    assert ("griddepcontrol.wait" in text) == bool(options.get("dependent_launch"))
  # The status: one word out of the kernel, or a word a warpgroup reduced after it.
  assert ("reduce" in text.split("mosaic_gpu")[-1]) != (spec.status == "kernel")


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA's assembler)")
def test_the_inline_ptx_assembles():
  """Every inline-asm block the kernel builds, under every option, assembles for sm_90a
  (``tools/inline_ptx_check.py``): PTX that only the GPU's compile would read."""
  import sys
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import inline_ptx_check
  assert len(inline_ptx_check.captured_asm()) >= 10   # (the kernel's own, captured)
  failures = inline_ptx_check.check()
  assert not failures, failures[0]


# --- the kernel, interpreted --------------------------------------------------------------
@NEEDS_INTERPRETER
@pytest.mark.parametrize("batch,resident", [(5, None), (40, None), (32, 0)])
def test_interpreted_tokens_equal_the_reference(batch, resident):
  """V = 1000 (not a multiple of 64: the last tiles clamped); B 5 and 32 on four phases
  (one of them with every tile streamed), 40 on two phases with shared rings."""
  head, config = planes_head(1000)
  base, first, _ = random_inputs(config, batch, 3, jax.random.key(batch))
  _assert_walk_equals_the_reference(head, base, first, num_blocks=1, interpret=True,
                                    resident=resident)


@NEEDS_INTERPRETER
@pytest.mark.parametrize("batch,temperature", [(5, 0.8), (40, np.array([0.7, 0.0] * 20))],
                         ids=["5-sampled", "40-mixed"])
def test_interpreted_sampled_walk_equals_the_reference(batch, temperature):
  """Gumbel-max with the reference's noise, the same key: four phases at B 5; two at
  B 40 with every other row greedy (no noise, scale 1)."""
  head, config = planes_head(1000, seed=batch)
  base, first, _ = random_inputs(config, batch, 3, jax.random.key(batch + 1))
  _assert_walk_equals_the_reference(head, base, first, temperature=temperature,
                                    key=jax.random.key(11), num_blocks=1, interpret=True)


@NEEDS_INTERPRETER
@pytest.mark.parametrize("status", ["flags", "kernel"])
def test_interpreted_walk_reports_nan_and_first_tokens_out_of_range(status):
  head, config = planes_head(512)
  base, first, _ = random_inputs(config, 5, 2, jax.random.key(3))
  _, clean, _ = _walk(head, base, first, num_blocks=1, interpret=True,
                      spec_options=dict(status=status))
  assert clean == 0
  base = base.at[2, 1, 17].set(jnp.nan)
  first = first.at[4].set(512)
  _, status, _ = _walk(head, base, first, num_blocks=1, interpret=True,
                       spec_options=dict(status=status))
  assert status & STATUS_NAN_LOGITS and status & STATUS_TOKEN_OUT_OF_RANGE


@NEEDS_INTERPRETER
def test_interpreted_walk_with_the_status_in_the_kernel_equals_the_reference():
  head, config = planes_head(1000)
  base, first, _ = random_inputs(config, 40, 3, jax.random.key(41))
  _assert_walk_equals_the_reference(head, base, first, num_blocks=1, interpret=True,
                                    spec_options=dict(status="kernel"))


# --- through the API: MosaicStackedConfig() --------------------------------------
def test_the_backend_refuses_what_the_stacked_kernel_does_not_run():
  from wts_jax.pallas import backend, mosaic_stacked_backend
  head, config = planes_head(1000)
  base, first, _ = random_inputs(config, 5, 2, jax.random.key(0))
  stacked = wts_jax.MosaicStackedConfig(interpret=True)
  sampled = mosaic_stacked_backend.plan(head, backend.WalkShapes.of(base, greedy=False),
                                        stacked, wts_jax.device.H200)
  assert isinstance(sampled, StackedSpec) and not sampled.greedy
  bf16_head = wts_jax.make_head(config, seed=0)
  refusal = mosaic_stacked_backend.plan(bf16_head, backend.WalkShapes.of(base, greedy=True),
                                        stacked, wts_jax.device.H200)
  assert isinstance(refusal, backend.Refusal) and "int8 planes" in refusal.reason
  spec = mosaic_stacked_backend.plan(head, backend.WalkShapes.of(base, greedy=True),
                                     stacked, wts_jax.device.H200)
  assert isinstance(spec, StackedSpec) and spec.plan.num_blocks == 1


def test_auto_takes_the_stacked_kernel_for_a_greedy_int8_planes_walk():
  """``impl="mosaic"`` on the GPU (a plan: no kernel runs): the stacked kernel for the
  greedy int8-planes walk from ``STACKED_MIN_BATCH`` (one) row, its planner's choices;
  the batched kernel when sampled (the row kernel at one sampled row)."""
  from wts_jax.pallas import backend, preference
  from wts_jax.pallas.batched.spec import BatchedSpec
  head, config = planes_head(151936)
  assert preference.STACKED_MIN_BATCH == 1

  def spec(batch, greedy=True):
    base = jax.ShapeDtypeStruct((batch, 7, 151936), jnp.bfloat16)
    return backend.choose(head, backend.WalkShapes.of(base, greedy=greedy), "mosaic",
                          require_gpu=False, device=wts_jax.device.H200).plan
  for batch in (1, 2, 5, 16, 40, 64, 70):
    chosen = spec(batch)
    assert isinstance(chosen, StackedSpec) and chosen.batch == batch
    assert chosen.plan.num_blocks == 132
    # The base logits by async copies, by TMA above 32 rows; W1 in the threads' load
    # order; the warps rotated, those past the batch idle (``docs/decisions.md``).
    assert chosen.plan.base_slots == 2 and chosen.w1_order == "fragments"
    assert chosen.plan.base_copies == ("tma" if batch > 32 else "threads")
    assert chosen.rotate_warps and chosen.skip_idle_warps
    assert chosen.lab == StackedLab()
  assert isinstance(spec(16, greedy=False), BatchedSpec)
  # One sampled row: the row kernel.
  assert not isinstance(spec(1, greedy=False), (StackedSpec, BatchedSpec))


@NEEDS_INTERPRETER
@pytest.mark.parametrize("batch, temperature", [(5, 0.0), (70, 0.0), (5, 0.8), (70, 0.8)])
def test_the_api_walk_on_the_stacked_kernel_equals_the_reference(batch, temperature):
  """``wts_jax.walk`` with ``MosaicStackedConfig`` (interpret mode): one launch at
  B 5, two (64 + 6 rows) at B 70; greedy and sampled (the rows' keys carried across
  the launches)."""
  head, config = planes_head(512, seed=batch)
  base, first, _ = random_inputs(config, batch, 2, jax.random.key(batch))
  assert_mosaic_matches_xla(head, base, first, None, "auto", temperature, kernel="stacked")


# --- the kernel on the GPU --------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
@pytest.mark.parametrize("batch", [1, 5, 16, 33, 64])
def test_gpu_tokens_equal_the_reference(batch):
  head, config = planes_head(151936, seed=batch)
  base, first, _ = random_inputs(config, batch, 7, jax.random.key(batch + 100))
  _assert_walk_equals_the_reference(head, base, first, num_blocks=132, interpret=False)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
@pytest.mark.parametrize("batch", [5, 16, 40, 64])
def test_gpu_sampled_tokens_equal_the_reference(batch):
  """A sampled walk (every third row greedy) with the reference's key: the same tokens
  (the kernel's noise is within 2^-20 of XLA's: ``sampling.KERNEL_NOISE_TOLERANCE``)."""
  head, config = planes_head(151936, seed=batch)
  base, first, _ = random_inputs(config, batch, 7, jax.random.key(batch + 200))
  temperature = np.where(np.arange(batch) % 3 == 2, 0.0, 0.8).astype(np.float32)
  _assert_walk_equals_the_reference(head, base, first, temperature=temperature,
                                    key=jax.random.key(batch + 300), num_blocks=132,
                                    interpret=False)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
@pytest.mark.parametrize("batch, temperature", [(16, 0.0), (70, 0.0), (16, 0.8), (70, 0.8)])
def test_gpu_api_walk_on_the_stacked_kernel_equals_the_reference(batch, temperature):
  """``wts_jax.walk`` with ``MosaicStackedConfig`` on the GPU: W1 from the head's
  fragment-ordered copy, two launches at B 70 (64 + 6 rows), greedy and sampled."""
  from mosaic_checks import assert_walk_matches, mosaic_and_xla_walks
  head, config = planes_head(151936, seed=batch)
  base, first, _ = random_inputs(config, batch, 7, jax.random.key(batch + 400))
  config = wts_jax.MosaicStackedConfig()
  assert_walk_matches(*mosaic_and_xla_walks(
      head, base, first, None, impl="pallas", config=config, temperature=temperature,
      key=jax.random.key(batch + 500) if temperature else None))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
@pytest.mark.parametrize("batch", [16, 40])
@pytest.mark.parametrize("options", [
    dict(w1_order="fragments"),
    dict(w1_order="fragments", prefetch_base=True),
    dict(w1_order="fragments", plan=dict(base_slots=2)),
    dict(w1_order="fragments", plan=dict(base_slots=3)),
    dict(w1_order="fragments", plan=dict(base_slots=2, base_copies="tma")),
    dict(w1_order="fragments", plan=dict(base_slots=3, base_copies="tma")),
    dict(w1_order="fragments", rotate_warps=True, skip_idle_warps=True),
    dict(w1_order="fragments", rotate_warps=True, skip_idle_warps=True,
         plan=dict(base_slots=2, base_copies="tma")),
    dict(w1_order="fragments", rotate_warps=True, skip_idle_warps=True,
         plan=dict(base_slots=2)),
    dict(w1_order="fragments", dependent_launch=True),
    dict(w1_order="fragments", rotate_warps=True, skip_idle_warps=True, status="kernel",
         plan=dict(base_slots=2)),
    dict(w1_order="fragments", rotate_warps=True, skip_idle_warps=True, status="kernel",
         plan=dict(base_slots=2, base_copies="tma"))],
    ids=["fragments", "prefetch-base", "async-base", "async-base-3", "tma-base",
         "tma-base-3", "rotated-skip", "rotated-skip-tma", "rotated-skip-async",
         "dependent-launch", "status-in-kernel-async", "status-in-kernel-tma"])
def test_gpu_options_keep_the_tokens(options, batch):
  head, config = planes_head(151936, seed=3)
  base, first, _ = random_inputs(config, batch, 7, jax.random.key(batch))
  options = dict(options)
  _assert_walk_equals_the_reference(head, base, first, num_blocks=132, interpret=False,
                                    **options.pop("plan", {}), spec_options=options)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
@pytest.mark.parametrize("status", ["flags", "kernel"])
@pytest.mark.parametrize("batch,row", [(16, 7), (40, 35)], ids=["first-warp", "second-warp"])
def test_gpu_walk_reports_nan(status, batch, row):
  """A NaN in one block's columns at the last step (and in another's at the first):
  reported, whichever block holds it and whichever warp publishes its request (the
  flag is stored by the request's thread, read by another)."""
  head, config = planes_head(151936)
  base, first, _ = random_inputs(config, batch, 3, jax.random.key(5))
  options = dict(num_blocks=132, interpret=False,
                 spec_options=dict(status=status))
  _, clean, _ = _walk(head, base, first, **options)
  assert clean == 0
  _, status_word, _ = _walk(head, base.at[row, 2, 90001].set(jnp.nan), first, **options)
  assert status_word & STATUS_NAN_LOGITS
  _, status_word, _ = _walk(head, base.at[row - 4, 0, 151000].set(jnp.nan), first,
                            **options)
  assert status_word & STATUS_NAN_LOGITS


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
@pytest.mark.parametrize("status", ["flags", "kernel"])
def test_gpu_first_tokens_out_of_range_clamped_and_reported(status):
  """First tokens past V and below 0 are reported and walked from V - 1 and 0, as the
  reference clamps them."""
  head, config = planes_head(151936, seed=9)
  base, first, _ = random_inputs(config, 20, 4, jax.random.key(9))
  first = first.at[3].set(151936).at[11].set(-5)
  # (the API refuses such concrete ids up front: the reference walks the clamped ones)
  want = wts_jax.walk(head, base, jnp.clip(first, 0, 151935), None, impl="xla")
  tokens, status, _ = _walk(head, base, first, num_blocks=132, interpret=False,
                            spec_options=dict(status=status))
  assert status & STATUS_TOKEN_OUT_OF_RANGE
  np.testing.assert_array_equal(tokens, np.asarray(want.tokens))


# --- W2 in thread-rows order: a thread's base logits as two 16-byte copies --------------
def test_thread_rows_order_gives_each_thread_sixteen_consecutive_rows():
  from wts_jax.int8_state import thread_rows_ordered
  w2 = jnp.arange(128, dtype=jnp.int32)[:, None] * jnp.ones((1, 3), jnp.int32)
  ordered = np.asarray(thread_rows_ordered(w2))[:, 0]
  for tile in range(2):
    for t in range(4):   # (a thread's columns 8j + 2t + e: rows 16t + 2j + e)
      columns = [8 * j + 2 * t + e for j in range(8) for e in range(2)]
      np.testing.assert_array_equal(ordered[tile * 64 + np.array(columns)],
                                    tile * 64 + 16 * t + np.arange(16))
  plan = plan_stacked(vocab_size=1000, rank=32, batch=5, num_blocks=1,
                      smem_per_block=H200_SMEM)
  with pytest.raises(ValueError, match="thread_rows"):
    StackedSpec(plan, 5, 3, interpret=True, w2_order="thread_rows")   # (V % 64)
  plan = plan_stacked(vocab_size=151936, rank=256, batch=16, num_blocks=132,
                      smem_per_block=H200_SMEM)
  with pytest.raises(ValueError, match="thread_rows"):
    StackedSpec(plan, 16, 7, w2_order="thread_rows")   # (no base slots on the GPU)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_thread_rows_walk_lowers_for_cuda(greedy):
  plan = plan_stacked(vocab_size=151936, rank=256, batch=16, num_blocks=132,
                      smem_per_block=H200_SMEM, base_slots=2)
  spec = StackedSpec(plan, 16, 7, w1_order="fragments", w2_order="thread_rows",
                     rotate_warps=True, skip_idle_warps=True, status="kernel",
                     greedy=greedy)
  text = _lowered_for_cuda(spec)
  assert "mosaic_gpu" in text
  if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 11):
    assert "cp.async.cg.shared.global" in text


@pytest.mark.parametrize("batch,options", [
    (64, dict(plan=dict(base_slots=2, base_copies="tma"))),
    (40, dict(greedy=False, plan=dict(base_slots=2, base_copies="tma"))),
    (16, dict(base_vector_reads=True, plan=dict(base_slots=2)))],
    ids=["tma-64", "tma-40-sampled", "vector-reads-16"])
def test_thread_rows_with_tma_slots_or_vector_reads_lowers_for_cuda(batch, options):
  """W2 in its threads' rows with the base logits by TMA (the slot's swizzled chunks read
  as two 16-byte loads) or the async slots read so (``base_vector_reads``)."""
  options = dict(options)
  plan = plan_stacked(vocab_size=151936, rank=256, batch=batch, num_blocks=132,
                      smem_per_block=H200_SMEM, **options.pop("plan"))
  spec = _spec(plan, batch, 7, w1_order="fragments", w2_order="thread_rows",
               rotate_warps=True, skip_idle_warps=True, status="kernel", **options)
  text = _lowered_for_cuda(spec)
  assert "mosaic_gpu" in text
  if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 11):
    assert "ld.shared.v4.b32" in text
  with pytest.raises(ValueError, match="base_vector_reads"):
    _spec(plan, batch, 7, base_vector_reads=True)


@NEEDS_INTERPRETER
@pytest.mark.parametrize("batch,temperature", [(5, 0.0), (40, 0.0), (9, 0.8)])
def test_interpreted_thread_rows_walk_equals_the_reference(batch, temperature):
  """V = 1024 (a multiple of 64): W2's tiles in thread-rows order, the fold's columns
  mapped back to their rows: the reference's tokens, greedy and sampled."""
  head, config = planes_head(1024, seed=batch)
  base, first, _ = random_inputs(config, batch, 3, jax.random.key(batch + 90))
  _assert_walk_equals_the_reference(
      head, base, first, num_blocks=1, interpret=True, temperature=temperature,
      key=jax.random.key(8) if temperature else None,
      spec_options=dict(w2_order="thread_rows"))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
@pytest.mark.parametrize("batch,temperature", [(1, 0.0), (5, 0.0), (16, 0.0), (12, 0.8),
                                               (32, 0.0)])
def test_gpu_thread_rows_walk_keeps_the_tokens(batch, temperature):
  head, config = planes_head(151936, seed=batch + 11)
  base, first, _ = random_inputs(config, batch, 7, jax.random.key(batch + 95))
  _assert_walk_equals_the_reference(
      head, base, first, num_blocks=132, interpret=False, base_slots=2,
      temperature=temperature, key=jax.random.key(6) if temperature else None,
      spec_options=dict(w1_order="fragments", w2_order="thread_rows", rotate_warps=True,
                        skip_idle_warps=True, status="kernel"))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
@pytest.mark.parametrize("batch,temperature,plan,vector", [
    (40, 0.0, dict(base_slots=2, base_copies="tma"), False),
    (64, 0.0, dict(base_slots=2, base_copies="tma"), False),
    (64, 0.8, dict(base_slots=2, base_copies="tma"), False),
    (16, 0.0, dict(base_slots=2), True), (5, 0.8, dict(base_slots=2), True)],
    ids=["tma-40", "tma-64", "tma-64-sampled", "vector-reads-16", "vector-reads-5-sampled"])
def test_gpu_thread_rows_tma_or_vector_reads_keep_the_tokens(batch, temperature, plan,
                                                             vector):
  head, config = planes_head(151936, seed=batch + 13)
  base, first, _ = random_inputs(config, batch, 7, jax.random.key(batch + 97))
  _assert_walk_equals_the_reference(
      head, base, first, num_blocks=132, interpret=False, **plan,
      temperature=temperature, key=jax.random.key(9) if temperature else None,
      spec_options=dict(w1_order="fragments", w2_order="thread_rows", rotate_warps=True,
                        skip_idle_warps=True, status="kernel", base_vector_reads=vector))


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs the GPU (WTS_GPU_TESTS=1)")
def test_gpu_thread_rows_walk_reports_nan():
  head, config = planes_head(151936)
  base, first, _ = random_inputs(config, 16, 3, jax.random.key(7))
  options = dict(num_blocks=132, interpret=False, base_slots=2,
                 spec_options=dict(w1_order="fragments", w2_order="thread_rows",
                                   rotate_warps=True, skip_idle_warps=True, status="kernel"))
  _, clean, _ = _walk(head, base, first, **options)
  assert clean == 0
  for row, step, column in ((7, 2, 90001), (12, 0, 151935), (3, 1, 40)):
    _, status_word, _ = _walk(head, base.at[row, step, column].set(jnp.nan), first,
                              **options)
    assert status_word & STATUS_NAN_LOGITS, (row, step, column)
