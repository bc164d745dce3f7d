"""The JAX paths: ``xla`` (the jitted step-wise reference), ``wts`` (the persistent
kernel through ``walk(impl="pallas")``) and ``pallas-stepwise`` (one fused kernel per
step), and ``wts_variant`` for tools that time tuning variants beside them.
"""

from __future__ import annotations



from wts_jax import validation
from wts_jax.bench.registry import BenchMode, Prepared, SkipPath, gpu_reason, jax_prepared


# --- xla: the jitted step-wise reference walk ------------------------------------------

def prepare_xla(head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                return_logits: bool = False) -> Prepared:
  from wts_jax.reference import reference_walk
  head = validation.as_draft_head(head)

  def walk_fn(operands, first):
    head, base, hidden, key = operands
    s = mode.sampling(base.shape[0], key)
    return reference_walk(head, base, first, hidden, s.score_scale, s.noise_on, s.seed,
                          return_logits=return_logits)

  return jax_prepared(walk_fn, (head, base_logits, hidden, mode.key), first_tokens)


# --- wts: the persistent kernel, through the public API --------------------------------

def available_wts() -> str | None:
  try:
    from wts_jax.pallas import backend  # noqa: F401
  except Exception as err:  # noqa: BLE001
    return f"wts_jax.pallas.backend failed to import: {type(err).__name__}: {err}"
  return gpu_reason()


def prepare_wts(head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                return_logits: bool = False, config=None) -> Prepared:
  from wts_jax import api
  head = validation.as_draft_head(head)
  try:
    api.chosen_implementation(head, base_logits, "pallas", config,
                              return_logits=return_logits)
  except ValueError as err:
    raise SkipPath(str(err)) from err

  def walk_fn(operands, first):
    head, base, hidden, key = operands
    return api.walk(head, base, first, hidden, temperature=mode.walk_temperature,
                    key=key, return_logits=return_logits, impl="pallas", config=config)

  return jax_prepared(walk_fn, (head, base_logits, hidden, mode.key), first_tokens)


# --- pallas-stepwise: one fused Pallas kernel per step ---------------------------------

def _stepwise_walk():
  from wts_jax.pallas.stepwise import stepwise_walk
  return stepwise_walk


def available_pallas_stepwise() -> str | None:
  try:
    _stepwise_walk()
  except Exception as err:  # noqa: BLE001
    return (f"wts_jax.pallas.stepwise.stepwise_walk failed to import: "
            f"{type(err).__name__}: {err}")
  return gpu_reason()


def prepare_pallas_stepwise(head, base_logits, first_tokens, hidden, mode: BenchMode, *,
                            return_logits: bool = False) -> Prepared:
  stepwise_walk = _stepwise_walk()
  head = validation.as_draft_head(head)

  def walk_fn(operands, first):
    head, base, hidden, key = operands
    return stepwise_walk(head, base, first, hidden, mode.sampling(base.shape[0], key),
                         return_logits=return_logits)

  return jax_prepared(walk_fn, (head, base_logits, hidden, mode.key), first_tokens)


def wts_variant(config):
  """A tuning variant of the persistent kernel (one kernel's config), for tools that
  time variants beside the default ``wts`` (``tools/bench_variants.py``)."""
  def prepare(*args, **kwargs):
    return prepare_wts(*args, config=config, **kwargs)
  return prepare


