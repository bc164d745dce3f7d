"""The checkpoint converter: real DeepSpec-layout files in, a walkable JAX head out.

Every checkpoint here is written as real files (safetensors, sharded with an index,
``.bin``) with DeepSpec's key names, converted through the CLI, loaded, and checked
against a PyTorch DeepSpec-semantics walk built from the same files; every refusal is
checked for its message and for leaving nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
from flax import nnx  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from convert_fixtures import (HIDDEN, RANK, VOCAB, backbone_keys,  # noqa: E402
                              drafter_config, drafter_state_dict, oracle_head,
                              write_checkpoint)
from wts_jax.api import walk  # noqa: E402
from wts_jax.convert import ConversionError  # noqa: E402
from wts_jax.convert.cli import main  # noqa: E402
from wts_jax.convert.manifest import flatten  # noqa: E402
from wts_jax.heads import DraftHead, HeadConfig  # noqa: E402
from wts_jax.loading import from_torch_state_dict, load, load_drafter  # noqa: E402
from wts_jax.peers.deepspec_torch import sample_block_tokens  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCH, STEPS = 8, 7


def run_cli(*args) -> int:
  return main([str(arg) for arg in args] + ["--no-progress"])


def staging_leftovers(directory: Path) -> list[str]:
  return [path.name for path in directory.iterdir() if "wts-convert" in path.name]


def bits(array) -> np.ndarray:
  """The raw bytes of a bf16/fp tensor or array, for bit-exact comparison."""
  if isinstance(array, torch.Tensor):
    if array.dtype == torch.bfloat16:
      return array.view(torch.int16).numpy().view(np.uint16)
    return array.numpy().view(np.uint8)
  array = np.asarray(array)
  return array.view(np.uint16) if array.dtype.itemsize == 2 else array.view(np.uint8)


def head_arrays(head: DraftHead) -> dict:
  """A ``DraftHead``'s parameters by DeepSpec key (its attribute paths)."""
  return flatten(nnx.to_pure_dict(nnx.state(head, nnx.Param)))


def read_files_back(src: Path) -> dict:
  """Every tensor of a checkpoint directory, read with torch/safetensors directly."""
  tensors = {}
  for path in sorted(src.iterdir()):
    if path.suffix == ".safetensors":
      tensors.update(load_file(str(path)))
    elif path.suffix == ".bin":
      tensors.update(torch.load(path, weights_only=True))
  return tensors


def oracle_from_files(src: Path, config: dict):
  """A PyTorch DeepSpec head loaded (strictly) from the checkpoint's own tensors, fp32."""
  tensors = read_files_back(src)
  head_keys = {key: value for key, value in tensors.items()
               if key.startswith(("markov_head.", "confidence_head."))}
  oracle = oracle_head(config)
  oracle.load_state_dict(head_keys, strict=True)
  return oracle.float()


def walk_inputs(seed: int):
  rng = np.random.default_rng(seed)
  base = (rng.standard_normal((BATCH, STEPS, VOCAB)) * 2.0).astype(np.float32)
  hidden = rng.standard_normal((BATCH, STEPS, HIDDEN)).astype(np.float32)
  first = rng.integers(0, VOCAB, BATCH)
  return base, hidden, first


def assert_walks_like_deepspec(head: DraftHead, oracle, seed: int) -> None:
  base, hidden, first = walk_inputs(seed)
  output = walk(head, jnp.asarray(base), jnp.asarray(first, jnp.int32),
                jnp.asarray(hidden), impl="xla")
  # fp32 math on the bf16 weights, z rounded to bf16 before W2: the wts_jax contract.
  tokens, confidence, _ = sample_block_tokens(
      oracle, torch.from_numpy(base), torch.from_numpy(first), torch.from_numpy(hidden))
  np.testing.assert_array_equal(np.asarray(output.tokens), tokens.numpy())
  if oracle.confidence_head is None:
    assert output.confidence is None
  else:
    np.testing.assert_allclose(np.asarray(output.confidence), confidence.numpy(),
                               rtol=1e-4, atol=1e-4)


# --- conversion, loading, and the walk against the PyTorch DeepSpec walk ---------------

WALK_CASES = [
    # head type, confidence head, confidence reads e, layout, config dtype field
    ("vanilla", False, False, "safetensors", "torch_dtype"),
    ("vanilla", True, True, "sharded", "dtype"),
    ("gated", True, True, "bin", "torch_dtype"),
    ("gated", True, False, "safetensors", "dtype"),
    ("rnn", True, True, "sharded-bin", "torch_dtype"),
    ("rnn", False, False, "safetensors", "torch_dtype"),
]


