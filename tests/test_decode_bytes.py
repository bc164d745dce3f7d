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


def _configs(num_layers: int = 4):
  from wts_jax.specdecode.dspark import DSparkConfig
  from wts_jax.specdecode.qwen3 import Qwen3Config
  target = Qwen3Config.tiny(vocab_size=32_768, num_layers=num_layers, hidden_size=1024,
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


@pytest.mark.parametrize("batch", [1, 16])
def test_no_branch_of_the_loops_iteration_copies_a_cache_layer(batch):
  """The whole decode loop compiled for the H200 with a policy of three branches (no
  draft, 3, 7): no computation the iteration runs copies a cache layer (at one row the
  no-draft branch once copied every layer's cache, around JAX's decode kernel). The
  prefill's zero caches may be copies of one broadcast: they are made once a call."""
  import dataclasses
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from wts_jax.specdecode import attention, loop
  from wts_jax.specdecode.dspark import DSparkDrafter
  from wts_jax.specdecode.qwen3 import Qwen3

  @jax.tree_util.register_dataclass
  @dataclasses.dataclass(frozen=True)
  class ThreeBranches:   # drafts 7 every iteration; the switch still has all three
    draft_lens: tuple = dataclasses.field(default=(0, 3, 7), metadata=dict(static=True))

    def init(self, rows):
      return jnp.zeros((rows,), jnp.int32)

    def choose(self, state, active, new_request=None, rows=None):
      return jnp.int32(7), jnp.full(active.shape, 7, jnp.int32), state

    def observe(self, state, k, accepted, *args, **kwargs):
      return state

  target_config, drafter_config = _configs()
  target = nnx.eval_shape(lambda: Qwen3(target_config, rngs=nnx.Rngs(0)))
  drafter = nnx.eval_shape(lambda: DSparkDrafter(drafter_config, rngs=nnx.Rngs(1)))
  prompt, new = 64, 16
  settings = loop.LoopSettings(new, 0.0, (0, 3, 7), "xla", prompt + new + 7,
                               attention="pallas")
  (target_graph, target_state), (drafter_graph, drafter_state) = (nnx.split(target),
                                                                  nnx.split(drafter))
  sharding = hlo_traffic.h200_sharding()

  def arg(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
  args = (hlo_traffic.abstract(target_state, sharding),
          hlo_traffic.abstract(drafter_state, sharding), ThreeBranches(),
          arg((batch, prompt), jnp.int32), arg((batch,), jnp.int32), arg((1,), jnp.int32),
          jax.random.key(0))
  compiled = loop._compiled(target_graph, drafter_graph, settings, batch)
  with jax.default_device(next(iter(sharding.device_set))):
    text = compiled.trace(*args).lower().compile().as_text()
  caches = {hlo_traffic.hlo_shape(leaf.dtype, leaf.shape) for model in (target, drafter)
            for leaf in jax.tree.leaves(jax.eval_shape(
                lambda m=model: m.empty_cache(batch, settings.cache_len)))}
  assert attention.padded_cache_len(settings.cache_len) in {
      int(shape.split(",")[2]) for shape in caches}
  found = hlo_traffic.computations(text)
  entry = hlo_traffic.entry_name(found)
  copies = [line.strip()[:160] for name in hlo_traffic.top_level(found) if name != entry
            for line in found[name]
            if " copy(" in line and any(f" {shape}" in line.split("=")[1][:60]
                                        for shape in caches)]
  assert not copies, copies


def test_a_verify_layer_at_one_row_is_eleven_kernels_its_attention_two():
  """Kernels a layer of a verify pass at B = 1 (the difference of a 5- and a 3-layer
  model's counts, halved): the products, the split q/k/v product's reduction, the norms
  and residual adds, and the attention kernel (which norms, rotates and writes the new
  keys and values itself) with its merge — nothing around the attention to norm, write,
  group or transpose."""
  import decode_bytes
  from flax import nnx
  from wts_jax.specdecode.dspark import DSparkDrafter
  from wts_jax.specdecode.qwen3 import Qwen3
  counts = {}
  for layers in (3, 5):
    target_config, drafter_config = _configs(layers)
    target = nnx.eval_shape(lambda: Qwen3(target_config, rngs=nnx.Rngs(0)))
    drafter = nnx.eval_shape(lambda: DSparkDrafter(drafter_config, rngs=nnx.Rngs(1)))
    record = decode_bytes.phase_bytes(target, drafter, batch=1, draft_len=7,
                                      prompt_len=64, phases=("verify",))["verify"]
    counts[layers] = (record["operations"], record["attention_kernels"])
  per_layer = (counts[5][0] - counts[3][0]) / 2
  attention_per_layer = (counts[5][1] - counts[3][1]) / 2
  assert attention_per_layer == 2, counts
  assert per_layer <= 11, counts
