"""Adversarial inputs at the entry points a new user reaches first: a target or drafter
checkpoint whose config lies (wrong types, a resource bomb), whose files are sparse,
zeroed, unreadable or of the wrong dtype, and wts-generate on such checkpoints (every
CLI's argument errors: tests/test_cli_errors.py).

Each refusal is one line naming the field, file or value (``ValueError`` /
``ConversionError`` from the API, ``error:`` and exit 2 from a CLI), raised before
anything the lie would make us allocate.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from convert_fixtures import (HIDDEN, VOCAB, drafter_config, drafter_state_dict,  # noqa: E402
                              target_config, target_state_dict, write_checkpoint,
                              write_target)
from wts_jax.convert.errors import ConversionError  # noqa: E402
from wts_jax.convert.formats import open_checkpoint  # noqa: E402
from wts_jax.specdecode.cli import main as generate_main  # noqa: E402
from wts_jax.specdecode.qwen3 import Qwen3Config, load_qwen3  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


def one_line(error: BaseException) -> str:
  message = str(error)
  assert "\n" not in message and len(message) < 400, message
  return message


# --- the target's config.json: every field typed and named ------------------------------
TARGET_CONFIG_LIES = [
    ("tie_string", dict(tie_word_embeddings="false"),
     "tie_word_embeddings='false' must be true or false"),
    ("rope_scaling_string", dict(rope_scaling="abc"),
     "rope_scaling='abc' must be a JSON object or null"),
    ("rope_theta_string", dict(rope_theta="abc", rope_parameters=None),
     "rope_theta='abc' must be a finite number > 0"),
    ("rope_theta_nested_string", dict(rope_parameters={"rope_type": "default",
                                                       "rope_theta": "1e4"}),
     "rope_parameters.rope_theta='1e4' must be a finite number > 0"),
    ("rope_yarn", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}),
     "rope_parameters.rope_type='yarn' is not supported"),
    ("eps_string", dict(rms_norm_eps="x"), "rms_norm_eps='x' must be a finite number > 0"),
    ("eps_zero", dict(rms_norm_eps=0), "rms_norm_eps=0 must be a finite number > 0"),
    ("max_positions_float", dict(max_position_embeddings=1.5),
     "max_position_embeddings=1.5 must be a positive integer"),
    ("heads_string", dict(num_attention_heads="4"),
     "num_attention_heads='4' must be a positive integer"),
    ("layers_bool", dict(num_hidden_layers=True),
     "num_hidden_layers=True must be a positive integer"),
    ("attention_bias_string", dict(attention_bias="false"),
     "attention_bias='false' must be true or false"),
    ("gelu", dict(hidden_act="gelu"), "hidden_act='gelu' must be one of ('silu',)"),
    ("sliding_window", dict(use_sliding_window=True, sliding_window=64),
     "use_sliding_window=True is not supported"),
    ("heads_not_multiple", dict(num_key_value_heads=3),
     "num_attention_heads=4 must be a multiple of num_key_value_heads=3"),
]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
  return write_target(tmp_path_factory.mktemp("target") / "target")


def edited_target(tmp_path: Path, target: Path, config) -> Path:
  directory = tmp_path / "edited"
  shutil.copytree(target, directory)
  (directory / "config.json").write_text(json.dumps(config))
  return directory


@pytest.mark.parametrize("changes,message", [case[1:] for case in TARGET_CONFIG_LIES],
                         ids=[case[0] for case in TARGET_CONFIG_LIES])
def test_target_config_fields_are_typed_and_named(tmp_path, target, changes, message):
  directory = edited_target(tmp_path, target, target_config(**changes))
  with pytest.raises(ValueError) as raised:
    load_qwen3(directory)
  assert message in one_line(raised.value)
  assert str(directory / "config.json") in str(raised.value)


def test_target_config_that_is_not_an_object(tmp_path, target):
  directory = edited_target(tmp_path, target, 5)
  with pytest.raises(ValueError, match="config.json: 5 must be a JSON object, not a number"):
    load_qwen3(directory)


def test_null_fields_take_their_defaults(tmp_path, target):
  config = target_config(rope_scaling=None, sliding_window=None, attention_bias=None,
                         max_position_embeddings=None)
  model = load_qwen3(edited_target(tmp_path, target, config))
  assert model.config.max_position_embeddings == Qwen3Config.max_position_embeddings
  assert model.config.rope_theta == 10_000.0   # from rope_parameters


@pytest.mark.parametrize("field,value,message", [
    ("rope_theta", "abc", "rope_theta='abc' must be a real number > 0"),
    ("rms_norm_eps", float("nan"), "rms_norm_eps=nan must be a real number > 0"),
    ("tie_word_embeddings", "false", "tie_word_embeddings='false' must be a bool"),
])
def test_qwen3_config_fields_are_typed(field, value, message):
  with pytest.raises(ValueError, match=message):
    Qwen3Config.tiny(**{field: value})


# --- resource bombs: refused before anything is allocated ---------------------------------
def test_layer_count_bomb_is_refused_at_once(tmp_path, target):
  directory = edited_target(tmp_path, target, target_config(num_hidden_layers=10_000_000))
  started = time.monotonic()
  with pytest.raises(ValueError) as raised:
    load_qwen3(directory)
  assert time.monotonic() - started < 5
  message = one_line(raised.value)
  assert "num_hidden_layers=10000000" in message and "layers 0-5" in message, message


def write_sparse_safetensors(path: Path, tensors: dict[str, np.ndarray],
                             claimed: dict[str, tuple[str, list[int], int]]) -> None:
  """A safetensors file holding ``tensors`` and then ``claimed`` ones (name → (dtype,
  shape, itemsize)) whose bytes are a hole: the header promises them, the disk holds
  nothing (``truncate`` extends the file without writing)."""
  header, offset, data = {}, 0, []
  for name, array in tensors.items():
    header[name] = {"dtype": {np.float32: "F32"}[array.dtype.type], "shape": list(array.shape),
                    "data_offsets": [offset, offset + array.nbytes]}
    offset += array.nbytes
    data.append(array.tobytes())
  for name, (dtype, shape, itemsize) in claimed.items():
    size = int(np.prod(shape)) * itemsize
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
    offset += size
  text = json.dumps(header).encode()
  text += b" " * (-len(text) % 8)
  with path.open("wb") as file:
    file.write(struct.pack("<Q", len(text)) + text + b"".join(data))
  os.truncate(path, 8 + len(text) + offset)


SPARSE_VOCAB = 1 << 29     # a [2^29, 32] float32 embedding: 64 GiB, more than the machine has


def sparse_target(directory: Path) -> Path:
  directory.mkdir()
  config = target_config(vocab_size=SPARSE_VOCAB, tie_word_embeddings=True)
  (directory / "config.json").write_text(json.dumps(config))
  state = {key: value.numpy() for key, value in target_state_dict().items()
           if key not in ("model.embed_tokens.weight", "lm_head.weight")}
  write_sparse_safetensors(directory / "model.safetensors", state,
                           {"model.embed_tokens.weight": ("F32", [SPARSE_VOCAB, HIDDEN], 4)})
  return directory


def test_sparse_file_claiming_more_than_it_holds_is_refused_before_reading(tmp_path):
  directory = sparse_target(tmp_path / "sparse")
  assert (directory / "model.safetensors").stat().st_size > 60 << 30
  with pytest.raises(ConversionError) as raised:
    open_checkpoint(directory)
  message = one_line(raised.value)
  assert "model.safetensors" in message and "68.72 GB" in message, message
  assert "sparse" in message, message
  with pytest.raises(ValueError, match="sparse"):
    load_qwen3(directory)


def test_sparse_drafter_is_refused_by_wts_convert(tmp_path, capsys):
  from wts_jax.convert.cli import main
  config = drafter_config("vanilla")
  state = {key: value.float().numpy() for key, value in drafter_state_dict(config).items()}
  config["torch_dtype"] = "float32"
  src = tmp_path / "src"
  src.mkdir()
  (src / "config.json").write_text(json.dumps(config))
  lm_head = state.pop("lm_head.weight")
  write_sparse_safetensors(src / "model.safetensors", state,
                           {"lm_head.weight": ("F32", list(lm_head.shape), 4)})
  # Small files: the claim is no more than a few pages, below what is ever refused as
  # sparse, but its rows are all zeros.
  assert main([str(src), str(tmp_path / "dst"), "--full", "--no-progress"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "'lm_head.weight'" in err and "all zeros" in err, err
  assert not (tmp_path / "dst").exists()


def test_zeroed_weights_are_refused(tmp_path, target):
  directory = tmp_path / "zeroed"
  shutil.copytree(target, directory)
  state = target_state_dict()
  state["model.layers.3.mlp.down_proj.weight"].zero_()
  from safetensors.torch import save_file
  save_file(state, str(directory / "model.safetensors"))
  with pytest.raises(ValueError) as raised:
    load_qwen3(directory)
  message = one_line(raised.value)
  assert "'layers.3.mlp.down_proj.weight'" in message and "all zeros" in message, message


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64, torch.int8,
                                   torch.float8_e4m3fn])
def test_target_tensor_of_another_dtype_is_refused_by_name(tmp_path, target, dtype):
  directory = tmp_path / "dtype"
  shutil.copytree(target, directory)
  state = target_state_dict()
  state["model.layers.1.self_attn.k_proj.weight"] = state[
      "model.layers.1.self_attn.k_proj.weight"].to(dtype)
  from safetensors.torch import save_file
  save_file(state, str(directory / "model.safetensors"))
  with pytest.raises(ValueError) as raised:
    load_qwen3(directory)
  message = one_line(raised.value)
  assert "'layers.1.self_attn.k_proj.weight'" in message, message
  assert f"dtype {str(dtype).removeprefix('torch.')}" in message, message


# --- unreadable files and directories: named as such --------------------------------------
def without_read_override(command: list[str]) -> list[str]:
  """``command`` run so that file permissions apply: as it is for a normal user; for root,
  without the capabilities that let root read anything (util-linux ``setpriv``)."""
  if os.geteuid() != 0:
    return command
  setpriv = shutil.which("setpriv")
  if setpriv is None:
    pytest.skip("running as root without setpriv: permissions cannot be exercised")
  return [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]


def run_python(code: str, *args) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                      os.environ.get("PYTHONPATH")])))
  result = subprocess.run(without_read_override([sys.executable, "-c", code, *map(str, args)]),
                          capture_output=True, text=True, env=env, timeout=300)
  if "setpriv" in result.stderr and result.returncode != 0 and "Traceback" not in result.stderr:
    pytest.skip(f"setpriv cannot drop capabilities here: {result.stderr.strip()}")
  return result


LOAD_AND_CONVERT = """
import sys
from wts_jax.specdecode.qwen3 import load_qwen3
from wts_jax.convert.cli import main
try:
  load_qwen3(sys.argv[1])