@pytest.mark.parametrize("head_type,confidence,with_markov,layout,dtype_field", WALK_CASES)
def test_converted_head_walks_like_deepspec(tmp_path, head_type, confidence, with_markov,
                                            layout, dtype_field):
  config = drafter_config(head_type, confidence=confidence, with_markov=with_markov,
                          dtype_field=dtype_field)
  state = drafter_state_dict(config, seed=len(tmp_path.name))
  src = write_checkpoint(tmp_path / "src", config, state, layout=layout,
                         training_files=True)

  assert run_cli(src, tmp_path / "dst") == 0
  head = load(tmp_path / "dst")

  assert isinstance(head, DraftHead)
  assert head.config == HeadConfig(VOCAB, RANK, HIDDEN, head_type, confidence,
                                   with_markov)
  loaded = head_arrays(head)
  assert set(loaded) == {key for key in state if key not in backbone_keys()}
  for key, array in loaded.items():
    assert array.dtype == jnp.bfloat16, key
    np.testing.assert_array_equal(bits(array), bits(state[key]), err_msg=key)
  assert_walks_like_deepspec(head, oracle_from_files(src, config), seed=7)


def test_full_conversion_round_trips_every_tensor_bit_exactly(tmp_path):
  config = drafter_config("gated", confidence=True)
  state = drafter_state_dict(config, seed=3)
  src = write_checkpoint(tmp_path / "src", config, state, layout="sharded",
                         training_files=True)

  assert run_cli(src, tmp_path / "dst", "--full") == 0
  drafter = load_drafter(tmp_path / "dst")

  converted = {**head_arrays(drafter.head), **drafter.backbone}
  assert set(converted) == set(state)
  for key, tensor in state.items():
    assert tuple(converted[key].shape) == tuple(tensor.shape), key
    assert converted[key].dtype == jnp.bfloat16, key
    np.testing.assert_array_equal(bits(converted[key]), bits(tensor), err_msg=key)
  assert drafter.config.target_layer_ids == (1, 3)
  assert drafter.config.markov_head_type == "gated"
  manifest = json.loads((tmp_path / "dst" / "wts_config.json").read_text())
  assert manifest["dtype"] == "bfloat16"
  assert manifest["source_config"] == config
  assert sorted(manifest["tensors"]) == [
      "backbone/embed_tokens", "backbone/fc", "backbone/hidden_norm", "backbone/layers.0",
      "backbone/layers.1", "backbone/lm_head", "backbone/norm", "head"]
  assert set(manifest["tensors"]["backbone/layers.1"]) == {
      key for key in backbone_keys() if key.startswith("layers.1.")}
  # load() reads the head alone, even from a --full conversion.
  np.testing.assert_array_equal(
      bits(load(tmp_path / "dst").markov_head.markov_w2.weight[...]),
      bits(state["markov_head.markov_w2.weight"]))
  assert_walks_like_deepspec(drafter.head, oracle_from_files(src, config), seed=11)


def test_head_only_conversion_has_no_backbone(tmp_path):
  config = drafter_config("vanilla")
  src = write_checkpoint(tmp_path / "src", config, drafter_state_dict(config))
  assert run_cli(src / "model.safetensors", tmp_path / "dst") == 0   # a file as SRC
  drafter = load_drafter(tmp_path / "dst")
  assert drafter.backbone is None
  assert drafter.head.confidence_head is None
  assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["head", "wts_config.json"]


def test_deepspec_dflash_checkpoint_converts_backbone_only(tmp_path, capsys):
  config = drafter_config(None, rank=0)
  state = drafter_state_dict(config, seed=5)
  src = write_checkpoint(tmp_path / "src", config, state, layout="safetensors")

  assert run_cli(src, tmp_path / "head_only") == 2
  assert "markov_rank=0" in capsys.readouterr().err
  assert not (tmp_path / "head_only").exists()

  assert run_cli(src, tmp_path / "dst", "--full") == 0
  drafter = load_drafter(tmp_path / "dst")
  assert drafter.head is None
  assert drafter.config.markov_rank == 0
  assert set(drafter.backbone) == set(state)
  for key, tensor in state.items():
    np.testing.assert_array_equal(bits(drafter.backbone[key]), bits(tensor), err_msg=key)
  with pytest.raises(ConversionError, match="no serial head.*load_drafter"):
    load(tmp_path / "dst")


