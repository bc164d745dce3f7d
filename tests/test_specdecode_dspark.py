"""The DSpark drafter's base logits against DeepSpec's drafter forward written in torch.

The torch function follows DeepSpec's ``Qwen3DSparkAttention`` / ``_forward_backbone``
line by line: the context (``hidden_norm(fc(target features))``) and the block are
projected by the same k/v projections, k_norm is applied to the concatenation, RoPE
runs over the context + block positions and q takes the last ``q_len`` of them, the
attention is non-causal, and ``base = lm_head(norm(h))``. The checkpoint goes through
``wts-convert --full`` and ``load_dspark``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from convert_fixtures import drafter_config, drafter_state_dict, write_checkpoint
import wts_jax
from wts_jax.convert.converter import convert
from wts_jax.specdecode.dspark import DSparkConfig, load_dspark
from wts_jax.specdecode.qwen3 import Qwen3Config


def _rms(x, weight, eps):
  x32 = x.float()
  return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_half(x):
  half = x.shape[-1] // 2
  return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def deepspec_block(state, config, features, block_ids, start):
  """DeepSpec's drafter forward at inference (one row): base logits [bs, V]."""
  eps, theta = config["rms_norm_eps"], config["rope_theta"]
  heads, kv_heads, head_dim = (config["num_attention_heads"],
                               config["num_key_value_heads"], config["head_dim"])
  target_hidden = _rms(features @ state["fc.weight"].T, state["hidden_norm.weight"], eps)
  hidden = state["embed_tokens.weight"][block_ids]
  ctx_len, q_len = target_hidden.shape[0], hidden.shape[0]
  positions = torch.arange(start - ctx_len, start + q_len, dtype=torch.float32)
  inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
  angles = torch.outer(positions, inv_freq)
  cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
  for layer in range(config["num_hidden_layers"]):
    w = {key[len(f"layers.{layer}."):]: value for key, value in state.items()
         if key.startswith(f"layers.{layer}.")}
    residual = hidden
    x = _rms(hidden, w["input_layernorm.weight"], eps)
    q = _rms((x @ w["self_attn.q_proj.weight"].T).view(q_len, heads, head_dim),
             w["self_attn.q_norm.weight"], eps).transpose(0, 1)
    k = torch.cat([target_hidden @ w["self_attn.k_proj.weight"].T,
                   x @ w["self_attn.k_proj.weight"].T]).view(-1, kv_heads, head_dim)
    v = torch.cat([target_hidden @ w["self_attn.v_proj.weight"].T,
                   x @ w["self_attn.v_proj.weight"].T]).view(-1, kv_heads, head_dim)
    k = _rms(k, w["self_attn.k_norm.weight"], eps).transpose(0, 1)
    v = v.transpose(0, 1)
    q = q * cos[-q_len:] + _rotate_half(q) * sin[-q_len:]
    k = k * cos + _rotate_half(k) * sin
    groups = heads // kv_heads
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    weights = torch.softmax(q @ k.transpose(1, 2) * head_dim ** -0.5, dim=-1)
    attended = (weights @ v).transpose(0, 1).reshape(q_len, heads * head_dim)
    hidden = residual + attended @ w["self_attn.o_proj.weight"].T
    x = _rms(hidden, w["post_attention_layernorm.weight"], eps)
    gate = torch.nn.functional.silu(x @ w["mlp.gate_proj.weight"].T)
    hidden = hidden + (gate * (x @ w["mlp.up_proj.weight"].T)) @ w["mlp.down_proj.weight"].T
  return _rms(hidden, state["norm.weight"], eps) @ state["lm_head.weight"].T


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  config = drafter_config("gated", confidence=True)
  config["torch_dtype"] = "float32"
  state = drafter_state_dict(config, dtype=torch.float32)
  src = write_checkpoint(tmp_path_factory.mktemp("src"), config, state)
  dst = convert(src, tmp_path_factory.mktemp("out") / "drafter", full=True, dtype="float32")
  return config, state, dst


