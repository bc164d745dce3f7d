"""The decode loop: greedy output = the target's greedy decoding, sampling = the target's
distribution, and bad input refused before any work (CPU, tiny shapes, float32)."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wts_jax.specdecode import autoregressive, generate_output, loop
from wts_jax.specdecode.dspark import DSparkConfig, DSparkDrafter, make_dspark
from wts_jax.specdecode.loop import generate
from wts_jax.specdecode.qwen3 import Qwen3Config, make_qwen3
from wts_jax.walk_config import TritonConfig

F32 = dict(param_dtype=jnp.float32, dtype=jnp.float32)
PROMPTS = [[1, 2, 3], [4, 0, 5, 1, 2, 3, 0], [2, 2, 1, 0, 3]]


@pytest.fixture(scope="module")
def models():
  """A 6-token vocabulary, so a random drafter still gets some drafts accepted. The
  drafter stores bf16 and has rank 16, as the walk kernel needs (interpret mode here)."""
  target_config = Qwen3Config.tiny(vocab_size=6, num_layers=3)
  target = make_qwen3(target_config, seed=2, **F32)
  drafter = make_dspark(DSparkConfig.tiny(target_config, head_type="gated", block_size=4,
                                          target_layer_ids=(-1, 1), rank=16),
                        seed=2, param_dtype=jnp.bfloat16, dtype=jnp.float32)
  return target, drafter


def greedy_reference(target, prompts, max_new_tokens, eos_id=None):
  """The target's own greedy decoding: a full uncached forward per token."""
  width = max(map(len, prompts)) + max_new_tokens
  forward = jax.jit(lambda ids: target.forward(ids, jnp.zeros(ids.shape[0], jnp.int32),
                                               None).logits)
  rows = [list(p) for p in prompts]
  outputs = [[] for _ in prompts]
  for _ in range(max_new_tokens):
    ids = np.zeros((len(rows), width), np.int32)
    for b, row in enumerate(rows):
      ids[b, :len(row)] = row
    logits = np.asarray(forward(jnp.asarray(ids)))
    for b, row in enumerate(rows):
      token = int(np.argmax(logits[b, len(row) - 1]))
      row.append(token)
      outputs[b].append(token)
  if eos_id is not None:
    outputs = [out[:out.index(eos_id) + 1] if eos_id in out else out for out in outputs]
  return outputs


def test_greedy_equals_the_targets_greedy_decoding(models):
  target, drafter = models
  out = generate(target, drafter, PROMPTS, 12, draft_len=3, walk_impl="xla")
  assert out.rows() == greedy_reference(target, PROMPTS, 12)
  assert int(np.sum(out.accepted)) > 0, "no draft was accepted: the test saw no multi-token commit"
  assert int(out.iterations) < 12


def test_greedy_with_the_walk_kernel_stops_at_eos_per_row(models):
  """The persistent walk kernel's own code (Pallas interpret mode) inside the loop."""
  target, drafter = models
  reference = greedy_reference(target, PROMPTS, 12)
  # A token row 1 first emits mid-way, which makes the rows stop at different steps.
  candidates = [token for token in reference[1][2:10]
                if 2 <= reference[1].index(token) < 10
                and len({len(row) for row in greedy_reference(target, PROMPTS, 12,
                                                              eos_id=token)}) > 1]
  assert candidates, "no token of row 1 ends the rows at different steps"
  eos = candidates[0]
  out = generate(target, drafter, PROMPTS, 12, draft_len=3, walk_impl="pallas",
                 walk_config=TritonConfig(interpret=True), eos_id=eos)
  expected = greedy_reference(target, PROMPTS, 12, eos_id=eos)
  assert out.rows() == expected
  assert expected[1][-1] == eos and len(expected[1]) < 12


@dataclasses.dataclass(frozen=True)
class CyclingPolicy:
  """k runs through ``draft_lens`` in turn (0: an iteration without a draft), row 0
  capped at one accepted draft: exercises the switch, K = 0 and the caps. Not a pytree:
  the loop compiles it in."""

  draft_lens: tuple[int, ...] = (0, 1, 2)

  def init(self, batch):
    return jnp.int32(0)

  def choose(self, state, active, new_request=None, rows=None):
    assert new_request is not None and new_request.shape == active.shape
    assert rows is not None and rows.shape == ()
    k = jnp.asarray(self.draft_lens, jnp.int32)[state % len(self.draft_lens)]
    cap = jnp.full(active.shape, k, jnp.int32).at[0].set(jnp.minimum(k, 1))
    return k, cap, state

  def observe(self, state, k, accepted, confidence, active, measured=None):
    assert confidence is not None and confidence.shape[1] == self.draft_lens[-1]
    return state + 1


