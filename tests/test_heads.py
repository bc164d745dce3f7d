"""The NNX heads: parameter names, presets, and the teacher-forced block vs the oracle."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import numpy_oracle
import wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs

CHECKPOINT_KEYS = {
    "vanilla": {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"},
    "gated": {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
              "markov_head.gate_proj.weight", "markov_head.gate_proj.bias"},
    "rnn": {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
            "markov_head.joint_proj.weight", "markov_head.joint_proj.bias"},
}


def param_paths(head):
  return {".".join(str(p) for p in path): value
          for path, value in nnx.to_flat_state(nnx.state(head, nnx.Param))}


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
@pytest.mark.parametrize("with_markov", [True, False])
def test_parameter_names_and_shapes_match_deepspec(head_type, with_markov):
  v, r, d = 300, 16, 24
  config = HeadConfig(v, r, d, head_type, confidence=True,
                      confidence_with_markov=with_markov)
  params = param_paths(wts_jax.make_head(config))
  expected = CHECKPOINT_KEYS[head_type] | {"confidence_head.proj.weight",
                                           "confidence_head.proj.bias"}
  assert set(params) == expected
  shapes = {k: tuple(v.shape) for k, v in params.items()}
  assert shapes["markov_head.markov_w1.weight"] == (v, r)
  assert shapes["markov_head.markov_w2.weight"] == (v, r)
  assert shapes["confidence_head.proj.weight"] == (1, d + r if with_markov else d)
  if head_type == "gated":
    assert shapes["markov_head.gate_proj.weight"] == (r, d + r)
  if head_type == "rnn":
    assert shapes["markov_head.joint_proj.weight"] == (3 * r, 2 * r + d)
    assert shapes["markov_head.joint_proj.bias"] == (3 * r,)
  assert all(p.dtype == jnp.bfloat16 for p in params.values())


@pytest.mark.parametrize("preset,hidden", [("qwen3_4b", 2560), ("qwen3_8b", 4096),
                                          ("qwen3_14b", 5120)])
def test_qwen3_presets(preset, hidden):
  config = getattr(HeadConfig, preset)("gated")
  assert (config.vocab_size, config.rank, config.hidden_size) == (151936, 256, hidden)
  # Abstract construction only: no 155 MB of random weights in the CPU suite.
  head = nnx.eval_shape(lambda: wts_jax.DraftHead(config, rngs=nnx.Rngs(0)))
  assert head.markov_head.markov_w2.weight.shape == (151936, 256)


def test_config_rejects_bad_values():
  with pytest.raises(ValueError, match="head_type='lstm'"):
    HeadConfig(100, 8, 8, "lstm")
  with pytest.raises(ValueError, match="rank=0"):
    HeadConfig(100, 0, 8)


@pytest.mark.parametrize("head_type", ["vanilla", "gated", "rnn"])
def test_teacher_forced_block_matches_oracle(head_type):
  config = HeadConfig(517, 16, 24, head_type, confidence=True)
  head = wts_jax.make_head(config, seed=3)
  base, first, hidden = random_inputs(config, 3, 5, jax.random.key(4))
  # Teacher forcing with the walk's own tokens reproduces the walk.
  out = wts_jax.walk(head, base, first, hidden, impl="xla", return_logits=True)
  prev = jnp.concatenate([first[:, None], out.tokens[:, :-1]], axis=1)
  bias, confidence = head.block(hidden, prev)
  tokens64, conf64, logits64 = numpy_oracle.walk(head, base, first, hidden,
                                                 return_all=True)
  np.testing.assert_allclose(np.asarray(bias) + numpy_oracle.f64(base), logits64,
                             atol=2e-4)
  np.testing.assert_allclose(np.asarray(confidence), conf64, atol=1e-4)
  np.testing.assert_array_equal(np.asarray(out.tokens), tokens64)


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_hoisted_terms_exact_products_in_either_gemm(head_type):
  """The hidden-side terms: with bf16 hidden states and weights, a bf16 GEMM accumulating
  in fp32 (exact products) equals the fp32 GEMM of widened copies up to the sums'
  rounding; fp32 hidden states take the fp32 GEMM, so they lose nothing to bf16."""
  from wts_jax.heads.base import hidden_terms
  config = HeadConfig(vocab_size=520, rank=64, hidden_size=96, head_type=head_type)
  head = wts_jax.make_head(config, seed=3)
  serial = head.markov_head
  hidden = jax.random.normal(jax.random.key(4), (3, 2, 96), jnp.float32)
  proj = serial.gate_proj if head_type == "gated" else serial.joint_proj
  columns = slice(0, 96) if head_type == "gated" else slice(2 * config.rank, None)
  weight, bias = proj.weight[...][:, columns], proj.bias[...]
  widened = jnp.einsum("bkd,jd->bkj", hidden.astype(jnp.bfloat16).astype(jnp.float32),
                       weight.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
  fast = serial.hoist(hidden.astype(jnp.bfloat16))
  assert fast.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(fast), np.asarray(widened + bias), rtol=1e-5,
                             atol=1e-5)
  exact = jnp.einsum("bkd,jd->bkj", hidden, weight.astype(jnp.float32),
                     precision=jax.lax.Precision.HIGHEST) + bias
  np.testing.assert_array_equal(np.asarray(hidden_terms(hidden, weight, bias)),
                                np.asarray(exact))
  # fp32 hidden states differ from their bf16 rounding: the fp32 path kept them.
  assert not np.allclose(np.asarray(serial.hoist(hidden)), np.asarray(fast), atol=1e-6)
