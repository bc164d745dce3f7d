"""The decode loop: greedy output = the target's greedy decoding, sampling = the target's
distribution, and bad input refused before any work (CPU, tiny shapes, float32)."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wts_jax.spec import loop
from wts_jax.spec.dspark import DSparkConfig, DSparkDrafter, make_dspark
from wts_jax.spec.loop import generate
from wts_jax.spec.qwen3 import Qwen3Config, make_qwen3
from wts_jax.walk_config import TritonConfig

F32 = dict(param_dtype=jnp.float32, dtype=jnp.float32)
PROMPTS = [[1, 2, 3], [4, 0, 5, 1, 2, 3, 0], [2, 2, 1, 0, 3]]


@pytest.fixture(scope="module")
def models():
  """A 6-token vocabulary, so a random drafter still gets some drafts accepted. The
  drafter stores bf16 and has rank 16, as the walk kernel needs (interpret mode here)."""
  target_config = Qwen3Config.tiny(vocab_size=6, num_layers=3)
  target = make_qwen3(target_config, seed=1, **F32)
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
  eos = reference[1][4]          # a token row 1 emits mid-way; other rows may emit it too
  out = generate(target, drafter, PROMPTS, 12, draft_len=3, walk_impl="pallas",
                 walk_config=TritonConfig(interpret=True), eos_id=eos)
  expected = greedy_reference(target, PROMPTS, 12, eos_id=eos)
  assert out.rows() == expected
  # The rows stop at their EOS at different steps (row 1 first), the others running on.
  assert len(expected[1]) == 5 and len({len(row) for row in expected}) == len(expected)


@dataclasses.dataclass(frozen=True)
class CyclingPolicy:
  """k = 1, 2, 1, … with row 0 capped at one accepted draft: exercises the switch."""

  max_draft_len: int = 2

  def init(self, batch):
    return jnp.int32(0)

  def choose(self, state, active):
    k = state % self.max_draft_len + 1
    cap = jnp.full(active.shape, k, jnp.int32).at[0].set(jnp.minimum(k, 1))
    return k, cap, state

  def observe(self, state, k, accepted, confidence, active):
    assert confidence is not None and confidence.shape[1] == self.max_draft_len
    return state + 1


def test_a_policy_switching_k_and_capping_rows_stays_exact(models):
  target, drafter = models
  out = generate(target, drafter, PROMPTS, 12, draft_len=CyclingPolicy(), walk_impl="xla")
  assert out.rows() == greedy_reference(target, PROMPTS, 12)


def test_sampling_matches_the_targets_distribution(models):
  """Chi-square of 3-token continuations against the exact target probabilities."""
  target, drafter = models
  vocab, new, rows = 6, 3, 6000
  prompt = [1, 2, 3, 4]
  temperature = 1.3
  out = generate(target, drafter, [prompt] * rows, new, temperature=temperature,
                 key=jax.random.key(7), draft_len=2, walk_impl="xla")
  assert int(np.sum(out.accepted)) > rows // 4, "too few acceptances to test the rule"
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