def test_a_policy_switching_k_and_capping_rows_stays_exact(models):
  target, drafter = models
  out = generate(target, drafter, PROMPTS, 12, draft_len=CyclingPolicy(), walk_impl="xla")
  assert out.rows() == greedy_reference(target, PROMPTS, 12)
  assert int(out.policy_state) == int(out.iterations)


@dataclasses.dataclass(frozen=True)
class RecordingPolicy:
  """Cycles K = 1, 2, 0 and records, per iteration, the measured time it was handed and
  the tokens the batch committed (what the fake clock below counts)."""

  draft_lens: tuple[int, ...] = (0, 1, 2)
  iterations: int = 32

  def init(self, batch):
    nan = jnp.full((self.iterations,), jnp.nan, jnp.float32)
    return dict(i=jnp.int32(0), seconds=nan, measured_k=jnp.full((self.iterations,), -1),
                rows=jnp.zeros((self.iterations,), jnp.int32),
                chosen=jnp.full((self.iterations,), -1), committed=nan)

  def choose(self, state, active, new_request=None, rows=None):
    k = jnp.asarray((1, 2, 0), jnp.int32)[state["i"] % 3]
    return k, jnp.full(active.shape, k, jnp.int32), state

  def observe(self, state, k, accepted, confidence, active, measured=None):
    assert measured is not None, "the loop handed no measured time"
    i = state["i"]
    committed = jnp.sum(jnp.where(active, accepted + 1, 0)).astype(jnp.float32)
    return dict(i=i + 1, seconds=state["seconds"].at[i].set(measured.seconds),
                measured_k=state["measured_k"].at[i].set(measured.draft_len),
                rows=state["rows"].at[i].set(measured.rows),
                chosen=state["chosen"].at[i].set(k),
                committed=state["committed"].at[i].set(committed))


def test_each_iteration_is_measured_by_the_device_clock_one_iteration_late(models,
                                                                           monkeypatch):
  """The loop's clock wiring, with a fake clock that reads 1 ms per token the batch has
  in its caches: iteration t is handed iteration t - 1's time (its K and rows), which
  is then 1 ms per token t - 1 committed; the first iteration gets NaN."""
  from wts_jax.pallas import device_clock

  def fake_stamp(last, length):
    del last
    return jnp.stack([jnp.sum(length).astype(jnp.uint32) * jnp.uint32(1_000_000),
                      jnp.uint32(0)])
  monkeypatch.setattr(device_clock, "available", lambda: True)
  monkeypatch.setattr(device_clock, "stamp", fake_stamp)
  target, drafter = models
  out = generate(target, drafter, PROMPTS, 12, draft_len=RecordingPolicy(), walk_impl="xla")
  assert out.rows() == greedy_reference(target, PROMPTS, 12)
  record = jax.tree.map(np.asarray, out.policy_state)
  n = int(record["i"])
  assert n == int(out.iterations) >= 3
  assert np.isnan(record["seconds"][0])
  np.testing.assert_allclose(record["seconds"][1:n], record["committed"][:n - 1] * 1e-3,
                             rtol=1e-6)
  assert record["measured_k"][1:n].tolist() == record["chosen"][:n - 1].tolist()
  assert set(record["rows"][1:n].tolist()) == {len(PROMPTS)}


def test_draft_len_zero_is_the_target_alone(models):
  """K = 0: one target token per row and iteration, no draft accepted, the same tokens."""
  target, drafter = models
  out = generate(target, drafter, PROMPTS, 12, draft_len=0, walk_impl="xla")
  assert out.rows() == greedy_reference(target, PROMPTS, 12)
  assert int(np.sum(out.accepted)) == 0 and int(out.iterations) == 11


