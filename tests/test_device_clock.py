"""The device clock (``wts_jax.pallas.device_clock``): the stamps' arithmetic on any
backend; the timer kernel compiled for the H200 without a GPU (jax's CUDA plugin
needed: its inline PTX goes through ptxas there); two stamps around a busy loop on the
GPU (``WTS_GPU_TESTS=1 python -m pytest -m gpu tests/test_device_clock.py``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.pallas import device_clock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import hlo_traffic  # noqa: E402


def _stamp_of(nanoseconds: int) -> np.ndarray:
  return np.array([nanoseconds & 0xFFFFFFFF, nanoseconds >> 32], np.uint32)


@pytest.mark.parametrize("start,elapsed", [
    (1_000, 12_345_678),                  # an iteration, exact in float32
    (2 ** 32 - 5_000, 17_000),            # across a carry into the high word
    (7 * 2 ** 32 + 123, 3 * 2 ** 32 + 9),  # longer than the low word holds
    (2 ** 40, -2_500),                    # a later stamp before an earlier one
    (5 * 2 ** 32 + 10, 0),
    (2 ** 36 + 999, 2 ** 24 - 1),          # float32's last exact nanosecond count
])
def test_elapsed_seconds_from_word_pairs(start, elapsed):
  got = jax.jit(device_clock.elapsed_seconds)(_stamp_of(start), _stamp_of(start + elapsed))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(float(got), elapsed * 1e-9, rtol=1e-7, atol=1e-12)


def test_no_clock_off_the_gpu():
  if jax.default_backend() == "gpu":
    pytest.skip("this backend has the clock")
  assert not device_clock.available()
  with pytest.raises(ValueError, match="needs a GPU"):
    device_clock.stamp(jnp.ones(3))


@pytest.mark.skipif(not hlo_traffic.cuda_available(),
                    reason="compiling for the H200 needs jax[cuda12]")
def test_stamps_compile_for_the_h200_after_their_operands():
  sharding = hlo_traffic.h200_sharding()

  def timed(x, flags):
    before = device_clock.stamp(x)
    y = jnp.tanh(x @ x)
    after = device_clock.stamp(y, flags)
    return y, device_clock.elapsed_seconds(before, after)

  args = hlo_traffic.abstract((jnp.zeros((256, 256), jnp.float32),
                               jnp.zeros((8,), bool)), sharding)
  with mock.patch.object(device_clock, "available", lambda: True):
    text = hlo_traffic.compile_hlo(jax.jit(timed), *args)
  calls = [line for line in text.splitlines()
           if "custom-call(" in line and "mosaic_gpu" in line]
  assert len(calls) == 2, calls                     # one timer kernel a stamp
  assert all("device_clock_stamp" in line for line in calls)
  assert all("u32[2]" in line.split("custom-call(")[0] for line in calls)
  # The second stamp takes the matmul's result (and the flags) as operands.
  second = [line for line in calls if "s8[8]" in line]
  assert len(second) == 1 and "f32[256,256]" in second[0]


@pytest.mark.skipif(not hlo_traffic.cuda_available(),
                    reason="compiling for the H200 needs jax[cuda12]")
def test_a_loop_carrying_its_stamp_compiles_for_the_h200():
  """The decode loop's use: each iteration stamps after its work, and the seconds since
  the previous stamp are that iteration's."""
  def loop(x):
    def body(carry):
      i, v, previous, seconds = carry
      v = jnp.tanh(v @ v)
      now = device_clock.stamp(v)
      return i + 1, v, now, seconds.at[i].set(device_clock.elapsed_seconds(previous, now))
    first = device_clock.stamp(x)
    return jax.lax.while_loop(lambda c: c[0] < 4, body,
                              (jnp.int32(0), x, first, jnp.zeros(4, jnp.float32)))
  args = hlo_traffic.abstract((jnp.zeros((128, 128), jnp.float32),),
                              hlo_traffic.h200_sharding())
  with mock.patch.object(device_clock, "available", lambda: True):
    text = hlo_traffic.compile_hlo(jax.jit(loop), *args)
  assert sum("custom-call(" in line and "mosaic_gpu" in line
             for line in text.splitlines()) == 2       # before the loop, and in its body


@pytest.mark.gpu
@pytest.mark.skipif(not os.environ.get("WTS_GPU_TESTS") or jax.default_backend() != "gpu",
                    reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1")
def test_two_stamps_around_a_busy_loop():
  assert device_clock.available()

  @jax.jit
  def timed(x):
    x, before = device_clock.stamp_between(x)
    y = jax.lax.fori_loop(0, 200, lambda _, v: jnp.tanh(v @ v) * 0.5 + v * 0.5, x)
    after = device_clock.stamp(y)
    return y, before, after

  x = jax.random.normal(jax.random.key(0), (2048, 2048), jnp.float32) * 0.01
  jax.block_until_ready(timed(x))                    # compiled and warm
  host_start = time.perf_counter()
  y, before, after = jax.block_until_ready(timed(x))
  host_seconds = time.perf_counter() - host_start
  device_seconds = float(device_clock.elapsed_seconds(before, after))
  # 200 matmuls of 2048^3 at most ~1000 TFLOP/s take >= 3 ms; the device's stamps fall
  # inside the host's wall time around the call.
  assert np.all(np.isfinite(np.asarray(y)))
  assert 3e-3 <= device_seconds <= host_seconds, (device_seconds, host_seconds)
  raw = np.asarray([before, after], np.uint64)
  assert (raw[1, 1] << 32 | raw[1, 0]) > (raw[0, 1] << 32 | raw[0, 0])
