"""walk()'s contract beyond the token math: jit, decode loops, statistics, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax import output
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs

CONFIG = HeadConfig(1000, 32, 48, "gated", confidence=True)


@pytest.fixture(scope="module")
def case():
  head = wts_jax.make_head(CONFIG, seed=1)
  return head, random_inputs(CONFIG, 3, 7, jax.random.key(2))


def test_walk_under_jit_equals_eager(case):
  head, (base, first, hidden) = case
  eager = wts_jax.walk(head, base, first, hidden, impl="xla")
  jitted = jax.jit(lambda h, b, f, x: wts_jax.walk(h, b, f, x, impl="xla"))(
      head, base, first, hidden)
  np.testing.assert_array_equal(np.asarray(eager.tokens), np.asarray(jitted.tokens))
  assert int(jitted.status) == 0


def test_walk_inside_while_loop_decode(case):
  """A decode loop that walks, feeds the last drafted token back, and walks again."""
  head, (base, first, hidden) = case

  def body(state):
    i, tokens, collected = state
    out = wts_jax.walk(head, base, tokens, hidden, impl="xla")
    return i + 1, out.tokens[:, -1], collected.at[i].set(out.tokens)

  init = (0, first, jnp.zeros((3,) + first.shape + (7,), jnp.int32))
  _, _, collected = jax.jit(lambda s: jax.lax.while_loop(lambda s: s[0] < 3, body, s))(
      init)
  tokens = first
  for i in range(3):
    expected = wts_jax.walk(head, base, tokens, hidden, impl="xla").tokens
    np.testing.assert_array_equal(np.asarray(collected[i]), np.asarray(expected))
    tokens = expected[:, -1]


def test_sampling_matches_softmax_statistically():
  """4096 rows with identical inputs are 4096 independent draws from one softmax."""
  config = HeadConfig(12, 4, 8, "vanilla")
  head = wts_jax.make_head(config, seed=5)
  rows, temperature = 4096, 0.7
  base_row = jax.random.normal(jax.random.key(6), (1, 2, 12)) * 1.5
  base = jnp.broadcast_to(base_row, (rows, 2, 12))
  first = jnp.full((rows,), 3, jnp.int32)
  out = wts_jax.walk(head, base, first, impl="xla", temperature=temperature,
                     key=jax.random.key(9), return_logits=True)
  # Step 0: every row has the same logits, so the tokens are i.i.d. draws.
  logits0 = np.asarray(out.logits[0, 0], np.float64)
  probs = np.exp((logits0 - logits0.max()) / np.float32(temperature))
  probs /= probs.sum()
  counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=12)
  expected = probs * rows
  keep = expected >= 5
  chi2 = (((counts - expected) ** 2 / expected)[keep]).sum() + (
      (counts[~keep].sum() - expected[~keep].sum()) ** 2 / max(expected[~keep].sum(), 1e-9)
      if (~keep).any() else 0.0)
  # df <= 11; the 99.99th percentile of chi2(11) is 35.7.
  assert chi2 < 35.7, (counts, expected)


# --- bad input: clear errors naming the value --------------------------------------
def test_rejects_bad_shapes_and_dtypes(case):
  head, (base, first, hidden) = case
  with pytest.raises(ValueError, match=r"base_logits must be \[B, K, V\]"):
    wts_jax.walk(head, base[0], first, hidden)
  with pytest.raises(ValueError, match="vocabulary 999 != head vocab_size 1000"):
    wts_jax.walk(head, base[..., :999], first, hidden)
  with pytest.raises(TypeError, match="base_logits.dtype=int32"):
    wts_jax.walk(head, base.astype(jnp.int32), first, hidden)
  with pytest.raises(ValueError, match=r"first_tokens must be \[B=3\]"):
    wts_jax.walk(head, base, first[:2], hidden)
  with pytest.raises(TypeError, match="first_tokens.dtype=float32"):
    wts_jax.walk(head, base, first.astype(jnp.float32), hidden)
  with pytest.raises(ValueError, match=r"hidden must be \[B, K, d\]=\(3, 7, 48\)"):
    wts_jax.walk(head, base, first, hidden[..., :40])
  with pytest.raises(ValueError, match="K=0 must be >= 1"):
    wts_jax.walk(head, base[:, :0], first, hidden[:, :0])


def test_rejects_bad_values(case):
  head, (base, first, hidden) = case
  with pytest.raises(ValueError, match=r"first_tokens\[1\]=1000 is outside \[0, 1000\)"):
    wts_jax.walk(head, base, first.at[1].set(1000), hidden)
  with pytest.raises(ValueError, match=r"first_tokens\[0\]=-1"):
    wts_jax.walk(head, base, first.at[0].set(-1), hidden)
  with pytest.raises(ValueError, match="needs hidden"):
    wts_jax.walk(head, base, first, None)
  with pytest.raises(ValueError, match="temperature=-0.5 must be finite and >= 0"):
    wts_jax.walk(head, base, first, hidden, temperature=-0.5, key=jax.random.key(0))
  with pytest.raises(ValueError, match=r"temperature\[2\]=nan"):
    wts_jax.walk(head, base, first, hidden, temperature=jnp.array([1.0, 1.0, jnp.nan]),
                 key=jax.random.key(0))
  with pytest.raises(ValueError, match="needs key"):
    wts_jax.walk(head, base, first, hidden, temperature=1.0)
  with pytest.raises(ValueError, match="impl='cuda'"):
    wts_jax.walk(head, base, first, hidden, impl="cuda")
  with pytest.raises(TypeError, match="head must be"):
    wts_jax.walk({"w": 1}, base, first, hidden)


def test_nan_logits_raise_eagerly_and_flag_under_jit(case):
  head, (base, first, hidden) = case
  bad = base.at[1, 4, 17].set(jnp.nan)
  with pytest.raises(wts_jax.WalkError, match="NaN in the corrected logits"):
    wts_jax.walk(head, bad, first, hidden, impl="xla")
  out = jax.jit(lambda b: wts_jax.walk(head, b, first, hidden, impl="xla"))(bad)
  assert int(out.status) & output.STATUS_NAN_LOGITS
  out = jax.jit(lambda f: wts_jax.walk(head, base, f, hidden, impl="xla"))(
      first.at[0].set(5000))
  assert int(out.status) & output.STATUS_TOKEN_OUT_OF_RANGE


def test_pallas_on_cpu_is_refused_clearly(case):
  head, (base, first, hidden) = case
  if jax.default_backend() == "gpu":
    pytest.skip("a GPU is present")
  with pytest.raises(ValueError, match="impl='pallas' cannot run this walk: no GPU"):
    wts_jax.walk(head, base, first, hidden, impl="pallas")
  assert wts_jax.chosen_implementation(head, base) == "xla"


def test_bare_serial_head_walks_without_confidence(case):
  head, (base, first, hidden) = case
  out = wts_jax.walk(head.markov_head, base, first, hidden, impl="xla")
  assert out.confidence is None
  np.testing.assert_array_equal(
      np.asarray(out.tokens),
      np.asarray(wts_jax.walk(head, base, first, hidden, impl="xla").tokens))
