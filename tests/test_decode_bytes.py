"""The decode loop's forwards read every weight where it lies and write every cache in
place: compiled for the H200 (no GPU needed, but jax's CUDA plugin is), no operation
writes a copy of a weight or of a cache layer, and a verify pass moves little more than
the bytes it must read. A scan over stacked layer weights, which slices each layer's
weights into a copy, is caught by the same check."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import hlo_traffic  # noqa: E402

pytestmark = pytest.mark.skipif(not hlo_traffic.cuda_available(),
                                reason="compiling for the H200 needs jax[cuda12]")


def _configs():
  from wts_jax.specdecode.dspark import DSparkConfig
  from wts_jax.specdecode.qwen3 import Qwen3Config
  target = Qwen3Config.tiny(vocab_size=32_768, num_layers=4, hidden_size=1024,
                            intermediate_size=4096, num_heads=8, num_kv_heads=2,
                            head_dim=128)
  return target, DSparkConfig.tiny(target, block_size=7, rank=64)


# 16 rows: the loop's products run on cuBLAS (``launch_options.CUBLAS_PRODUCTS``), which
# reads a weight only from a buffer of its own: a converted or concatenated copy counts.
@pytest.mark.parametrize("batch", [1, 16])
def test_no_weight_or_cache_is_copied_and_a_verify_pass_moves_what_it_must_read(batch):
  import decode_bytes
  from flax import nnx
  from wts_jax.specdecode.dspark import DSparkDrafter
  from wts_jax.specdecode.qwen3 import Qwen3
  target_config, drafter_config = _configs()
  target = nnx.eval_shape(lambda: Qwen3(target_config, rngs=nnx.Rngs(0)))
  drafter = nnx.eval_shape(lambda: DSparkDrafter(drafter_config, rngs=nnx.Rngs(1)))
  phases = decode_bytes.phase_bytes(target, drafter, batch=batch, draft_len=7,
                                    prompt_len=64)
  for phase, record in phases.items():
    assert record["weight_copy_bytes"] == 0, (phase, record)
    assert record["cache_copy_bytes"] == 0, (phase, record)
  if batch == 1:
    assert phases["verify"]["moved_over_must_read"] < 1.2, phases["verify"]


def test_the_check_sees_a_stacked_scan_copy_each_layers_weights():
  import jax
  import jax.numpy as jnp
  layers, dim = 6, 1024
  stacked = jax.ShapeDtypeStruct((layers, dim, dim), jnp.bfloat16,
                                 sharding=hlo_traffic.h200_sharding())
  x = jax.ShapeDtypeStruct((1, dim), jnp.bfloat16, sharding=hlo_traffic.h200_sharding())

  def scanned(weights, x):
    return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, weights)[0]
  text = hlo_traffic.compile_hlo(jax.jit(scanned), stacked, x)
  summary = hlo_traffic.summary(text, weight_shapes={"bf16[1024,1024]", "bf16[1,1024,1024]"})
  assert summary["weight_copy_bytes"] >= dim * dim * 2, summary


def test_the_qwen3_4b_drafter_pass_copies_no_weight_and_no_cache():
  """At the real drafter's shape (five layers over one context): XLA's dot merger joined
  the layers' context key/value products over a concatenated copy of their weights
  (52 MB a pass at one row) until the loop's options turned it off; a block written
  into the cache before the context's write needs no copy of it."""
  import decode_bytes
  from flax import nnx
  from wts_jax.specdecode.bench_e2e import model_configs
  from wts_jax.specdecode.dspark import DSparkDrafter
  from wts_jax.specdecode.qwen3 import Qwen3
  target_config, drafter_config = model_configs("qwen3_4b", "vanilla")
  target = nnx.eval_shape(lambda: Qwen3(target_config, rngs=nnx.Rngs(0)))
  drafter = nnx.eval_shape(lambda: DSparkDrafter(drafter_config, rngs=nnx.Rngs(1)))
  record = decode_bytes.phase_bytes(target, drafter, batch=1, draft_len=7, prompt_len=64,
                                    phases=("drafter",))["drafter"]
  assert record["weight_copy_bytes"] == 0 and record["cache_copy_bytes"] == 0, record