def test_base_logits_match_deepspec_forward(converted):
  config, state, dst = converted
  drafter = load_dspark(dst, dtype=jnp.float32)
  assert drafter.head is not None and drafter.config.head.head_type == "gated"
  cfg = drafter.config
  d = cfg.layers.hidden_size
  rng = np.random.default_rng(0)
  starts = [5, 9]          # two rows with different context lengths in one batch
  features = rng.standard_normal((2, 12, len(cfg.target_layer_ids) * d)).astype(np.float32)
  last = np.array([7, 11])
  cache = drafter.empty_cache(2, 20)
  keys, values = drafter.context_kv(jnp.asarray(features), jnp.zeros(2, jnp.int32))
  cache = cache.write(keys, values, jnp.zeros(2, jnp.int32))
  base, hidden, _ = drafter.block(jnp.asarray(last), jnp.asarray(starts), cache)
  assert base.shape == (2, cfg.block_size, cfg.vocab_size)
  assert hidden.shape == (2, cfg.block_size, d)
  for row, start in enumerate(starts):
    block_ids = torch.full((cfg.block_size,), cfg.mask_token_id)
    block_ids[0] = int(last[row])
    expected = deepspec_block(state, config, torch.tensor(features[row, :start]),
                              block_ids, start)
    np.testing.assert_allclose(np.asarray(base[row]), expected.numpy(), atol=2e-3,
                               rtol=2e-3)


def test_draft_runs_the_walk_and_the_plain_argmax(converted):
  _, _, dst = converted
  drafter = load_dspark(dst, dtype=jnp.float32)
  base = jax.random.normal(jax.random.key(0), (2, 3, drafter.config.vocab_size))
  hidden = jax.random.normal(jax.random.key(1), (2, 3, drafter.config.layers.hidden_size))
  last = jnp.array([1, 2])
  walked = drafter.draft(base, hidden, last, temperature=0.0, key=None, walk_impl="xla")
  plain = drafter.draft(base, hidden, last, temperature=0.0, key=None, walk_impl="none")
  assert walked.tokens.shape == (2, 3) and walked.confidence.shape == (2, 3)
  head = drafter.head
  ref = wts_jax.walk(head, base, last, hidden if head.config.needs_hidden else None,
                     impl="xla")
  assert walked.tokens.tolist() == ref.tokens.tolist()
  np.testing.assert_array_equal(np.asarray(walked.confidence), np.asarray(ref.confidence))
  assert plain.tokens.tolist() == jnp.argmax(base, -1).tolist()
  sampled = drafter.draft(base, hidden, last, temperature=1.0, key=jax.random.key(2),
                          walk_impl="xla")
  assert sampled.q_logits.shape == base.shape


def test_a_dflash_drafter_loads_without_a_serial_head(tmp_path):
  config = drafter_config(None, rank=0, confidence=True, with_markov=False)
  config["torch_dtype"] = "float32"
  src = write_checkpoint(tmp_path / "src", config,
                         drafter_state_dict(config, dtype=torch.float32))
  drafter = load_dspark(convert(src, tmp_path / "out", full=True), dtype=jnp.float32)
  assert drafter.head is None and drafter.config.head is None


def test_a_head_only_conversion_is_refused(converted, tmp_path):
  config, state, _ = converted
  src = write_checkpoint(tmp_path / "src", config, state)
  head_only = convert(src, tmp_path / "head_only", dtype="float32")
  with pytest.raises(ValueError, match="--full"):
    load_dspark(head_only)


def test_bad_drafter_configs_are_named():
  target = Qwen3Config.tiny()
  with pytest.raises(ValueError, match="target_layer_ids"):
    DSparkConfig.tiny(target, target_layer_ids=(2, 1))
  with pytest.raises(ValueError, match="block_size"):
    DSparkConfig.tiny(target, block_size=0)
  assert DSparkConfig.tiny(target).head.confidence
  assert DSparkConfig.qwen3_8b().layers.hidden_size == 4096
