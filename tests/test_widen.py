"""``wts_jax.pallas.widen``: an int8 matrix widened to bf16 by a Pallas Triton kernel, bit
for bit XLA's convert (interpret mode on the CPU; the kernel itself with
``WTS_GPU_TESTS=1`` on the GPU), and the batched spec's choice between the two."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.pallas import widen


def _int8(shape, seed):
  return jax.random.randint(jax.random.key(seed), shape, -128, 128,
                            jnp.int32).astype(jnp.int8)


def _bits(values):
  return np.asarray(values).view(np.uint16)


@pytest.mark.parametrize("shape", [(64, 256), (1000, 64), (24, 192), (8, 64)])
def test_bits_equal_xla_convert(shape):
  values = _int8(shape, sum(shape))
  widened = widen.widen_to_bf16(values, interpret=True)
  assert widened.dtype == jnp.bfloat16 and widened.shape == shape
  np.testing.assert_array_equal(_bits(widened), _bits(values.astype(jnp.bfloat16)))


def test_extremes_exact():
  values = jnp.array([[-128, -127, -1, 0, 1, 127, 64, -64] * 8] * 8, jnp.int8)
  widened = widen.widen_to_bf16(values, interpret=True)
  np.testing.assert_array_equal(np.asarray(widened, np.float32),
                                np.asarray(values, np.float32))


@pytest.mark.parametrize("elements,block", [(151936 * 256, 8192), (64000, 512), (512, 512),
                                            (24 * 192, 512), (3, 1)])
def test_program_blocks_divide_the_array(elements, block):
  assert widen.elements_per_program(elements) == block
  assert elements % block == 0


def test_bad_inputs_named():
  with pytest.raises(ValueError, match="2-D int8 array, got float32"):
    widen.widen_to_bf16(jnp.zeros((8, 64), jnp.float32), interpret=True)
  with pytest.raises(ValueError, match="elements=0"):
    widen.elements_per_program(0)


@pytest.mark.gpu
@pytest.mark.skipif(not os.environ.get("WTS_GPU_TESTS") or jax.default_backend() != "gpu",
                    reason="needs an NVIDIA GPU and WTS_GPU_TESTS=1")
@pytest.mark.parametrize("shape", [(151936, 256), (1000, 64), (24, 192)])
def test_kernel_bits_equal_xla_convert_on_gpu(shape):
  values = _int8(shape, 3)
  np.testing.assert_array_equal(_bits(widen.widen_to_bf16(values)),
                                _bits(values.astype(jnp.bfloat16)))
