"""wts-generate end to end on tiny checkpoints: a transformers-written Qwen3 target, a
DeepSpec drafter converted with wts-convert --full, and a tokenizer.json."""


import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers

from convert_fixtures import (HEAD_DIM, HEADS, HIDDEN, INTERMEDIATE, KV_HEADS,
                              TARGET_LAYERS, VOCAB, drafter_config, drafter_state_dict,
                              write_checkpoint)
from wts_jax.convert.converter import convert
from wts_jax.specdecode import cli


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  root = tmp_path_factory.mktemp("cli")
  torch.manual_seed(0)
  config = transformers.Qwen3Config(
      vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
      num_hidden_layers=TARGET_LAYERS, num_attention_heads=HEADS,
      num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, tie_word_embeddings=False,
      eos_token_id=VOCAB - 2)
  transformers.Qwen3ForCausalLM(config).save_pretrained(root / "target")
  draft = drafter_config("vanilla")
  draft["torch_dtype"] = "float32"
  src = write_checkpoint(root / "src", draft, drafter_state_dict(draft, dtype=torch.float32))
  convert(src, root / "drafter", full=True)
  return root


def test_generates_text_with_a_tokenizer(checkpoints, capsys):
  target, drafter = checkpoints / "target", checkpoints / "drafter"
  tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token="t0"))
  tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tokenizer.save(str(target / "tokenizer.json"))
  code = cli.main(["--target", str(target), "--drafter", str(drafter), "--ids", "1,2,3",
                   "--text", "t5 t6", "--max-new-tokens", "5", "--dtype", "float32",
                   "--walk", "xla", "--no-eos"])
  out = capsys.readouterr()
  assert code == 0, out.err
  lines = out.out.strip().splitlines()
  assert len(lines) == 2 and all(len(line.split()) == 5 for line in lines)
  assert all(word.startswith("t") for word in lines[0].split())
  assert "iterations" in out.err


def test_errors_exit_2(checkpoints, tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--target", str(tmp_path / "nope"), "--drafter", str(tmp_path), "--ids", "1"])
  assert exit_info.value.code == 2 and "is not a directory" in capsys.readouterr().err
  code = cli.main(["--target", str(checkpoints / "target"), "--drafter",
                   str(checkpoints / "target"), "--ids", "1"])
  assert code == 2 and capsys.readouterr().err.startswith("error: ")
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--target", str(tmp_path), "--drafter", str(tmp_path), "--ids", "1,x"])
  err = capsys.readouterr().err
  assert exit_info.value.code == 2 and "'1,x'" in err, err


def test_a_target_whose_logits_overflow_is_one_error_line(checkpoints, tmp_path, capsys):
  """Finite on disk, infinite at run time (3e38 in one layer's MLP): exit 2, no tokens."""
  import shutil
  from safetensors.torch import load_file, save_file
  target = tmp_path / "target"
  shutil.copytree(checkpoints / "target", target)
  state = load_file(target / "model.safetensors")
  for name in ("up_proj", "down_proj"):
    state[f"model.layers.0.mlp.{name}.weight"][:] = 3e38
  save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
  code = cli.main(["--target", str(target), "--drafter", str(checkpoints / "drafter"),
                   "--ids", "1,2,3", "--max-new-tokens", "4", "--dtype", "float32",
                   "--walk", "xla", "--no-eos"])
  out = capsys.readouterr()
  assert code == 2 and out.out == "", out
  assert out.err.startswith("error: generate status=") and "target's logits" in out.err
  assert len(out.err.strip().splitlines()) == 1


def test_tabletune_chooses_the_draft_length_from_a_cost_table(checkpoints, tmp_path, capsys):
  """--cost-table: TableTune drives the loop (greedy, so the tokens are those of the
  target alone, --draft-len 0); a table that is not one is one error line."""
  from wts_jax.tabletune.cost_model import modelled_cost_fn
  from wts_jax.tabletune.profile import profile_costs
  costs = profile_costs(modelled_cost_fn("qwen3-8b"), device_kind="modelled",
                        target="qwen3-8b", drafter="dspark", max_draft_len=7,
                        batches=(1, 4, 16), source="modelled")
  costs.save(tmp_path / "costs.json")
  common = ["--target", str(checkpoints / "target"), "--drafter", str(checkpoints / "drafter"),
            "--ids", "1,2,3", "--ids", "4,5", "--max-new-tokens", "6", "--dtype", "float32",
            "--walk", "xla", "--no-eos"]
  assert cli.main(common + ["--draft-len", "0"]) == 0
  alone = capsys.readouterr()
  assert cli.main(common + ["--cost-table", str(tmp_path / "costs.json"),
                            "--acceptance-prior", "code"]) == 0
  tuned = capsys.readouterr()
  assert tuned.out == alone.out
  assert "TableTune: drafting K = " in tuned.err, tuned.err
  (tmp_path / "bad.json").write_text("[1, 2]")
  assert cli.main(common + ["--cost-table", str(tmp_path / "bad.json")]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and err.startswith("error: --cost-table="), err
  with pytest.raises(SystemExit) as exit_info:
    cli.main(common + ["--draft-len", "2", "--cost-table", str(tmp_path / "costs.json")])
  assert exit_info.value.code == 2
  assert "not allowed with argument" in capsys.readouterr().err
