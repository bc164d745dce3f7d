"""The counter-based Gumbel noise (CPU): ``log_positive`` within an ulp of the true log
everywhere the walks use it — in particular for u near 1, where a backend's approximate
``log`` loses the small ``-log(u)`` of a winning Gumbel value — and the noise a kernel
draws (Pallas interpret mode) bit for bit XLA's."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from wts_jax import sampling


def every_uniform() -> np.ndarray:
  """Every value ``uniform_from_stream`` can return: (m + 0.5) 2^-23, m < 2^23."""
  return ((np.arange(1 << 23, dtype=np.float64) + 0.5) * 2.0 ** -23).astype(np.float32)


def _ulps(got, exact) -> np.ndarray:
  return np.abs(np.asarray(got, np.float64) - exact) / np.spacing(
      np.abs(exact).astype(np.float32)).astype(np.float64)


def test_log_within_an_ulp_of_every_uniform_and_its_exponential():
  u = every_uniform()
  log = jax.jit(sampling.log_positive)
  inner = np.asarray(log(jnp.asarray(u)))
  assert _ulps(inner, np.log(u.astype(np.float64))).max() < 1.0
  exponential = -inner   # the outer log's arguments: (2^-24, 16.7)
  assert _ulps(log(jnp.asarray(exponential)), np.log(exponential.astype(np.float64))).max() < 1.0


def test_log_over_the_normal_range():
  x = np.exp(np.linspace(-87.0, 88.0, 200_001)).astype(np.float32)
  assert _ulps(jax.jit(sampling.log_positive)(jnp.asarray(x)),
               np.log(x.astype(np.float64))).max() < 1.0


def test_winning_gumbel_values_keep_their_precision():
  """The largest Gumbel values come from u nearest 1: there the noise must still be
  within 1e-6 of -log(-log(u)) in float64 (a lg2-approximate log is off by up to 1e-3)."""
  u = every_uniform()[-(1 << 16):]
  g = np.asarray(jax.jit(sampling.gumbel_from_uniform)(jnp.asarray(u)))
  exact = -np.log(-np.log(u.astype(np.float64)))
  assert np.abs(g - exact).max() < 2e-6
  assert g.max() > 16.0


def test_kernel_noise_is_xla_noise_bit_for_bit():
  u = jnp.asarray(every_uniform()[::61][:1 << 16])

  def kernel(u_ref, out_ref):
    out_ref[...] = sampling.gumbel_from_uniform(u_ref[...])

  in_kernel = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(u.shape, jnp.float32),
                             interpret=True)(u)
  np.testing.assert_array_equal(np.asarray(in_kernel).view(np.uint32),
                                np.asarray(jax.jit(sampling.gumbel_from_uniform)(u)).view(
                                    np.uint32))



def test_uniforms_are_the_top_23_hash_bits():
  """``uniform_from_stream`` is (m + 0.5) 2^-23 with m the top 23 bits of the hash."""
  stream = jnp.asarray([0x9E3779B9, 7, 0xFFFFFFFF], jnp.uint32)
  index = jnp.arange(1 << 16, dtype=jnp.uint32)
  u = np.asarray(jax.jit(sampling.uniform_from_stream)(stream[:, None], index[None, :]))
  bits = np.asarray(jax.jit(sampling.stream_bits)(stream[:, None], index[None, :]))
  np.testing.assert_array_equal(u, every_uniform()[bits >> 9])


def test_log_is_exact_in_its_exponent_at_every_binade():
  """At the powers of two ``log_positive`` is k ln 2 within an ulp, for every normal k,
  and log 1 is 0."""
  k = np.arange(-126, 128)
  x = np.ldexp(np.float32(1.0), k).astype(np.float32)
  assert _ulps(jax.jit(sampling.log_positive)(jnp.asarray(x)),
               np.log(x.astype(np.float64)))[k != 0].max() < 1.0
  assert float(jax.jit(sampling.log_positive)(jnp.float32(1.0))) == 0.0


@pytest.mark.mosaic
@pytest.mark.skipif(jax.__version_info__ < (0, 11),
                    reason="jax 0.10's Mosaic GPU interpreter cannot run tiled shared-memory "
                           "loads")
def test_noise_microbenchmark_kernel_draws_the_walks_noise():
  """``tools/noise_microbench.py``'s Mosaic kernel (interpret mode) draws, stage by stage,
  the values XLA computes from ``wts_jax.sampling``, so what it times is that noise."""
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import noise_microbench
  assert noise_microbench.check(blocks=2, tiles=2) == 0
