"""The Mosaic GPU kernel's own code on the CPU: its plan, its CUDA lowering at the real
shape (132 blocks), and its walk in Mosaic GPU interpret mode against the oracles.

One variant lowers here but cannot be interpreted: the WGMMA GEMV of an int8 W2, whose A
operand is the chunk upcast in registers (the interpreter's WGMMA takes shared-memory
operands only). Its schedule and grouping are the bf16 WGMMA's, interpreted below; its
tokens are checked on the GPU (tests/test_walk_gpu.py).

Interpret mode runs blocks one after another and has no semaphores, so the walk runs
here with one block owning every chunk (the barrier is compiled out); the GPU suite
covers the 132-block exchange. jax 0.10.2's Mosaic GPU interpreter cannot run tiled
shared-memory loads, so the interpret cases need jax >= 0.11.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import numpy_oracle
import wts_jax
from mosaic_checks import assert_mosaic_matches_xla, interpreted_config
from wts_jax import sampling
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.device import H200
from wts_jax.pallas import backend, mosaic_plan
from wts_jax.pallas.row.launch import row_walk
from wts_jax.pallas.row.spec import RowSpec
from wts_jax.quantize import quantize_w2

pytestmark = pytest.mark.mosaic

H200_SMEM = 232448
NEEDS_INTERPRETER = pytest.mark.skipif(
    tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11),
    reason="jax 0.10's Mosaic GPU interpreter cannot run tiled shared-memory loads")


# The walks each kernel variant is checked on: everything resident (r = 64: for int8,
# 64-byte rows and a 64-byte swizzle); V % 64 = 8 with the clamped last chunk, all
# streamed, B = 3; sampled with one resident chunk + the ring.
WALK_CASES = [(1000, 64, 1, 4, "auto", 0.0), (520, 128, 3, 3, "none", 0.0),
              (1000, 64, 2, 3, 64, 0.8)]


def _case(vocab, rank, batch, steps, seed=0, confidence=False, head_type="vanilla"):
  config = HeadConfig(vocab_size=vocab, rank=rank, hidden_size=48, head_type=head_type,
                      confidence=confidence)
  head = wts_jax.make_head(config, seed=seed)
  return head, random_inputs(config, batch, steps, jax.random.key(seed + 1))


def _run(head, base, first, hidden=None, residency="auto", num_stages=None, **kwargs):
  # The row kernel's register GEMV (the WGMMA GEMV, "auto"'s choice, has its own tests
  # below).
  config = wts_jax.MosaicRowConfig(interpret=True, residency=residency,
                                   ring_stages=num_stages, gemv="registers")
  return wts_jax.walk(head, base, first, hidden, impl="mosaic", config=config, **kwargs)


def _interpreted(head, base, temperature=0.0, **options):
  """The interpret-mode config of the Mosaic kernel the planners take for this walk (one
  block; ``mosaic_checks.interpreted_config``)."""
  shapes = backend.WalkShapes.of(base, not temperature)
  return interpreted_config(head, shapes, **options)


# --- the plan (no interpreter needed) -----------------------------------------------
def test_plan_at_the_qwen3_shape_keeps_two_chunks_and_streams_through_two_slots():
  plan = mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                                 smem_per_block=H200_SMEM)
  assert (plan.num_blocks, plan.chunks) == (132, 18)   # 132·18·64 ≥ V
  # 18 chunks do not fit: 2 stay resident, 16 stream through a 2-slot ring (8 whole
  # rounds), the fastest split measured; full residency where it fits (r = 64).
  assert (plan.resident_chunks, plan.ring_stages) == (2, 2)
  assert plan.gemv == "wgmma" and plan.snake
  assert "2-slot TMA ring" in plan.describe() and "snake" in plan.describe()
  # Where 2 resident chunks leave no whole rounds, the next count up that does.
  odd = mosaic_plan.plan_mosaic(vocab_size=17 * 64 * 132, rank=256, num_sms=132,
                                smem_per_block=H200_SMEM)
  assert (odd.chunks, odd.resident_chunks, odd.ring_stages) == (17, 3, 2)
  small = mosaic_plan.plan_mosaic(vocab_size=151936, rank=64, num_sms=132,
                                  smem_per_block=H200_SMEM)
  assert small.resident_chunks == small.chunks and small.ring_stages == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=96), "multiple of 64"),
    (dict(num_blocks=133), "exceeds the 132 SMs"),
    (dict(resident_chunks=6, ring_stages=1, gemv="registers"), "exceed the 6 chunks"),
    (dict(resident_chunks=17, ring_stages=0), "need a ring slot"),
    (dict(resident_chunks=4, ring_stages=3), "whole number of rounds"),
    (dict(vocab_size=700), "multiple of 8"),
])
def test_plan_refuses_what_cannot_run(kwargs, match):
  args = dict(vocab_size=151936, rank=256, num_sms=132, smem_per_block=H200_SMEM)
  with pytest.raises(ValueError, match=match):
    mosaic_plan.plan_mosaic(**{**args, **kwargs})


def chosen_backend(head, batch, config, *, return_logits=False, greedy=True):
  # The kernel impl="pallas" picks, planned as on the H200 (no GPU needed).
  shapes = backend.WalkShapes(batch=batch, steps=3, greedy=greedy,
                              return_logits=return_logits)
  return backend.choose(head, shapes, "pallas", config, require_gpu=False,
                        device=H200).impl


def test_backend_choice_and_clear_refusals():
  head, (base, first, _) = _case(1000, 64, 2, 3)
  assert chosen_backend(head, 1, None) == "mosaic_row"
  assert chosen_backend(head, 1, None, return_logits=True) == "triton"
  assert chosen_backend(head, 2, None) == "mosaic_batched"   # the batched kernel from 2
  assert chosen_backend(head, 128, None) == "triton"  # two batched launches: unmeasured
  assert chosen_backend(head, 1, None, greedy=False) == "mosaic_row"   # when sampling
  # int8 too: the batched kernel where it widens W2 in registers (jax >= 0.11), else the
  # row kernel
  assert chosen_backend(quantize_w2(head, "int8"), 1, None) in ("mosaic_batched",
                                                                  "mosaic_row")
  assert chosen_backend(head, 2, wts_jax.MosaicRowConfig()) == "mosaic_row"
  assert chosen_backend(head, 1, wts_jax.TritonConfig(interpret=True)) == "triton"
  rnn, (rbase, rfirst, rhidden) = _case(1000, 64, 2, 3, head_type="rnn")
  with pytest.raises(ValueError, match="vanilla and gated heads"):
    _run(rnn, rbase, rfirst, rhidden)
  with pytest.raises(ValueError, match="rank=32 must be a multiple of 64"):
    head32, (b32, f32, _) = _case(1000, 32, 1, 3)
    _run(head32, b32, f32)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("greedy", [True, False])
def test_lowers_for_cuda_at_the_qwen3_shape(batch, greedy):
  """The whole 132-block kernel (semaphore barrier, TMA ring, 227 KB of shared memory)
  lowers through Mosaic GPU's layout inference and SMEM checks on the CPU."""
  plan = mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                                 smem_per_block=H200_SMEM, gemv="registers")
  _assert_lowers_at_the_qwen3_shape(plan, batch, greedy)


