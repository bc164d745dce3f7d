"""The batched Mosaic kernel's exchange keys (``grid_sync.orderable_key``): the unsigned
order of the 64-bit keys is the candidates' order — higher score first, then the lower
index — so an L2 ``red.max`` over them picks the reference's token. Runs on the CPU."""

import jax.numpy as jnp
import numpy as np

from wts_jax.pallas import grid_sync


def _keys(values, indices):
  high, low = grid_sync.orderable_key(jnp.asarray(values, jnp.float32),
                                      jnp.asarray(indices, jnp.int32))
  return (np.asarray(high).astype(np.uint64) << np.uint64(32)) | np.asarray(low).astype(
      np.uint64)


def test_key_order_is_score_then_lower_index():
  rng = np.random.default_rng(0)
  values = np.concatenate([rng.normal(size=300).astype(np.float32) * 50,
                           [0.0, -0.0, np.inf, -np.inf, 1e-38, -1e-38, 3.0, 3.0, 3.0]])
  indices = np.concatenate([rng.integers(0, 151936, 300), [5, 6, 7, 8, 9, 10, 40, 2, 90]])
  keys = _keys(values, indices)
  for trial in range(200):
    pick = rng.choice(len(values), size=rng.integers(1, 40), replace=False)
    if trial % 4 == 0:
      pick = np.concatenate([pick, [len(values) - 3, len(values) - 2, len(values) - 1]])
    winner = pick[np.argmax(keys[pick])]
    best = np.max(values[pick])
    want = np.min(indices[pick][values[pick] == best])
    assert values[winner] == best and indices[winner] == want
    assert int(grid_sync.key_index(jnp.uint32(keys[winner] & 0xFFFFFFFF))) == want


def test_every_key_is_above_an_empty_slot():
  keys = _keys([-np.inf, -3.4e38, 0.0], [151935, 0, 7])
  assert (keys > 0).all()   # the zeroed slots never win


def test_indices_round_trip():
  indices = np.array([0, 1, 63, 151935, (1 << 30) - 1])
  _, low = grid_sync.orderable_key(jnp.zeros(5, jnp.float32), jnp.asarray(indices))
  np.testing.assert_array_equal(np.asarray(grid_sync.key_index(low)), indices)