def test_dflash_confidence_head_travels_with_the_backbone(tmp_path):
  config = drafter_config(None, rank=0, confidence=True, with_markov=False)
  state = drafter_state_dict(config)
  src = write_checkpoint(tmp_path / "src", config, state)
  assert run_cli(src, tmp_path / "dst", "--full") == 0
  backbone = load_drafter(tmp_path / "dst").backbone
  np.testing.assert_array_equal(bits(backbone["confidence_head.proj.weight"]),
                                bits(state["confidence_head.proj.weight"]))


def test_dtype_cast_on_convert_and_on_load(tmp_path):
  config = drafter_config("rnn", confidence=True)
  state = drafter_state_dict(config)
  src = write_checkpoint(tmp_path / "src", config, state)

  assert run_cli(src, tmp_path / "f32", "--dtype", "float32") == 0
  assert run_cli(src, tmp_path / "bf16") == 0
  cast_on_convert = head_arrays(load(tmp_path / "f32"))
  cast_on_load = head_arrays(load(tmp_path / "bf16", dtype=jnp.float32))
  for key, array in cast_on_convert.items():
    assert array.dtype == jnp.float32 and cast_on_load[key].dtype == jnp.float32, key
    np.testing.assert_array_equal(np.asarray(array), state[key].float().numpy())
    np.testing.assert_array_equal(np.asarray(cast_on_load[key]), state[key].float().numpy())
  manifest = json.loads((tmp_path / "f32" / "wts_config.json").read_text())
  assert (manifest["dtype"], manifest["source"]["dtype"]) == ("float32", "bfloat16")


# --- the in-memory path -----------------------------------------------------------------


def test_from_torch_state_dict_with_wrapped_keys_equals_load(tmp_path):
  config = drafter_config("gated", confidence=True)
  state = drafter_state_dict(config, seed=9)
  src = write_checkpoint(tmp_path / "src", config, state)
  assert run_cli(src, tmp_path / "dst") == 0

  wrapped = {f"_orig_mod.module.{key}": value for key, value in state.items()}
  in_memory = head_arrays(from_torch_state_dict(wrapped, config))
  from_disk = head_arrays(load(tmp_path / "dst"))
  assert set(in_memory) == set(from_disk)
  for key in from_disk:
    np.testing.assert_array_equal(bits(in_memory[key]), bits(from_disk[key]), err_msg=key)


def test_from_torch_state_dict_accepts_the_head_alone_as_numpy(tmp_path):
  config = drafter_config("rnn", confidence=True)
  state = drafter_state_dict(config, seed=2)
  head_only = {key: value.float().numpy().astype(ml_dtypes.bfloat16)
               for key, value in state.items() if key not in backbone_keys()}
  head = from_torch_state_dict(head_only, config)
  oracle = oracle_head(config)
  oracle.load_state_dict({key: value for key, value in state.items()
                          if key not in backbone_keys()}, strict=True)
  assert_walks_like_deepspec(head, oracle.float(), seed=4)


def test_from_torch_state_dict_refuses_a_partial_backbone():
  config = drafter_config("vanilla")
  state = drafter_state_dict(config)
  del state["lm_head.weight"]
  with pytest.raises(ConversionError, match=r"missing 1 tensor\(s\).*'lm_head.weight'"):
    from_torch_state_dict(state, config)


# --- the CLI: inspect, progress, force, entry point -------------------------------------


def test_inspect_reports_format_head_shapes_and_ignored_files(tmp_path, capsys):
  config = drafter_config("rnn", confidence=True)
  src = write_checkpoint(tmp_path / "src", config, drafter_state_dict(config),
                         layout="sharded", training_files=True)
  assert main(["inspect", str(src)]) == 0
  report = capsys.readouterr().out
  for text in ("safetensors, sharded (2 files, index model.safetensors.index.json)",
               "rnn, markov_rank 16; confidence head on, reading [h | e]",
               "markov_head.joint_proj.weight", "[48, 64]", "bfloat16",
               "head, converted by default (6 tensors",
               "backbone, converted with --full (27 tensors",
               "training_state.rank0.pt", "training state", "train_config.py",
               "refused: no"):
    assert text in report, text
  assert not list(tmp_path.glob("**/wts_config.json"))


