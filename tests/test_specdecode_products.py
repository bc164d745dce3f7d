"""Weight products: the Pallas kernel (run in interpret mode here) against an fp32
oracle, its plans, ``linear``'s choice between it and XLA, and the decode loop with the
kernel serving every product of a bf16 model (CPU, tiny shapes)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wts_jax.specdecode import autoregressive, products
from wts_jax.specdecode.dspark import DSparkConfig, make_dspark
from wts_jax.specdecode.loop import generate
from wts_jax.specdecode.qwen3 import Qwen3Config, make_qwen3

BF16 = dict(param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
PROMPTS = [[1, 2, 3], [4, 0, 5, 1, 2, 3, 0], [2, 2, 1, 0, 3]]


def _bf16_inputs(seed, x_shape, weight_shape):
  x_key, w_key = jax.random.split(jax.random.key(seed))
  x = jax.random.normal(x_key, x_shape, jnp.float32).astype(jnp.bfloat16)
  weight = (jax.random.normal(w_key, weight_shape, jnp.float32)
            * weight_shape[-1] ** -0.5).astype(jnp.bfloat16)
  return x, weight


def _oracle(x, weight):
  """``x Wᵀ`` of the bf16 values, in fp32 at full precision."""
  return jnp.einsum("...i,oi->...o", x.astype(jnp.float32), weight.astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


@pytest.mark.parametrize("rows,n,k,block_n,splits", [
    (1, 128, 256, 64, 1), (1, 256, 768, 32, 3), (8, 512, 384, 128, 1),
    (20, 192, 512, 64, 2), (128, 256, 256, 128, 2), (128, 128, 768, 32, 6)])
def test_the_kernel_equals_an_fp32_product_of_the_bf16_values(rows, n, k, block_n, splits):
  x, weight = _bf16_inputs(rows + n + k, (rows, k), (n, k))
  plan = products.plan_product(rows, n, k, block_n=block_n, splits=splits)
  assert plan is not None and (plan.block_n, plan.splits) == (block_n, splits)
  out = products.product_pallas(x, weight, plan, interpret=True)
  assert out.shape == (rows, n) and out.dtype == jnp.float32
  # The same bf16 products summed in fp32 in another order: fp32 rounding only.
  np.testing.assert_allclose(np.asarray(out), np.asarray(_oracle(x, weight)),
                             atol=1e-4, rtol=1e-4)


def test_plans_refuse_what_the_kernel_cannot_cut():
  assert products.plan_product(products.MAX_ROWS + 1, 256, 256) is None
  assert products.plan_product(4, 96, 256) is None            # 96 rows: no 64-row blocks
  assert products.plan_product(100, 192, 256) is None         # past 64 rows: 128-row blocks
  assert products.plan_product(4, 128, 200) is None           # 200 columns: no 128 tiles
  assert products.plan_product(4, 128, 384, splits=2) is None  # 3 tiles in 2 parts


@pytest.mark.parametrize("rows,n,k", [(1, 1024, 2560), (16, 4096, 2560), (64, 2560, 9728),
                                      (128, 151_936, 2560), (8, 64, 384)])
def test_chosen_splits_divide_the_tiles_and_fill_the_programs_where_they_can(rows, n, k):
  plan = products.plan_product(rows, n, k)
  tiles = k // plan.block_k
  blocks = n // plan.block_n
  assert tiles % plan.splits == 0
  dividers = [d for d in range(1, tiles + 1) if tiles % d == 0]
  reaching = [d for d in dividers if blocks * d >= products.TARGET_PROGRAMS]
  # The fewest splits that reach the target, else every tile its own split.
  assert plan.splits == (reaching[0] if reaching else tiles)
  assert plan.padded_rows >= max(rows, products.MIN_DOT_ROWS)


def test_linear_on_the_kernel_agrees_with_xla_in_shape_dtype_and_value():
  x, weight = _bf16_inputs(0, (3, 5, 256), (192, 256))
  kernel = products.linear(x, weight, "pallas")
  xla = products.linear(x, weight, "xla")
  assert kernel.shape == xla.shape == (3, 5, 192)
  assert kernel.dtype == xla.dtype == jnp.bfloat16
  # Both round one fp32 sum to bf16; their sums differ only in order.
  np.testing.assert_allclose(np.asarray(kernel, np.float32), np.asarray(xla, np.float32),
                             atol=1e-2, rtol=1e-2)
  text = str(jax.make_jaxpr(lambda a: products.linear(a, weight, "pallas"))(x))
  assert "pallas_call" in text


def test_linear_falls_back_to_xla_exactly_where_the_kernel_does_not_serve():
  x, weight = _bf16_inputs(1, (2, 3, 256), (128, 256))
  x32, weight32 = x.astype(jnp.float32), weight.astype(jnp.float32)
  np.testing.assert_array_equal(np.asarray(products.linear(x32, weight32, "pallas")),
                                np.asarray(products.linear(x32, weight32, "xla")))
  many, _ = _bf16_inputs(2, (3, products.MAX_ROWS, 256), (128, 256))
  np.testing.assert_array_equal(
      np.asarray(products.linear(many, weight, "pallas"), np.float32),
      np.asarray(products.linear(many, weight, "xla"), np.float32))
  for a in (x32, many):
    assert "pallas_call" not in str(jax.make_jaxpr(
        lambda v: products.linear(v, weight.astype(v.dtype), "pallas"))(a))


def test_auto_is_the_kernel_on_a_gpu_else_xla_and_an_unknown_impl_is_named():
  on_gpu = jax.default_backend() == "gpu"
  assert products.resolve("auto") == ("pallas" if on_gpu else "xla")
  assert products.resolve("pallas") == "pallas" and products.resolve("xla") == "xla"
  with pytest.raises(ValueError, match="products_impl='cublas'"):
    products.resolve("cublas")


@pytest.fixture(scope="module")
def models():
  """A bf16 target and drafter whose every weight the kernel can cut (dimensions
  multiples of 128: 64-row blocks, 128-column tiles), with GQA and ``num_heads *
  head_dim != hidden`` as the real models have."""
  target_config = Qwen3Config.tiny(vocab_size=128, num_layers=2, hidden_size=128,
                                   intermediate_size=256, num_heads=4, num_kv_heads=2,
                                   head_dim=64)
  target = make_qwen3(target_config, seed=3, **BF16)
  drafter = make_dspark(DSparkConfig.tiny(target_config, block_size=4,
                                          target_layer_ids=(-1, 1), rank=16),
                        seed=3, **BF16)
  return target, drafter


def test_the_kernel_serves_every_product_of_a_forward(models):
  target, _ = models
  config = target.config
  tokens = jnp.asarray(PROMPTS[0])[None]

  def forward(impl):
    return jax.make_jaxpr(lambda ids: target.forward(
        ids, jnp.zeros((1,), jnp.int32), None, products_impl=impl).logits)(tokens)
  # q, k, v, o, gate, up, down a layer, and the output projection
  assert str(forward("pallas")).count("pallas_call") == 7 * config.num_layers + 1
  assert "pallas_call" not in str(forward("xla"))


def test_greedy_tokens_are_the_same_with_the_kernel_as_with_xla(models):
  target, drafter = models
  run = {impl: generate(target, drafter, PROMPTS, 8, draft_len=3, walk_impl="xla",
                        products_impl=impl).rows()
         for impl in ("xla", "pallas")}
  assert run["pallas"] == run["xla"]
  plain = autoregressive.decode_autoregressive(target, PROMPTS, 8, products_impl="pallas")
  assert run["pallas"] == np.asarray(plain).tolist()


def test_an_unknown_products_impl_is_refused_by_name(models):
  target, drafter = models
  with pytest.raises(ValueError, match="products_impl='bogus'"):
    generate(target, drafter, PROMPTS, 3, products_impl="bogus")
  with pytest.raises(ValueError, match="products_impl='bogus'"):
    autoregressive.decode_autoregressive(target, PROMPTS, 3, products_impl="bogus")


def test_the_benchmark_takes_the_choice_and_records_it_resolved(capsys):
  from wts_jax.specdecode import bench_e2e
  parser = bench_e2e.build_parser()
  for flag, recorded in (("auto", "xla"), ("xla", "xla"), ("pallas", "pallas")):
    args = parser.parse_args(["--products", flag])
    assert bench_e2e._report(args, [], 0.0)["products"] == recorded
  with pytest.raises(SystemExit) as exit_info:
    parser.parse_args(["--products", "bogus"])
  assert exit_info.value.code == 2 and "'bogus'" in capsys.readouterr().err