def _assert_lowers_at_the_qwen3_shape(plan, batch, greedy, steps=7):
  spec = RowSpec(plan=plan, batch=batch, steps=steps, greedy=greedy,
                 spin_limit=1 << 22, interpret=False)
  shape = jax.ShapeDtypeStruct
  quantized = plan.w2_itemsize == 1
  args = [shape((151936, 256), jnp.int8 if quantized else jnp.bfloat16),
          shape((batch, steps, 151936), jnp.bfloat16),
          shape((151936, 256), jnp.bfloat16), shape((batch,), jnp.int32)]
  args += ([shape((2,), jnp.uint32), shape((batch,), jnp.float32),
            shape((batch,), jnp.int32)] if not greedy else [None] * 3)
  args.append(shape((151936,), jnp.float32) if quantized else None)
  if plan.gated:   # gate_proj.weight [r, d + r] (Qwen3-4B: d = 2560), hoisted [B, K, r]
    args += [shape((256, 2560 + 256), jnp.bfloat16), shape((batch, steps, 256), jnp.float32)]
  lowered = jax.jit(lambda *a: row_walk(spec, *a)).trace(*args).lower(
      lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()


# --- the walk in interpret mode ------------------------------------------------------
@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab, rank", [(1000, 64), (520, 128)])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("steps", [1, 7])
def test_greedy_matches_oracles(vocab, rank, batch, steps):
  head, (base, first, hidden) = _case(vocab, rank, batch, steps, confidence=True)
  out = _run(head, base, first, hidden, residency=0.25)
  tokens64, conf64, _ = numpy_oracle.walk(head, base, first, hidden, return_all=True)
  np.testing.assert_array_equal(np.asarray(out.tokens), tokens64)
  np.testing.assert_allclose(np.asarray(out.confidence), conf64, atol=1e-4, rtol=1e-4)
  assert int(out.status) == 0


@NEEDS_INTERPRETER
@pytest.mark.parametrize("residency, stages", [("none", 4), (0.5, 1), ("full", None),
                                               (128, 2), ("auto", None)])
def test_residency_splits_match_reference(residency, stages):
  head, (base, first, _) = _case(1000, 64, 3, 7, seed=2)
  out = _run(head, base, first, residency=residency, num_stages=stages)
  ref = wts_jax.walk(head, base, first, impl="xla")
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens),
                                err_msg=f"residency={residency!r}")


