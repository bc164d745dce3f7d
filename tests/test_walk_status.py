"""walk() on the inputs a new user gets wrong, and the status bits nothing used to set.

Bad arguments raise a ``TypeError``/``ValueError`` naming the value; what only shows
while walking (NaN confidence, NaN log-probabilities, a negative temperature passed
traced) sets a status bit under ``jit`` and raises ``WalkError`` eagerly; ``check``
reads the status of walks stacked by ``vmap`` or ``lax.scan``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax import output, validation
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs
from wts_jax.reference import reference_walk

# A vanilla head with a confidence head: hidden feeds the confidence head alone, so NaN
# there leaves the logits (and the old status) clean.
CONFIG = HeadConfig(200, 8, 16, "vanilla", confidence=True)
BATCH, STEPS = 3, 5


@pytest.fixture(scope="module")
def case():
  head = wts_jax.make_head(CONFIG, seed=3)
  base, first, hidden = random_inputs(CONFIG, BATCH, STEPS, jax.random.key(4),
                                      dtype=jnp.float32)
  return head, base, first, hidden


def walk_xla(head, base, first, hidden, **kwargs):
  return wts_jax.walk(head, base, first, hidden, impl="xla", **kwargs)


# --- arguments: clear errors ---------------------------------------------------------
def test_key_must_be_a_prng_key(case):
  head, base, first, hidden = case
  with pytest.raises(TypeError, match=r"key=0 must be a JAX PRNG key from "
                                      r"jax.random.key\(seed\), not a int"):
    walk_xla(head, base, first, hidden, temperature=1.0, key=0)
  with pytest.raises(TypeError, match=r"key=0 must be a JAX PRNG key"):
    walk_xla(head, base, first, hidden, key=0)   # checked even when greedy
  with pytest.raises(TypeError, match=r"got float32\[3\]"):
    walk_xla(head, base, first, hidden, temperature=1.0, key=jnp.zeros(3))
  with pytest.raises(ValueError, match=r"one PRNG key; got a key array of shape \(2,\)"):
    walk_xla(head, base, first, hidden, temperature=1.0,
             key=jax.random.split(jax.random.key(0)))
  raw = walk_xla(head, base, first, hidden, temperature=1.0,
                 key=jax.random.key_data(jax.random.key(7)))
  typed = walk_xla(head, base, first, hidden, temperature=1.0, key=jax.random.key(7))
  np.testing.assert_array_equal(np.asarray(raw.tokens), np.asarray(typed.tokens))


@pytest.mark.parametrize("name", ["base_logits", "first_tokens", "hidden"])
def test_python_lists_are_a_clear_type_error(case, name):
  head, base, first, hidden = case
  arrays = {"base_logits": base, "first_tokens": first, "hidden": hidden}
  arrays[name] = np.asarray(arrays[name]).tolist()
  with pytest.raises(TypeError, match=rf"{name} must be a jax or numpy array, got list "
                                      rf"\(wrap it: jnp.asarray\({name}\)\)"):
    walk_xla(head, *arrays.values())


def test_numpy_arrays_and_a_temperature_list_are_accepted(case):
  head, base, first, hidden = case
  out = walk_xla(head, np.asarray(base), np.asarray(first), np.asarray(hidden),
                 temperature=[0.0, 0.5, 1.0], key=jax.random.key(1))
  assert out.tokens.shape == (BATCH, STEPS) and int(out.status) == 0


# --- status bits: set under jit, raised eagerly ------------------------------------------
def _nan_hidden(base, first, hidden):
  return base, first, hidden.at[1, 2, 3].set(jnp.nan)


def _inf_base_logit(base, first, hidden):
  return base.at[0, 1, 5].set(jnp.inf), first, hidden


def _all_minus_inf_step(base, first, hidden):
  return base.at[2, 3, :].set(-jnp.inf), first, hidden


STATUS_CASES = [
    (_nan_hidden, output.STATUS_NAN_CONFIDENCE, "NaN in the confidence logits"),
    (_inf_base_logit, output.STATUS_BAD_LOGPROBS, "a log-probability is NaN or \\+Inf"),
    (_all_minus_inf_step, output.STATUS_BAD_LOGPROBS | output.STATUS_NO_FINITE_LOGIT,
     "a log-probability is NaN or \\+Inf"),
]


@pytest.mark.parametrize("damage,bit,message", STATUS_CASES,
                         ids=[case[0].__name__.strip("_") for case in STATUS_CASES])
def test_non_finite_outputs_set_a_status_bit(case, damage, bit, message):
  head, *inputs = case
  bad = damage(*inputs)
  with pytest.raises(wts_jax.WalkError, match=message):
    walk_xla(head, *bad, return_logprobs=True)
  jitted = jax.jit(lambda b, f, x: walk_xla(head, b, f, x, return_logprobs=True))(*bad)
  assert int(jitted.status) == bit, int(jitted.status)
  assert int(jax.jit(lambda b, f, x: walk_xla(head, b, f, x, return_logprobs=True))(
      *inputs).status) == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("where", ["everywhere", "one_step"])
def test_a_step_without_a_finite_logit_sets_a_status_bit(case, where, temperature):
  """Every logit of a step -inf: no token can be chosen, and the walk says so instead of
  returning token 0 with a clean status (with or without log-probabilities asked)."""
  head, base, first, hidden = case
  bad = (jnp.full_like(base, -jnp.inf) if where == "everywhere"
         else base.at[1, 2, :].set(-jnp.inf))
  key = jax.random.key(0) if temperature else None
  with pytest.raises(wts_jax.WalkError, match="status=64: a step's logits were all -Inf"):
    walk_xla(head, bad, first, hidden, temperature=temperature, key=key)
  walk = jax.jit(lambda b: walk_xla(head, b, first, hidden, temperature=temperature,
                                    key=key))
  assert int(walk(bad).status) == output.STATUS_NO_FINITE_LOGIT
  assert int(walk(base.at[1, 2, :7].set(-jnp.inf)).status) == 0   # some left: fine


@pytest.mark.parametrize("temperature", ["1.0", None, object()])
def test_temperature_of_another_type_is_one_clear_error(case, temperature):
  head, base, first, hidden = case
  with pytest.raises(TypeError) as raised:
    walk_xla(head, base, first, hidden, temperature=temperature, key=jax.random.key(0))
  message = str(raised.value)
  assert message.startswith(f"temperature={temperature!r} must be a number or a [B] "
                            "array of floats"), message
  assert "\n" not in message


def test_weights_with_nan_set_the_confidence_bit(case):
  head, base, first, hidden = case
  bad_head = wts_jax.make_head(CONFIG, seed=3)
  bad_head.confidence_head.proj.weight[...] = bad_head.confidence_head.proj.weight[
      ...].at[0, 0].set(jnp.nan)
  out = jax.jit(lambda h: walk_xla(h, base, first, hidden))(bad_head)
  assert int(out.status) == output.STATUS_NAN_CONFIDENCE


def test_check_adds_the_bits_an_implementation_did_not_set(case):
  """A kernel that does not look at its confidence output: check still raises."""
  head, base, first, hidden = case
  out = walk_xla(head, base, first, hidden)
  unchecked = output.WalkOutput(tokens=out.tokens, status=jnp.int32(0),
                                confidence=out.confidence.at[0, 0].set(jnp.nan))
  with pytest.raises(wts_jax.WalkError, match="status=8: NaN in the confidence logits"):
    wts_jax.check(unchecked)
  finished = validation.finish_walk(unchecked, validation.Sampling(greedy=True))
  assert int(finished.status) == output.STATUS_NAN_CONFIDENCE


def _walk_with_traced_temperature(walk_fn, head, base, first, hidden):
  temperature = jnp.array([0.5, -1.0, 1.0])
  return jax.jit(lambda t: walk_fn(head, base, first, hidden, temperature=t,
                                   key=jax.random.key(0)))(temperature)


def test_negative_traced_temperature_sets_a_status_bit_after_finish_walk(case):
  head, base, first, hidden = case

  def walk_and_finish(head, base, first, hidden, *, temperature, key):
    mode = validation.make_sampling(temperature, key, base.shape[0])
    out = reference_walk(head, base, first, hidden, mode.score_scale, mode.noise_on,
                         mode.seed)
    return validation.finish_walk(out, mode)

  out = _walk_with_traced_temperature(walk_and_finish, head, base, first, hidden)
  assert int(out.status) == output.STATUS_INVALID_TEMPERATURE
  greedy = walk_xla(head, base, first, hidden)
  np.testing.assert_array_equal(np.asarray(out.tokens[1]), np.asarray(greedy.tokens[1]))
  with pytest.raises(wts_jax.WalkError, match="a temperature was negative or not finite"):
    wts_jax.check(out)


def test_negative_traced_temperature_through_walk(case):
  head, base, first, hidden = case
  out = _walk_with_traced_temperature(walk_xla, head, base, first, hidden)
  assert int(out.status) == output.STATUS_INVALID_TEMPERATURE


# --- check on batched outputs ---------------------------------------------------------------
def test_check_reads_vmapped_and_scanned_walks(case):
  head, base, first, hidden = case
  stacked = jnp.stack([base, base.at[0, 0, 0].set(jnp.nan), base, base.at[1].set(jnp.nan)])
  vmapped = jax.vmap(lambda b: walk_xla(head, b, first, hidden))(stacked)
  assert vmapped.status.shape == (4,)
  with pytest.raises(wts_jax.WalkError,
                     match=r"walk status=1 in 2 of 4 walks \(first at index 1\): NaN in "
                           r"the corrected logits"):
    wts_jax.check(vmapped)

  def body(carry, b):
    out = walk_xla(head, b, first, hidden)
    return carry, out

  _, scanned = jax.lax.scan(body, 0, stacked[jnp.array([0, 2])])
  assert wts_jax.check(scanned) is scanned
  _, scanned = jax.lax.scan(body, 0, stacked)
  with pytest.raises(wts_jax.WalkError, match=r"in 2 of 4 walks"):
    wts_jax.check(scanned)


def test_check_under_jit_is_a_clear_type_error(case):
  head, base, first, hidden = case
  with pytest.raises(TypeError, match=r"check\(output\) needs a concrete output"):
    jax.jit(lambda b: wts_jax.check(walk_xla(head, b, first, hidden)))(base)