@pytest.mark.parametrize("draft_len", [2, CyclingPolicy((0, 2))], ids=["k2", "k0-k2"])
def test_sampling_matches_the_targets_distribution(models, draft_len):
  """Chi-square of 3-token continuations against the exact target probabilities (with
  a fixed K, and with K = 0 iterations between drafting ones)."""
  target, drafter = models
  vocab, new, rows = 6, 3, 6000
  prompt = [1, 2, 3, 4]
  temperature = 1.3
  out = generate(target, drafter, [prompt] * rows, new, temperature=temperature,
                 key=jax.random.key(7), draft_len=draft_len, walk_impl="xla")
  assert int(np.sum(out.accepted)) > rows // 8, "too few acceptances to test the rule"
  samples = np.asarray(out.tokens)
  counts = np.zeros((vocab,) * new)
  np.add.at(counts, tuple(samples.T), 1)

  sequences = np.array(list(itertools.product(range(vocab), repeat=new)), np.int32)
  ids = np.concatenate([np.tile(prompt, (len(sequences), 1)), sequences], axis=1)
  logits = target.forward(jnp.asarray(ids), jnp.zeros(len(ids), jnp.int32), None).logits
  logp = jax.nn.log_softmax(logits / temperature, axis=-1)
  start = len(prompt) - 1
  seq_logp = sum(np.asarray(logp)[np.arange(len(ids)), start + i, sequences[:, i]]
                 for i in range(new))
  expected = np.exp(seq_logp).reshape((vocab,) * new) * rows
  # Pool cells expected below 5 (chi-square validity), then test.
  small = expected < 5
  observed = np.append(counts[~small], counts[small].sum())
  expected_cells = np.append(expected[~small], expected[small].sum())
  chi2 = float(np.sum((observed - expected_cells) ** 2 / expected_cells))
  dof = observed.size - 1
  # mean dof, sd sqrt(2 dof): 5 sd is p ~ 1e-6, far beyond a lossy rule's excess here
  assert chi2 < dof + 5 * np.sqrt(2 * dof), (chi2, dof)


def abstract_drafter(config):
  """A drafter's shapes without weights: the checks read only shapes and configs."""
  return nnx.eval_shape(lambda: DSparkDrafter(config, rngs=nnx.Rngs(0), **F32))


def test_bad_input_is_refused_before_any_work(models, monkeypatch):
  target, drafter = models
  monkeypatch.setattr(loop, "_compiled", lambda *a: pytest.fail("work started"))
  with pytest.raises(ValueError, match="longer than cache_len=4"):
    generate(target, drafter, [[1, 2, 3, 4, 5]], 3, cache_len=4)
  with pytest.raises(ValueError, match="cache_len=9 is too small"):
    generate(target, drafter, [[1, 2, 3, 4, 5]], 3, cache_len=9)
  vocab = target.config.vocab_size
  for eos in (-5, vocab, [2, vocab + 3]):
    bad = eos[-1] if isinstance(eos, list) else eos
    with pytest.raises(ValueError, match=f"eos_id {bad} is outside \\[0, vocab_size={vocab}\\)"):
      generate(target, drafter, PROMPTS, 3, eos_id=eos)
  other_vocab = abstract_drafter(DSparkConfig.tiny(Qwen3Config.tiny(vocab_size=7)))
  with pytest.raises(ValueError, match="vocab_size=7"):
    generate(target, other_vocab, PROMPTS, 3)
  deep = abstract_drafter(DSparkConfig.tiny(Qwen3Config.tiny(vocab_size=6, num_layers=3),
                                             target_layer_ids=(0, 3)))
  with pytest.raises(ValueError, match="target_layer_ids=.*3"):
    generate(target, deep, PROMPTS, 3)
  with pytest.raises(ValueError, match="draft_len=5 must be <= .*block_size=4"):
    generate(target, drafter, PROMPTS, 3, draft_len=5)
  with pytest.raises(ValueError, match=r"prompts\[1\] holds id 9"):
    generate(target, drafter, [[1], [9]], 3)
  with pytest.raises(ValueError, match="needs key"):
    generate(target, drafter, PROMPTS, 3, temperature=0.5)
  with pytest.raises(ValueError, match="walk_impl='fast'"):
    generate(target, drafter, PROMPTS, 3, walk_impl="fast")


def _poisoned(model, layer: int, name: str):
  """A copy of ``model`` with one weight entry of layer ``layer`` set to NaN."""
  copy = nnx.clone(model)
  weight = getattr(copy.layers[layer], name)
  weight.set_value(weight.get_value().at[0, 0].set(jnp.nan))
  return copy


def test_a_target_that_turns_nan_stops_with_an_error_not_tokens(models):
  target, drafter = models
  bad = _poisoned(target, 1, "down_proj")
  with pytest.raises(generate_output.GenerateError, match="target's logits were NaN"):
    generate(bad, drafter, PROMPTS, 6, draft_len=3, walk_impl="xla")
  out = generate(bad, drafter, PROMPTS, 6, draft_len=3, walk_impl="xla", check=False)
  assert int(out.status) & generate_output.STATUS_TARGET_NONFINITE
  assert out.rows() == [[], [], []]     # nothing committed from NaN logits