def test_inspect_explains_a_refusal(tmp_path, capsys):
  config = drafter_config("vanilla")
  config["architectures"] = ["DFlashDraftModel"]
  config["dflash_config"] = {"target_layer_ids": [1, 3]}
  src = write_checkpoint(tmp_path / "src", config, drafter_state_dict(drafter_config()))
  assert main(["inspect", str(src)]) == 2
  captured = capsys.readouterr()
  report = captured.out
  assert "source    " in report and "(safetensors)" in report
  assert "REFUSED:" in report and "z-lab DFlash" in report
  error = captured.err.strip()
  assert len(error.splitlines()) == 1 and error.startswith("wts-convert inspect: error: ")
  assert "z-lab DFlash" in error


def test_progress_bar_on_stderr(tmp_path, capsys):
  config = drafter_config("vanilla")
  src = write_checkpoint(tmp_path / "src", config, drafter_state_dict(config))
  assert main([str(src), str(tmp_path / "dst"), "--full", "--progress"]) == 0
  err = capsys.readouterr().err
  assert "100%" in err and "lm_head.weight" in err and "writing backbone/lm_head/" in err


def test_existing_destination_needs_force(tmp_path, capsys):
  config = drafter_config("vanilla")
  src = write_checkpoint(tmp_path / "src", config, drafter_state_dict(config))
  dst = tmp_path / "dst"
  assert run_cli(src, dst) == 0
  manifest_before = (dst / "wts_config.json").read_text()

  assert run_cli(src, dst, "--dtype", "float32") == 2
  assert "already exists; pass --force" in capsys.readouterr().err
  assert (dst / "wts_config.json").read_text() == manifest_before

  assert run_cli(src, dst, "--dtype", "float32", "--force") == 0
  assert json.loads((dst / "wts_config.json").read_text())["dtype"] == "float32"
  assert staging_leftovers(tmp_path) == []

  foreign = tmp_path / "not_ours"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("keep me")
  assert run_cli(src, foreign, "--force") == 2
  assert "not a wts-convert output" in capsys.readouterr().err
  assert (foreign / "notes.txt").read_text() == "keep me"


def test_destination_inside_a_new_directory_is_created_and_cleaned(tmp_path, capsys):
  config = drafter_config("vanilla")
  state = drafter_state_dict(config)
  state["markov_head.markov_w2.weight"][5, 3] = float("nan")   # refused while reading
  src = write_checkpoint(tmp_path / "src", config, state)
  assert run_cli(src, tmp_path / "new" / "deeper" / "dst") == 2
  assert "non-finite" in capsys.readouterr().err
  assert not (tmp_path / "new").exists()


def _subprocess_env() -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                    env.get("PYTHONPATH")]))
  env["JAX_PLATFORMS"] = "cpu"
  return env


def test_cli_entry_point_as_a_subprocess(tmp_path):
  config = drafter_config("gated", confidence=True)
  state = drafter_state_dict(config)
  src = write_checkpoint(tmp_path / "src", config, state)
  ok = subprocess.run([sys.executable, "-m", "wts_jax.convert.cli", str(src),
                       str(tmp_path / "dst")], capture_output=True, text=True,
                      env=_subprocess_env(), timeout=300)
  assert ok.returncode == 0, ok.stderr
  assert (tmp_path / "dst" / "wts_config.json").is_file()

  del state["markov_head.gate_proj.bias"]
  bad = write_checkpoint(tmp_path / "bad", config, state)
  refused = subprocess.run([sys.executable, "-m", "wts_jax.convert.cli", str(bad),
                            str(tmp_path / "bad_dst")], capture_output=True, text=True,
                           env=_subprocess_env(), timeout=300)
  assert refused.returncode == 2
  assert refused.stderr.startswith("wts-convert: error:")
  assert "'markov_head.gate_proj.bias'" in refused.stderr
  assert "Traceback" not in refused.stderr
  assert not (tmp_path / "bad_dst").exists()

  console_script = shutil.which("wts-convert", path=str(Path(sys.executable).parent))
  if console_script is not None:   # installed with `pip install -e .`
    inspected = subprocess.run([console_script, "inspect", str(src)], capture_output=True,
                               text=True, env=_subprocess_env(), timeout=300)
    assert inspected.returncode == 0, inspected.stderr
    assert "gated, markov_rank 16" in inspected.stdout