def test_full_residency_that_does_not_fit_is_refused():
  head, (base, first, _) = _case(1000, 128, 1, 3)   # 16 chunks of 16 KB > 227 KB
  with pytest.raises(ValueError, match="residency='full' does not fit"):
    _run(head, base, first, residency="full")


@NEEDS_INTERPRETER
def test_sampled_matches_oracles_bit_for_bit():
  batch, steps, temperature = 3, 7, 0.8
  head, (base, first, _) = _case(1000, 64, batch, steps, seed=5)
  key = jax.random.key(42)
  out = _run(head, base, first, residency=0.5, num_stages=2, temperature=temperature,
             key=key)
  ref = wts_jax.walk(head, base, first, impl="xla", temperature=temperature, key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  noise = jnp.stack([sampling.gumbel_noise(sampling.seed_words(key), jnp.arange(batch),
                                            jnp.asarray(k), jnp.arange(1000))
                     for k in range(steps)], axis=1)   # [B, K, V]
  tokens64 = numpy_oracle.walk(head, base, first, None, temperature=temperature,
                               gumbel=np.asarray(noise, np.float64))
  np.testing.assert_array_equal(np.asarray(out.tokens), tokens64)
  other = _run(head, base, first, residency=0.5, num_stages=2, temperature=temperature,
               key=jax.random.key(43))
  assert (np.asarray(other.tokens) != np.asarray(out.tokens)).mean() > 0.5


@NEEDS_INTERPRETER
def test_per_row_temperature_zero_rows_are_greedy():
  head, (base, first, _) = _case(1000, 64, 4, 7, seed=6)
  temps = jnp.array([0.0, 1.0, 0.0, 2.0], jnp.float32)
  sampled = np.asarray(_run(head, base, first, temperature=temps,
                            key=jax.random.key(3)).tokens)
  greedy = np.asarray(_run(head, base, first).tokens)
  np.testing.assert_array_equal(sampled[[0, 2]], greedy[[0, 2]])
  assert (sampled[[1, 3]] != greedy[[1, 3]]).any()


@NEEDS_INTERPRETER
def test_ties_lowest_index_and_all_minus_inf():
  head, (base, first, _) = _case(1000, 64, 2, 3, seed=7)
  w2 = head.markov_head.markov_w2.weight
  # Row 999 sits in the last, clamped chunk that overlaps rows 936..999; rows 11 and
  # 900 copy row 999's weights: an exact three-way tie that index 11 must win.
  tied = jnp.array([11, 900, 999])
  w2[...] = w2[...].at[tied[:2]].set(w2[...][999])
  out = _run(head, base.at[:, :, tied].set(jnp.asarray(60.0, base.dtype)), first)
  np.testing.assert_array_equal(np.asarray(out.tokens), 11)
  out = jax.jit(lambda b: _run(head, b, first))(jnp.full_like(base, -jnp.inf))
  np.testing.assert_array_equal(np.asarray(out.tokens), 0)
  assert int(out.status) == wts_jax.output.STATUS_NO_FINITE_LOGIT
  out = _run(head, base.at[:, :, 999].set(1e4), first)
  np.testing.assert_array_equal(np.asarray(out.tokens), 999)


@NEEDS_INTERPRETER
def test_nan_logits_and_out_of_range_first_tokens_are_reported():
  head, (base, first, _) = _case(1000, 64, 2, 3, seed=8)
  out = jax.jit(lambda b, f: _run(head, b, f).status)(base.at[1, 2, 77].set(jnp.nan),
                                                       first)
  assert int(out) & wts_jax.output.STATUS_NAN_LOGITS
  with pytest.raises(ValueError, match="first_tokens"):
    _run(head, base, first.at[0].set(1000))


@NEEDS_INTERPRETER
def test_out_of_range_first_tokens_reported_by_the_kernel():
  """Without a confidence head the row kernel takes the first tokens as given: it
  clamps them and sets STATUS_TOKEN_OUT_OF_RANGE itself (no op before the launch),
  walking the reference's tokens from the clamped ids."""
  head, (base, first, _) = _case(1000, 64, 3, 3, seed=9)
  first = first.at[0].set(-2).at[2].set(1000 + 7)
  out = jax.jit(lambda f: _run(head, base, f))(first)
  ref = jax.jit(lambda f: wts_jax.walk(head, base, f, impl="xla"))(first)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.status) == wts_jax.output.STATUS_TOKEN_OUT_OF_RANGE == int(ref.status)


