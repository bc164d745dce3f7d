"""One check shared by the Mosaic kernel's interpret-mode suites."""

import jax
import numpy as np

import wts_jax


def assert_mosaic_matches_xla(head, base, first, hidden, residency, temperature,
                              kernel="auto"):
  """The Mosaic walk (interpret mode, one block) against the XLA walk of the same head:
  exact tokens (greedy), bit-identical with the same key (sampled), confidence close."""
  key = jax.random.key(3) if temperature else None
  config = wts_jax.WalkConfig(backend="mosaic", interpret=True, residency=residency,
                              mosaic_kernel=kernel)
  out = wts_jax.walk(head, base, first, hidden, impl="pallas", config=config,
                     temperature=temperature, key=key)
  ref = wts_jax.walk(head, base, first, hidden, impl="xla", temperature=temperature,
                     key=key)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
  if ref.confidence is not None:
    np.testing.assert_allclose(np.asarray(out.confidence), np.asarray(ref.confidence),
                               atol=1e-4)
  assert int(out.status) == 0