def test_a_drafter_that_turns_nan_is_reported_and_the_output_stays_exact(models):
  target, drafter = models
  bad = _poisoned(drafter, 0, "o_proj")
  with pytest.raises(generate_output.GenerateError, match="drafter's logits were NaN"):
    generate(target, bad, PROMPTS, 6, draft_len=3, walk_impl="xla")
  out = generate(target, bad, PROMPTS, 6, draft_len=3, walk_impl="xla", check=False)
  assert int(out.status) & generate_output.STATUS_DRAFTER_NONFINITE
  assert out.rows() == greedy_reference(target, PROMPTS, 6)
  assert int(np.sum(out.accepted)) == 0


def test_several_iterations_per_host_check_give_the_same_output(models):
  target, drafter = models
  one = generate(target, drafter, PROMPTS, 12, draft_len=3, walk_impl="xla")
  three = generate(target, drafter, PROMPTS, 12, draft_len=3, walk_impl="xla",
                   iterations_per_check=3)
  assert three.rows() == one.rows()
  assert int(three.iterations) == int(one.iterations) and int(three.status) == 0


def test_eos_and_length_errors_name_the_value(models):
  target, drafter = models
  for eos in ("19", b"3", 2.0, True, [1, "2"]):
    with pytest.raises(ValueError, match="eos_id=.* must be a token id"):
      generate(target, drafter, PROMPTS, 3, eos_id=eos)
  limit = target.config.max_position_embeddings
  with pytest.raises(ValueError, match=f"max_position_embeddings={limit}"):
    generate(target, drafter, PROMPTS, limit)
  for name, value in (("draft_w2", "int4"), ("iterations_per_check", 0),
                      ("attention_impl", "flash")):
    with pytest.raises(ValueError, match=f"{name}="):
      generate(target, drafter, PROMPTS, 3, **{name: value})


def test_the_autoregressive_baseline_is_the_targets_greedy_decoding(models):
  target, _ = models
  tokens = np.asarray(autoregressive.decode_autoregressive(target, PROMPTS, 8))
  assert [row.tolist() for row in tokens] == greedy_reference(target, PROMPTS, 8)


def test_the_loop_runs_its_products_on_cublas_from_16_rows(monkeypatch):
  from wts_jax.launch_options import (CUBLAS_PRODUCTS, KERNEL_COMPILER_OPTIONS,
                                      UNMERGED_PRODUCTS)
  from wts_jax.specdecode import loop
  asked = []
  real = loop.compiler_options
  monkeypatch.setattr(loop, "compiler_options",
                      lambda **kw: asked.append(kw["cublas_products"]) or real(**kw))
  for batch in (1, loop.CUBLAS_MIN_BATCH - 1, loop.CUBLAS_MIN_BATCH, 64):
    loop._compiled.__wrapped__(None, None, None, batch)   # builds the jit, traces nothing
  assert asked == [False, False, True, True]
  assert real(cublas_products=True) is None               # not on a CPU
  monkeypatch.setattr(loop.jax, "default_backend", lambda: "gpu")
  assert real() == {**KERNEL_COMPILER_OPTIONS, **UNMERGED_PRODUCTS}
  assert real(cublas_products=True) == {**KERNEL_COMPILER_OPTIONS, **CUBLAS_PRODUCTS}
  assert real()["xla_gpu_dot_merger_threshold_mb"] == 0


def test_greedy_through_the_fused_attention_kernel_equals_the_targets_decode(models,
                                                                             monkeypatch):
  """The GPU path's attention (``qkv_attention.fused``: the target's and the drafter's
  layers norm, rotate and write their keys inside the attention kernel), interpreted,
  inside the loop: lossless against the target's own greedy decoding."""
  import functools
  from wts_jax.specdecode import cache_attention, qkv_attention
  calls = []
  fused = qkv_attention.fused

  def interpreted(*args, causal, **kwargs):
    calls.append(causal)
    return fused(*args, causal=causal, **kwargs, interpret=True,
                 launch_as=cache_attention.Launch(16, 2, 3))
  monkeypatch.setattr(qkv_attention, "fused", interpreted)
  target, drafter = models
  out = generate(target, drafter, PROMPTS, 12, draft_len=3, walk_impl="xla",
                 attention_impl="pallas")
  assert out.rows() == greedy_reference(target, PROMPTS, 12)
  assert True in calls and False in calls, "the target's or the drafter's layers bypassed it"
  assert int(np.sum(out.accepted)) > 0, "no draft was accepted: the test saw no multi-token commit"
