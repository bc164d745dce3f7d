"""The pieces of ``wts_jax.pallas.z_registers`` that run without a GPU: the stacked row
order and the fragment order of W1's planes (the register gather itself runs on the
device: ``tests/test_batched_walk_gpu.py`` and ``tools/registers_operand_probe.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from wts_jax.int8_state import fragment_ordered
from wts_jax.pallas.z_registers import gather_planes, stacked_row


def test_stacked_rows_pair_each_request_in_one_thread():
  """Rows 16w + g and 16w + g + 8 (one thread's two rows of the WGMMA layout) are one
  request's hi and lo planes, and the 64 rows hold 32 requests' two planes once each."""
  pairs = [stacked_row(m) for m in range(64)]
  assert sorted(pairs) == [(request, plane) for request in range(32) for plane in (0, 1)]
  for w in range(4):
    for g in range(8):
      assert stacked_row(16 * w + g) == (8 * w + g, 0)
      assert stacked_row(16 * w + g + 8) == (8 * w + g, 1)


@pytest.mark.parametrize("rank", [64, 256])
def test_fragment_order_puts_a_threads_bytes_together(rank):
  """Byte 16t + 4g + j of a plane moves to g·r/4 + 4t + j: the 4 bytes a thread holds in
  every 16-column tile (its g) become one run of r/4 bytes; a permutation of each row."""
  rng = np.random.default_rng(0)
  planes = rng.integers(-128, 128, (5, 2 * rank), dtype=np.int8)
  ordered = fragment_ordered(planes)
  for plane in range(2):
    for t in range(rank // 16):
      for g in range(4):
        for j in range(4):
          assert (ordered[:, plane * rank + g * rank // 4 + 4 * t + j]
                  == planes[:, plane * rank + 16 * t + 4 * g + j]).all()
  assert (np.sort(ordered, axis=1) == np.sort(planes, axis=1)).all()


def test_interpreted_gather_refuses_fragment_order():
  with pytest.raises(ValueError, match="fragment_order"):
    gather_planes(None, None, rank=256, interpret=True, fragment_order=True)