# --- refusals: each names the key/file/value and leaves nothing behind --------------------


class NotATensor:
  """A pickled object that torch.load(weights_only=True) must refuse to build."""


def _checkpoint(tmp_path, *, head_type="gated", layout="safetensors", edit_state=None,
                edit_config=None, rank=RANK):
  config = drafter_config(head_type, rank=rank, confidence=True)
  state = drafter_state_dict(config)
  if edit_state is not None:
    edit_state(state)
  if edit_config is not None:
    edit_config(config)
  return write_checkpoint(tmp_path / "src", config, state, layout=layout)


def _missing_key(tmp_path):
  return _checkpoint(tmp_path, edit_state=lambda s: s.pop("markov_head.gate_proj.bias"))


def _unexpected_key(tmp_path):
  return _checkpoint(tmp_path, edit_state=lambda s: s.update(
      {"markov_head.joint_proj.weight": torch.zeros(48, 64, dtype=torch.bfloat16)}))


def _shape_mismatch(tmp_path):
  return _checkpoint(tmp_path, edit_state=lambda s: s.update(
      {"markov_head.gate_proj.weight": torch.zeros(16, 40, dtype=torch.bfloat16)}))


def _dtype_mismatch(tmp_path):
  return _checkpoint(tmp_path, edit_state=lambda s: s.update(
      {"fc.weight": s["fc.weight"].float()}))


def _truncated(tmp_path):
  src = _checkpoint(tmp_path)
  path = src / "model.safetensors"
  path.write_bytes(path.read_bytes()[:-100])
  return src


def _corrupt_header(tmp_path):
  src = _checkpoint(tmp_path)
  path = src / "model.safetensors"
  data = path.read_bytes()
  path.write_bytes(data[:8] + b"\xff" * 16 + data[24:])
  return src


def _index_names_missing_shard(tmp_path):
  src = _checkpoint(tmp_path, layout="sharded")
  (src / "model-00002-of-00002.safetensors").unlink()
  return src


def _shard_disagrees_with_index(tmp_path):
  src = _checkpoint(tmp_path, layout="sharded")
  index_path = src / "model.safetensors.index.json"
  index = json.loads(index_path.read_text())
  index["weight_map"]["embed_tokens.weight"] = "model-00002-of-00002.safetensors"
  index_path.write_text(json.dumps(index))
  return src


def _speculators_config(tmp_path):
  return _checkpoint(tmp_path, edit_config=lambda c: c.update(
      {"speculators_model_type": "eagle3"}))


def _speculators_keys(tmp_path):
  return _checkpoint(tmp_path, edit_state=lambda s: s.update(
      {"d2t": torch.zeros(VOCAB, dtype=torch.int64)}))


def _reduced_vocabulary(tmp_path):
  return _checkpoint(tmp_path, edit_state=lambda s: s.update(
      {"markov_head.markov_w2.weight": torch.zeros(200, RANK, dtype=torch.bfloat16)}))


def _other_architecture(tmp_path):
  return _checkpoint(tmp_path, edit_config=lambda c: c.update(
      {"architectures": ["Qwen3ForCausalLM"]}))


def _zlab_dflash(tmp_path):
  return _checkpoint(tmp_path, edit_config=lambda c: c.update(
      {"architectures": ["DFlashDraftModel"], "dflash_config": {"mask_token_id": 299}}))


def _unknown_head_type(tmp_path):
  return _checkpoint(tmp_path, edit_config=lambda c: c.update({"markov_head_type": "lstm"}))


def _config_lacks_markov_rank(tmp_path):
  return _checkpoint(tmp_path, edit_config=lambda c: c.pop("markov_rank"))


def _no_config(tmp_path):
  src = _checkpoint(tmp_path)
  (src / "config.json").unlink()
  return src


def _bin_holding(tmp_path, name: str, value, **save_options):
  """A .bin checkpoint whose state dict also holds ``value`` under ``name``."""
  src = _checkpoint(tmp_path, layout="bin")
  state = torch.load(src / "pytorch_model.bin", weights_only=True)
  state[name] = value
  torch.save(state, src / "pytorch_model.bin", **save_options)
  return src


def _pickle_with_code(tmp_path):
  return _bin_holding(tmp_path, "optimizer_hook", NotATensor())


def _legacy_pickle_with_code(tmp_path):
  return _bin_holding(tmp_path, "optimizer_hook", NotATensor(),
                      _use_new_zipfile_serialization=False)