# --- shared-memory staging ------------------------------------------------------------
def test_plan_stages_the_base_logits_beside_the_slots():
  """The base logits of two steps ([2, chunks, B, 64]) come out of the same shared memory
  as the W2 slots; an explicit split still keeps chunks resident."""
  args = dict(vocab_size=151936, rank=256, num_sms=132, smem_per_block=H200_SMEM,
              gemv="registers")
  for batch in (1, 4):
    plan = mosaic_plan.plan_mosaic(**args, batch=batch)
    assert (plan.staged_batch, plan.base_itemsize) == (batch, 2)
    assert (plan.resident_chunks, plan.ring_stages) == (2, 2)
  # f32 base logits at B = 4 (36 KB staged) leave 5 slots: 3 + 3 no longer fits.
  with pytest.raises(ValueError, match="exceed the 5 chunks"):
    mosaic_plan.plan_mosaic(**args, batch=4, base_itemsize=4, resident_chunks=3,
                            ring_stages=3)
  with pytest.raises(ValueError, match="batch=5"):
    mosaic_plan.plan_mosaic(**args, batch=5)
  split = mosaic_plan.plan_mosaic(**args, resident_chunks=3, ring_stages=3)
  assert (split.resident_chunks, split.ring_stages) == (3, 3)


# --- the WGMMA GEMV (MosaicRowConfig.gemv="wgmma") ----------------------------------
@pytest.mark.parametrize("batch, greedy", [(1, True), (4, False)])
def test_wgmma_gemv_lowers_for_cuda_at_the_qwen3_shape(batch, greedy):
  """z as 8 W1 rows per batch row in shared memory (TMA), one m64 n8B k256 WGMMA per
  chunk: lowers through Mosaic GPU with the SMEM budget the planner computed."""
  plan = mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                                 smem_per_block=H200_SMEM, batch=batch, gemv="wgmma")
  assert "WGMMA" in plan.describe()
  _assert_lowers_at_the_qwen3_shape(plan, batch, greedy)


def test_wgmma_gemv_refusals():
  with pytest.raises(ValueError, match="gemv='tensor'"):
    wts_jax.MosaicRowConfig(gemv="tensor")
  with pytest.raises(ValueError, match="group=0"):
    wts_jax.MosaicRowConfig(group=0)
  args = dict(vocab_size=151936, rank=256, num_sms=132, smem_per_block=H200_SMEM)
  with pytest.raises(ValueError, match="gemv='tensor'"):
    mosaic_plan.plan_mosaic(**args, gemv="tensor")
  with pytest.raises(ValueError, match="only for the WGMMA GEMV"):
    mosaic_plan.plan_mosaic(**args, gemv="registers", group=2)
  with pytest.raises(ValueError, match="group=3 chunks in flight need as many ring slots"):
    mosaic_plan.plan_mosaic(**args, gemv="wgmma", resident_chunks=0, ring_stages=2,
                            group=3)


@pytest.mark.parametrize("resident, streamed, group", [
    (0, 18, 1), (3, 15, 1), (6, 12, 3), (4, 0, 2), (5, 6, 2), (18, 0, 1)])