except ValueError as err:
  print(f"load_qwen3: {err}")
sys.exit(main([sys.argv[1], sys.argv[2], "--no-progress"]))
"""


@pytest.mark.parametrize("make_unreadable,message", [
    (lambda d: (d / "model.safetensors").chmod(0), "model.safetensors: cannot read "
                                                   "(Permission denied)"),
    (lambda d: d.chmod(0o311), "cannot list the directory (Permission denied)"),
    (lambda d: d.chmod(0o600), "model.safetensors: cannot read the weights (Permission "
                               "denied)"),
], ids=["file", "directory_unlistable", "directory_unsearchable"])
def test_unreadable_paths_are_named(tmp_path, target, make_unreadable, message):
  parent = tmp_path / "parent"
  parent.mkdir()
  directory = parent / "target"
  shutil.copytree(target, directory)
  make_unreadable(directory)
  try:
    result = run_python(LOAD_AND_CONVERT, directory, tmp_path / "dst")
  finally:
    directory.chmod(0o755)
    (directory / "model.safetensors").chmod(0o644)
  lines = result.stdout.splitlines() + result.stderr.splitlines()
  assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
  assert len(lines) == 2 and all(message in line for line in lines), lines
  assert lines[1].startswith("wts-convert: error: "), lines


# --- wts-generate on real checkpoints (its argument errors: tests/test_cli_errors.py) -----
@pytest.fixture(scope="module")
def target_and_drafter(tmp_path_factory):
  """A tiny Qwen3 target and its tiny DeepSpec drafter, converted with --full."""
  from wts_jax.convert.converter import convert
  root = tmp_path_factory.mktemp("pair")
  target = write_target(root / "target")
  config = drafter_config("vanilla")
  config["torch_dtype"] = "float32"
  src = write_checkpoint(root / "src", config, drafter_state_dict(config,
                                                                  dtype=torch.float32))
  convert(src, root / "drafter", full=True)
  return target, root / "drafter"


def test_generate_beyond_the_targets_positions_is_an_argument_error(capsys,
                                                                  target_and_drafter):
  target, drafter = target_and_drafter
  with pytest.raises(SystemExit) as exited:
    generate_main(["--target", str(target), "--drafter", str(drafter), "--ids", "1,2,3",
                   "--max-new-tokens", "1000000000"])
  assert exited.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "argument --max-new-tokens: 1000000000" in err, err
  assert "max_position_embeddings=256" in err and "(3 tokens)" in err, err


def test_generate_says_which_walk_ran(capsys, target_and_drafter):
  target, drafter = target_and_drafter
  code = generate_main(["--target", str(target), "--drafter", str(drafter), "--ids",
                        "1,2,3", "--max-new-tokens", "4", "--dtype", "float32", "--no-eos"])
  err = capsys.readouterr().err
  assert code == 0, err
  assert "walk: xla (--walk auto)" in err, err


def test_generate_names_a_mistyped_eos_token_id(tmp_path, capsys, target_and_drafter):
  target, drafter = target_and_drafter
  edited = edited_target(tmp_path, target, target_config(eos_token_id="19"))
  code = generate_main(["--target", str(edited), "--drafter", str(drafter), "--ids",
                        "1,2,3"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert "config.json: eos_token_id='19' must be an integer >= 0" in err, err