def _config_field(name, value):
  """A config whose field ``name`` holds ``value`` (a wrong type, or a setting the drafter's
  layers cannot run: load_dspark reads the same fields)."""
  def make(tmp_path):
    return _checkpoint(tmp_path, edit_config=lambda c: c.update({name: value}))
  make.__name__ = f"_{name}_{type(value).__name__}"
  return make


def _config_not_an_object(tmp_path):
  src = _checkpoint(tmp_path)
  (src / "config.json").write_text("5")
  return src


def _layer_count_bomb(tmp_path):
  return _checkpoint(tmp_path, edit_config=lambda c: c.update(num_hidden_layers=10_000_000))


def _zeroed_matrix(tmp_path):
  return _checkpoint(tmp_path, edit_state=lambda s: s["markov_head.markov_w2.weight"].zero_())


def _int_tensor(tmp_path):
  return _checkpoint(tmp_path, edit_state=lambda s: s.update(
      {"fc.weight": s["fc.weight"].to(torch.int64)}))


class RunsAShell:
  """A pickle that would run a shell command when unpickled without weights_only."""

  def __reduce__(self):
    return (os.system, ("echo unpickled",))


def _pickle_calling_a_blocked_module(tmp_path):
  return _bin_holding(tmp_path, "hook", RunsAShell())


def _torchscript_archive(tmp_path):
  src = _checkpoint(tmp_path, layout="bin")
  with warnings.catch_warnings():   # torch.jit is deprecated; the files it wrote are not
    warnings.simplefilter("ignore", DeprecationWarning)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), src / "pytorch_model.bin")
  return src


def _truncated_bin(tmp_path):
  src = _checkpoint(tmp_path, layout="bin")
  path = src / "pytorch_model.bin"
  path.write_bytes(path.read_bytes()[:-1000])
  return src


def _empty_bin(tmp_path):
  src = _checkpoint(tmp_path, layout="bin")
  (src / "pytorch_model.bin").write_bytes(b"")
  return src


def _not_a_torch_file(tmp_path):
  src = _checkpoint(tmp_path, layout="bin")
  (src / "pytorch_model.bin").write_text("<html>404 Not Found</html>\n" * 10)
  return src


def _non_finite_backbone(tmp_path):
  def poison(state):
    state["lm_head.weight"][3, 4] = float("inf")
  return _checkpoint(tmp_path, edit_state=poison)