def test_chunk_schedule_spreads_resident_chunks_among_streamed_ones(resident, streamed,
                                                                    group):
  """Every chunk once a step, streamed ones in ring order, groups of at most ``group``,
  and the resident groups spread among the streamed ones (never all in front: the TMA
  ring would sit full and idle while they are computed)."""
  schedule = mosaic_plan.chunk_schedule(resident, streamed, group)
  seen = {kind: [i for k, members in schedule if k == kind for i in members]
          for kind in ("resident", "streamed")}
  assert seen == {"resident": list(range(resident)), "streamed": list(range(streamed))}
  assert all(1 <= len(members) <= group for _, members in schedule)
  if streamed and resident:
    kinds = [kind for kind, _ in schedule]
    assert kinds[0] == "streamed"
    gaps = [i for i, kind in enumerate(kinds) if kind == "resident"]
    assert max(b - a for a, b in zip([-1] + gaps, gaps)) >= 2   # streamed between them


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab, rank, batch, steps, residency, temperature", WALK_CASES)
def test_wgmma_gemv_matches_reference(vocab, rank, batch, steps, residency, temperature):
  """Tokens equal the XLA walk (greedy) and, sampled, bit for bit with the same key;
  tokens near the end of the vocabulary take their W1 tile from V - 8."""
  head, (base, first, _) = _case(vocab, rank, batch, steps, seed=21)
  first = first.at[0].set(vocab - 2)       # the clamped W1 tile (column 6 of 8)
  key = jax.random.key(3) if temperature else None
  config = wts_jax.MosaicRowConfig(interpret=True, residency=residency, gemv="wgmma")
  out = wts_jax.walk(head, base, first, impl="mosaic", config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, impl="xla", temperature=temperature, key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.status) == 0


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab, batch, residency, stages, group, temperature, snake", [
    (1400, 1, 128, 2, 2, 0.0, True),    # 22 chunks: 2 resident + 20 streamed, groups of 2
    (1200, 2, 192, 4, 3, 0.7, True),    # 3 resident + 16 streamed in groups of 3, ..., 1
    (1200, 1, 192, 4, 3, 0.0, False),   # every step streamed forward
])
def test_wgmma_groups_match_reference(vocab, batch, residency, stages, group,
                                      temperature, snake):
  """Several chunks' WGMMAs in flight before one wait, resident groups between streamed
  ones, odd steps streamed in reverse (or not): the tokens do not depend on the order
  (ties to the lowest row), so they equal the XLA walk's; tied logits across a resident
  and a streamed chunk pick the lower row."""
  head, (base, first, _) = _case(vocab, 64, batch, 3, seed=23)
  # A tie at step 0 between row 3 (resident) and row 643 (streamed, so computed first;
  # the same lane of its chunk): the lane keeps the lower row.
  serial = head.markov_head
  w2 = serial.markov_w2.weight[...]
  serial.markov_w2.weight[...] = w2.at[643].set(w2[3])
  base = base.at[:, 0, 643].set(base[:, 0, 3]).at[:, 0, 3].add(50.0).at[:, 0, 643].add(50.0)
  key = jax.random.key(5) if temperature else None
  config = wts_jax.MosaicRowConfig(interpret=True, residency=residency, ring_stages=stages,
                                   gemv="wgmma", group=group, snake=snake)
  out = wts_jax.walk(head, base, first, impl="mosaic", config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, impl="xla", temperature=temperature, key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  if not temperature:
    assert int(out.tokens[0, 0]) == 3
  assert int(out.status) == 0


# --- int8 W2 (wts_jax.quantize_w2(head, "int8")) -------------------------------------
@pytest.mark.parametrize("batch, greedy", [(1, True), (4, False)])
def test_int8_w2_lowers_for_cuda_at_the_qwen3_shape(batch, greedy):
  """16 KB chunks (twice the slots), the per-row scales staged in shared memory; the
  register GEMV and the WGMMA GEMV (the chunk upcast to bf16 in registers as its A
  operand), one chunk or two in flight."""
  args = dict(vocab_size=151936, rank=256, num_sms=132, smem_per_block=H200_SMEM,
              batch=batch, w2_itemsize=1)
  plan = mosaic_plan.plan_mosaic(**args)
  assert plan.gemv == "registers" and "int8 W2" in plan.describe()
  _assert_lowers_at_the_qwen3_shape(plan, batch, greedy)
  # Twice bf16's slots: 9 resident chunks + a 3-slot ring fit (bf16: at most 6 slots).
  resident = mosaic_plan.plan_mosaic(**args, resident_chunks=9, ring_stages=3)
  _assert_lowers_at_the_qwen3_shape(resident, batch, greedy)
  for group in (1, 2):
    wgmma = mosaic_plan.plan_mosaic(**args, resident_chunks=6, ring_stages=4,
                                    gemv="wgmma", group=group)
    assert "int8 W2" in wgmma.describe() and "WGMMA" in wgmma.describe()
    _assert_lowers_at_the_qwen3_shape(wgmma, batch, greedy)


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab, rank, batch, steps, residency, temperature", WALK_CASES)
def test_int8_w2_matches_its_reference(vocab, rank, batch, steps, residency, temperature):
  """Exact tokens (greedy) and bit-identical sampled tokens against the XLA walk of the
  same quantized head ((Σ q·z) · scale)."""
  head, (base, first, _) = _case(vocab, rank, batch, steps, seed=31)
  head = quantize_w2(head, "int8")
  key = jax.random.key(3) if temperature else None
  # (the row kernel at one row; from two the batched kernel, the W2 widened before it)
  config = _interpreted(head, base, temperature, residency=residency)
  out = wts_jax.walk(head, base, first, impl="mosaic", config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, impl="xla", temperature=temperature, key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.status) == 0


def test_int8_w2_refusals():
  head, _ = _case(1000, 64, 1, 3)
  int8 = quantize_w2(head, "int8")
  w1 = int8.markov_head.markov_w1
  w1.weight = nnx.Param(w1.weight[...].astype(jnp.float32))
  reason = backend.refusal_reason("mosaic_row", int8, 1,
                                  wts_jax.MosaicRowConfig(gemv="wgmma"))
  assert "needs a bf16 W1 (got float32)" in reason
  fp8 = quantize_w2(head, "fp8")
  reason = backend.refusal_reason("mosaic_row", fp8, 1, wts_jax.MosaicRowConfig())
  assert "bf16 or int8 W2" in reason


# --- the gated head (g = σ(G_h h + G_e e + b), z = g ⊙ e; register GEMV) ---------------
@pytest.mark.parametrize("batch, greedy, w2_itemsize", [(1, True, 2), (4, False, 2),
                                                        (1, True, 1)])
def test_gated_head_lowers_for_cuda_at_the_qwen3_shape(batch, greedy, w2_itemsize):
  """G_e resident in shared memory (128 KB at r = 256), the gate's relayout through
  shared memory: lowers with the SMEM budget the planner computed."""
  plan = mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                                 smem_per_block=H200_SMEM, batch=batch, gated=True,
                                 w2_itemsize=w2_itemsize)
  assert plan.gemv == "registers" and "gated head" in plan.describe()
  if w2_itemsize == 2:   # G_e leaves W2 two 32 KB slots: a 2-slot ring, nothing resident
    assert (plan.resident_chunks, plan.ring_stages) == (0, 2)
  _assert_lowers_at_the_qwen3_shape(plan, batch, greedy)


