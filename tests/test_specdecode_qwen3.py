"""The Qwen3 target against transformers' Qwen3ForCausalLM (torch, CPU, float32).

The checkpoint is written by transformers' own ``save_pretrained`` at tiny sizes, so
the key names are the released ones (``model.layers.N.self_attn.q_proj.weight``, …).
"""

import json

import jax.numpy as jnp
import numpy as np
import pytest
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file

from wts_jax.specdecode.qwen3 import KVCache, Qwen3Config, load_qwen3

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0})


def write_hf_qwen3(directory, *, tied: bool, seed: int = 0):
  """A random transformers Qwen3ForCausalLM saved to ``directory``; returns the model."""
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(**TINY, tie_word_embeddings=tied)
  model = transformers.Qwen3ForCausalLM(config).eval()
  with torch.no_grad():   # norms away from 1 and larger weights: the test must see them
    for name, param in model.named_parameters():
      if name.endswith("norm.weight"):
        param.copy_(1 + 0.2 * torch.randn_like(param))
      elif param.ndim == 2:
        param.copy_(torch.randn_like(param) * param.shape[1] ** -0.5)
  model.save_pretrained(directory)
  return model


@pytest.mark.parametrize("tied", [False, True])
def test_logits_and_hidden_states_match_transformers(tmp_path, tied):
  torch_model = write_hf_qwen3(tmp_path, tied=tied)
  keys = set(load_file(tmp_path / "model.safetensors"))
  assert "model.layers.0.self_attn.q_norm.weight" in keys
  assert ("lm_head.weight" in keys) == (not tied)
  model = load_qwen3(tmp_path, dtype=jnp.float32)
  assert model.config.tie_word_embeddings == tied and model.config.rope_theta == 10_000.0

  tokens = np.random.default_rng(0).integers(0, 96, (2, 11))
  with torch.no_grad():
    ref = torch_model(torch.tensor(tokens), output_hidden_states=True)
  out = model.forward(jnp.asarray(tokens), jnp.zeros(2, jnp.int32), None,
                      feature_layers=(-1, 0, 1))
  np.testing.assert_allclose(np.asarray(out.logits), ref.logits.numpy(), atol=2e-4,
                             rtol=2e-4)
  # hidden_states[l + 1] is layer l's output (index 0 the embeddings), as DeepSpec reads it
  expected = np.concatenate([ref.hidden_states[i].numpy() for i in (0, 1, 2)], axis=-1)
  np.testing.assert_allclose(np.asarray(out.features), expected, atol=2e-4, rtol=2e-4)


def test_verify_over_a_cache_matches_a_full_forward_per_row(tmp_path):
  """Rows at different cache lengths, K + 1 new tokens each, equal the uncached run."""
  write_hf_qwen3(tmp_path, tied=False)
  model = load_qwen3(tmp_path, dtype=jnp.float32)
  rng = np.random.default_rng(1)
  tokens = jnp.asarray(rng.integers(0, 96, (3, 14)))
  full = model.forward(tokens, jnp.zeros(3, jnp.int32), None)
  lengths = jnp.array([3, 9, 6], jnp.int32)
  cache = model.empty_cache(3, 24)
  cache = cache.write(full.keys, full.values, jnp.zeros(3, jnp.int32))  # rows past `lengths` are garbage
  steps = 5
  block = jnp.stack([jnp.asarray(tokens)[b, int(n):int(n) + steps]
                     for b, n in enumerate(lengths)])
  out = model.forward(block, lengths, cache)
  for b, n in enumerate(np.asarray(lengths)):
    np.testing.assert_allclose(np.asarray(out.logits[b]),
                               np.asarray(full.logits[b, n:n + steps]), atol=1e-4)


def test_cache_write_puts_each_row_at_its_start():
  cache = KVCache.empty(2, 2, 8, 1, 2, jnp.float32)
  assert cache.max_len >= 8 and len(cache.keys) == 2
  new = jnp.ones((2, 2, 1, 3, 2))                     # [L, B, Kv, T, h]
  written = cache.write(new, 2 * new, jnp.array([1, 4]))
  for layer in range(2):
    occupied = np.asarray(written.keys[layer][:, 0, :, 0])
    assert occupied[:, :8].tolist() == [[0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 0]]
    assert not occupied[:, 8:].any()
    assert np.asarray(written.values[layer]).max() == 2