REFUSALS = [
    (_missing_key, [], ["missing 1 tensor(s)", "'markov_head.gate_proj.bias'",
                        "markov_head_type='gated'"]),
    (_unexpected_key, [], ["unexpected tensor(s) 'markov_head.joint_proj.weight' in "
                           "model.safetensors", "markov_head_type='gated'"]),
    (_shape_mismatch, [], ["'markov_head.gate_proj.weight' in model.safetensors has shape "
                           "[16, 40], expected [16, 48]", "hidden_size+markov_rank=48"]),
    (_dtype_mismatch, [], ["'fc.weight' in model.safetensors has dtype float32",
                           "declares dtype bfloat16"]),
    (_truncated, [], ["model.safetensors: corrupt or truncated safetensors file"]),
    (_corrupt_header, [], ["model.safetensors: corrupt or truncated safetensors file"]),
    (_index_names_missing_shard, [], ["model.safetensors.index.json: names shard "
                                      "'model-00002-of-00002.safetensors', which does not "
                                      "exist"]),
    (_shard_disagrees_with_index, [], ["model-00001-of-00002.safetensors holds "
                                       "'embed_tokens.weight', which "
                                       "model.safetensors.index.json does not map to it"]),
    (_speculators_config, [], ["speculators_model_type='eagle3'", "speculators-format"]),
    (_speculators_keys, [], ["'d2t' in model.safetensors", "speculators format"]),
    (_reduced_vocabulary, [], ["'markov_head.markov_w2.weight' in model.safetensors has "
                               "200 rows", "reduced draft vocabulary"]),
    (_other_architecture, [], ["architectures=['Qwen3ForCausalLM'] is not supported"]),
    (_zlab_dflash, [], ["architectures=['DFlashDraftModel'] with dflash_config",
                        "z-lab DFlash", "no serial head"]),
    (_unknown_head_type, [], ["markov_head_type='lstm' must be one of"]),
    (_config_lacks_markov_rank, [], ["config.json: lacks 'markov_rank'"]),
    (_no_config, [], ["config.json: missing"]),
    (_pickle_with_code, [], ["pytorch_model.bin: refused to unpickle (it holds a pickled ",
                             "NotATensor object", "never runs code"]),
    (_legacy_pickle_with_code, [], ["pytorch_model.bin: refused to unpickle (it holds a "
                                    "pickled ", "NotATensor object"]),
    (_pickle_calling_a_blocked_module, [], ["pytorch_model.bin: refused to unpickle (it "
                                            "calls posix.system", "never runs code"]),
    (_torchscript_archive, [], ["pytorch_model.bin: refused to unpickle (a TorchScript "
                                "archive", "never runs code"]),
    (_truncated_bin, [], ["pytorch_model.bin: truncated or corrupt .bin file"]),
    (_empty_bin, [], ["pytorch_model.bin: empty file (0 bytes)"]),
    (_not_a_torch_file, [], ["pytorch_model.bin: not a PyTorch checkpoint"]),
    (_non_finite_backbone, ["--full"], ["'lm_head.weight' in model.safetensors holds 1 "
                                        "non-finite values"]),
    (_config_field("rope_scaling", "abc"), [],
     ["config.json: rope_scaling='abc' must be a JSON object or null"]),
    (_config_field("rope_scaling", {"rope_type": "yarn", "factor": 4.0}), [],
     ["rope_scaling.rope_type='yarn' is not supported"]),
    (_config_field("rope_theta", "abc"), [], ["rope_theta='abc' must be a finite number > 0"]),
    (_config_field("block_size", "7"), [], ["block_size='7' must be a positive integer"]),
    (_config_field("enable_confidence_head", "false"), [],
     ["enable_confidence_head='false' must be true or false"]),
    (_config_field("hidden_act", "gelu"), [], ["hidden_act='gelu' must be one of"]),
    (_config_field("num_target_layers", 6.0), [],
     ["num_target_layers=6.0 must be a positive integer"]),
    (_config_not_an_object, [], ["config.json: 5 must be a JSON object, not a number"]),
    (_layer_count_bomb, [], ["num_hidden_layers=10000000", "layers 0-1 (2 layers)"]),
    (_zeroed_matrix, [], ["'markov_head.markov_w2.weight' in model.safetensors is all zeros"]),
    (_int_tensor, ["--full"], ["'fc.weight' in model.safetensors has dtype int64"]),
]


@pytest.mark.parametrize("make_checkpoint,extra_args,messages", REFUSALS,
                         ids=[case[0].__name__.strip("_") for case in REFUSALS])
def test_refusal_names_the_culprit_and_writes_nothing(tmp_path, capsys, make_checkpoint,
                                                      extra_args, messages):
  src = make_checkpoint(tmp_path)
  src_files = sorted(p.name for p in src.iterdir())

  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert run_cli(src, tmp_path / "dst", *extra_args) == 2
  assert not [warning for warning in caught if "torch" in warning.filename], caught

  err = capsys.readouterr().err
  assert err.startswith("wts-convert: error: ") and err.count("\n") == 1, err
  # A security refusal must not pass on torch's advice to load the pickle anyway, in any
  # of its wordings ("weights_only=False", "`weights_only` set to `False`", "if you
  # trust the source"): the only weights_only named is wts-convert's own.
  assert "weights_only" not in err.replace("torch.load(weights_only=True)", ""), err
  assert "trust" not in err and "\x1b" not in err, err
  for message in messages:
    assert message in err, (message, err)
  assert not (tmp_path / "dst").exists()
  assert staging_leftovers(tmp_path) == []
  assert sorted(p.name for p in src.iterdir()) == src_files


def test_bin_without_torch_is_refused(tmp_path, capsys, monkeypatch):
  src = _checkpoint(tmp_path, layout="bin")
  monkeypatch.setitem(sys.modules, "torch", None)   # `import torch` now fails
  assert run_cli(src, tmp_path / "dst") == 2
  assert "needs torch" in capsys.readouterr().err
  assert not (tmp_path / "dst").exists()


def test_destination_equal_to_source_is_refused(tmp_path, capsys):
  src = _checkpoint(tmp_path)
  assert run_cli(src, src, "--force") == 2
  assert "would overwrite the checkpoint being converted" in capsys.readouterr().err
  assert (src / "model.safetensors").is_file()
