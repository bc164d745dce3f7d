"""The Gumbel noise inside the GPU kernels (H200): ``WTS_GPU_TESTS=1 python -m pytest -m gpu``.

A Triton kernel and a Mosaic GPU kernel draw the noise for every uniform value the
counter hash can give (2^23 of them). The Triton kernel's equals XLA's bit for bit; the
Mosaic kernel's is within 2^-20 of it (its compiler contracts a different set of
multiply-adds: a few per cent of the values differ; where -log(u) is near 1, an ulp of the
inner log is many ulps of the small outer one, so the bound is absolute), which can order
two scores differently only where they are within 2^-20. The largest values (u nearest 1,
the ones that win a sampled step) stay within 2e-6 of the float64 noise."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl

from test_sampling import every_uniform
from wts_jax import sampling

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not os.environ.get("WTS_GPU_TESTS") or jax.default_backend() != "gpu",
                       reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1"),
]

BLOCK = 4096


def _kernel(u_ref, out_ref):
  out_ref[...] = sampling.gumbel_from_uniform(u_ref[...])


def _triton_noise(u):
  from jax.experimental.pallas import triton as pl_triton
  spec = pl.BlockSpec((BLOCK,), lambda i: (i,))
  return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(u.shape, jnp.float32),
                        grid=(u.shape[0] // BLOCK,), in_specs=[spec], out_specs=spec,
                        compiler_params=pl_triton.CompilerParams(num_warps=4))(u)


def _mosaic_noise(u):
  """As the batched kernel draws it: [64, 128] tiles in the WGMMA register layout, read
  from and written to global memory, a block a tile."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from wts_jax.pallas.mosaic_gpu_helpers import load as _load
  tiles = u.reshape(-1, 64, 128)

  def body(u_g, out_g):
    tile = lax.axis_index("blocks")
    x = _load(u_g.at[tile], plgpu.Layout.WGMMA, optimized=False)
    out_g.at[tile][...] = sampling.gumbel_from_uniform(x)

  kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(tiles.shape, jnp.float32),
                        grid=(tiles.shape[0],), grid_names=("blocks",))
  return kernel(tiles).reshape(u.shape)


@pytest.mark.parametrize("backend", ["mosaic", "triton"])
def test_kernel_noise_is_xla_noise(backend):
  u = jnp.asarray(every_uniform())
  in_kernel = np.asarray((_mosaic_noise if backend == "mosaic" else _triton_noise)(u))
  xla = np.asarray(jax.jit(sampling.gumbel_from_uniform)(u))
  # Compared as floats (a kernel may give +0.0 where XLA gives -0.0, at u = 1/e: the
  # same score), never NaN.
  assert not np.isnan(in_kernel).any()
  if backend == "triton":
    np.testing.assert_array_equal(in_kernel, xla)
  else:
    assert np.abs(in_kernel - xla).max() <= sampling.KERNEL_NOISE_TOLERANCE
  top = np.asarray(u)[-(1 << 16):].astype(np.float64)
  assert np.abs(in_kernel[-(1 << 16):] - -np.log(-np.log(top))).max() < 2e-6