def test_bad_checkpoints_are_refused_by_name(tmp_path):
  write_hf_qwen3(tmp_path, tied=False)
  state = load_file(tmp_path / "model.safetensors")
  missing = dict(state)
  del missing["model.layers.2.mlp.up_proj.weight"]
  save_file(missing, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match="layers.2.mlp.up_proj.weight"):
    load_qwen3(tmp_path, dtype=jnp.float32)
  extra = dict(state, **{"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)})
  save_file(extra, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match="q_proj.bias"):
    load_qwen3(tmp_path, dtype=jnp.float32)
  wrong = dict(state, **{"model.norm.weight": torch.ones(31)})
  save_file(wrong, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match="norm.weight.*31"):
    load_qwen3(tmp_path, dtype=jnp.float32)
  config = json.loads((tmp_path / "config.json").read_text())
  config["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0}
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="rope_scaling"):
    load_qwen3(tmp_path)


def test_presets_have_the_released_shapes():
  four, eight = Qwen3Config.qwen3_4b(), Qwen3Config.qwen3_8b()
  assert (four.hidden_size, four.num_heads * four.head_dim, four.tie_word_embeddings) == (
      2560, 4096, True)
  assert (eight.hidden_size, eight.intermediate_size, eight.tie_word_embeddings) == (
      4096, 12288, False)
  with pytest.raises(ValueError, match="num_heads=6"):
    Qwen3Config.tiny(num_heads=6, num_kv_heads=4)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_products_are_written_in_the_compute_dtype_and_accumulated_in_fp32(dtype):
  # Asked for fp32 and converted after, a one-row product became an fp32 GEMV over a
  # converted copy of the weight on the GPU (docs/decisions.md).
  import jax
  from wts_jax.specdecode.qwen3 import linear, output_logits
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((1, 3, 256)), dtype)
  w = jnp.asarray(rng.standard_normal((96, 256)), jnp.bfloat16)
  for fn in (linear, output_logits):
    jaxpr = jax.make_jaxpr(fn)(x, w)
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    assert [d.params["preferred_element_type"] for d in dots] == [jnp.dtype(dtype)], fn
    assert fn(x, w).dtype == dtype
  # fp32 accumulation: within one rounding of the output dtype of the fp32 sum, plus
  # the fp32 sum's own error bound (terms × eps × Σ|xᵢwᵢ|: the order of the additions
  # differs between CPUs' vector units)
  xs, ws = np.asarray(x, np.float64), np.asarray(w, np.float64)
  want = xs @ ws.T
  got = np.asarray(linear(x, w), np.float64)
  rounding = 2.0 ** -8 if dtype == jnp.bfloat16 else 2.0 ** -24
  bound = rounding * np.abs(want) + xs.shape[-1] * 2.0 ** -24 * (np.abs(xs) @ np.abs(ws).T)
  assert np.all(np.abs(got - want) <= bound), np.max(np.abs(got - want) - bound)


def test_the_query_key_norm_keeps_its_scale_apart_from_256_rows():
  """The norm's scale behind an optimization barrier from ``QK_SCALE_APART_ROWS`` rows
  (XLA fuses it otherwise, one kernel fewer at few rows, fp32 normed heads written at
  many), the same values either way."""
  import jax
  from wts_jax.specdecode import qwen3
  x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 5, 6, 16)), jnp.bfloat16)
  w = jnp.asarray(np.random.default_rng(1).standard_normal((6, 16)), jnp.float32)
  np.testing.assert_array_equal(np.asarray(qwen3.rms_norm(x, w, 1e-6), np.float32),
                                np.asarray(qwen3.rms_norm(x, w, 1e-6, scale_apart=True),
                                           np.float32))
  config = Qwen3Config.tiny()
  model = qwen3.make_qwen3(config)
  layer = model.layers[0].weights()

  def barriers(batch, steps):
    h = jnp.zeros((batch, steps, config.hidden_size), jnp.bfloat16)
    positions = jnp.zeros((batch, steps), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda h: qwen3.project_qkv(h, layer, config, positions))(h)
    return sum(e.primitive.name == "optimization_barrier" for e in jaxpr.eqns)

  assert barriers(16, 8) == 0 and barriers(1, 1) == 0
  assert barriers(32, 8) == 1 and barriers(256, 1) == 1
