"""wts-demo: bad arguments are one ``error:`` line and exit status 2; a run reports
progress on stderr as it goes and labels the confidence as logits."""

import subprocess
import sys

import jax
import pytest

from wts_jax import demo
from wts_jax.heads import HeadConfig

TINY = HeadConfig(300, 8, 16, "vanilla", confidence=True)


@pytest.fixture
def tiny_head(monkeypatch):
  """The demo's preset shrunk: the same code path in a fraction of a second."""
  monkeypatch.setattr(demo.HeadConfig, "qwen3_4b",
                      classmethod(lambda cls, head_type: TINY.replace(head_type=head_type)))


BAD_ARGUMENTS = [
    (["--batch", "0"], "argument --batch: 0 must be an integer in [1, 65536]"),
    (["--batch", "abc"], "argument --batch: 'abc' is not an integer"),
    (["--steps", "0"], "argument --steps: 0 must be an integer in [1, 65536]"),
    (["--temperature", "-1"], "argument --temperature: -1.0 must be finite and >= 0"),
    (["--temperature", "inf"], "argument --temperature: inf must be finite and >= 0"),
    (["--walks", "0"], "argument --walks: 0 must be an integer >= 1"),
    (["--head", "lstm"], "argument --head: invalid choice: 'lstm'"),
]


@pytest.mark.parametrize("argv,message", BAD_ARGUMENTS,
                         ids=[" ".join(case[0]) for case in BAD_ARGUMENTS])
def test_bad_argument_is_one_error_line(capsys, argv, message):
  with pytest.raises(SystemExit) as exited:
    demo.main(argv)
  assert exited.value.code == 2
  err = capsys.readouterr().err
  last = err.rstrip("\n").splitlines()[-1]
  assert last.startswith("wts-demo: error: ") and message in last, err
  assert "Traceback" not in err


def test_pallas_without_a_gpu_is_an_argument_error(capsys, tiny_head):
  if jax.default_backend() == "gpu":
    pytest.skip("a GPU is present")
  with pytest.raises(SystemExit) as exited:
    demo.main(["--impl", "pallas"])
  assert exited.value.code == 2
  last = capsys.readouterr().err.rstrip("\n").splitlines()[-1]
  assert last.startswith("wts-demo: error: argument --impl: impl='pallas' cannot run this "
                         "walk: no GPU"), last


def test_every_option_has_help():
  for action in demo.build_parser()._actions:
    assert action.help, action.option_strings


def test_run_reports_progress_and_labels_confidence_logits(capsys, tiny_head):
  assert demo.main(["--batch", "5", "--steps", "3", "--walks", "2", "--temperature",
                    "0.7"]) == 0
  captured = capsys.readouterr()
  for stage in ("device: ", "building a random vanilla head", "compiling the xla walk",
                "timing 2 walks"):
    assert stage in captured.err, captured.err
  assert captured.out.count("confidence logits ") == 4
  assert "(1 more row not shown)" in captured.out
  assert "time per walk:" in captured.out


def test_help_as_a_subprocess():
  shown = subprocess.run([sys.executable, "-m", "wts_jax.demo", "--help"],
                         capture_output=True, text=True, timeout=120)
  assert shown.returncode == 0 and "--temperature" in shown.stdout
  assert "greedy" in shown.stdout and "jitted walks timed" in shown.stdout