@NEEDS_INTERPRETER
@pytest.mark.parametrize("vocab, rank, batch, steps, residency, temperature", WALK_CASES)
def test_gated_head_matches_reference(vocab, rank, batch, steps, residency, temperature):
  """The gated walk on the Mosaic row kernel: tokens equal the XLA walk's (greedy) and
  bit for bit with the same key (sampled); confidence from the drafted tokens. ("auto"
  runs the gated head on the batched kernel, whose own tests cover it.)"""
  head, (base, first, hidden) = _case(vocab, rank, batch, steps, seed=5,
                                      confidence=True, head_type="gated")
  assert_mosaic_matches_xla(head, base, first, hidden, residency, temperature,
                            kernel="rows")


@NEEDS_INTERPRETER
def test_gated_head_with_int8_w2_matches_its_reference():
  head, (base, first, hidden) = _case(520, 128, 2, 3, seed=7, head_type="gated")
  head = quantize_w2(head, "int8")
  config = _interpreted(head, base, residency=64)   # (the batched kernel: a split gate)
  out = wts_jax.walk(head, base, first, hidden, impl="mosaic", config=config)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla")
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  assert int(out.status) == 0


def test_gated_head_refusals_and_auto():
  head, (base, _, _) = _case(1000, 64, 1, 3, head_type="gated")
  reason = backend.refusal_reason("mosaic_row", head, 1,
                                  wts_jax.MosaicRowConfig(gemv="wgmma"))
  assert "gated head's z = g ⊙ e is fp32" in reason
  with pytest.raises(ValueError, match="use the register GEMV"):
    mosaic_plan.plan_mosaic(vocab_size=151936, rank=256, num_sms=132,
                            smem_per_block=H200_SMEM, gated=True, gemv="wgmma")
  rnn, _ = _case(1000, 64, 1, 3, head_type="rnn")
  reason = backend.refusal_reason("mosaic_row", rnn, 1, wts_jax.MosaicRowConfig())
  assert ("row kernel runs the vanilla and gated heads (not 'rnn'; the batched kernel "
          "runs the rnn head") in reason
  # At one row "auto" runs the gated head on the batched kernel, its gate split over the
  # blocks (measured faster than the Triton kernel there).
  assert chosen_backend(head, 1, None) == "mosaic_batched"
