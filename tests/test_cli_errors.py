"""Every console script given bad arguments, as a new user gives them: one line,
``PROG: error: MESSAGE (see PROG --help)``, exit status 2; ``--help`` shows the defaults.
(No torch needed: these run on every JAX the package admits.)"""

from __future__ import annotations

import importlib

import pytest


def _cli(name: str):
  module = {"wts-convert": "wts_jax.convert.cli", "wts-generate": "wts_jax.specdecode.cli",
            "wts-demo": "wts_jax.demo", "wts-bench": "wts_jax.bench.cli",
            "wts-tabletune": "wts_jax.tabletune.cli",
            "wts-e2e-bench": "wts_jax.specdecode.bench_e2e"}[name]
  return importlib.import_module(module).main


GENERATE = ["--target", "t", "--drafter", "d", "--ids", "1"]   # checked after the options
BAD_COMMAND_LINES = [
    ("wts-e2e-bench", "wts-e2e-bench", ["--batches", "0"],
     "argument --batches: '0': every value must be >= 1"),
    ("wts-e2e-bench", "wts-e2e-bench", ["--method", "fast"],
     "argument --method: invalid choice: 'fast'"),
    ("wts-convert", "wts-convert", [], "the following arguments are required: SRC, DST"),
    ("wts-convert", "wts-convert", ["a", "b", "--dtype", "int4"],
     "argument --dtype: invalid choice: 'int4'"),
    ("wts-convert", "wts-convert inspect", ["inspect"],
     "the following arguments are required: SRC"),
    ("wts-generate", "wts-generate", ["--target", "t"],
     "the following arguments are required: --drafter"),
    ("wts-generate", "wts-generate", [*GENERATE, "--seed", "99999999999999999999999"],
     "argument --seed: 99999999999999999999999 must be an integer in [0, 4294967295]"),
    ("wts-generate", "wts-generate", [*GENERATE, "--seed", "-1"],
     "argument --seed: -1 must be an integer in [0, 4294967295]"),
    ("wts-generate", "wts-generate", [*GENERATE, "--temperature", "nan"],
     "argument --temperature: nan must be finite and >= 0"),
    ("wts-generate", "wts-generate", [*GENERATE, "--max-new-tokens", "0"],
     "argument --max-new-tokens: 0 must be an integer >= 1"),
    ("wts-generate", "wts-generate", [*GENERATE, "--draft-len", "-1"],
     "argument --draft-len: -1 must be an integer >= 0"),
    ("wts-generate", "wts-generate", ["--target", "t", "--drafter", "d", "--ids", "1,x"],
     "argument --ids: '1,x' is not a comma-separated list of token ids"),
    ("wts-demo", "wts-demo", ["--batch", "0"],
     "argument --batch: 0 must be an integer in [1, 65536]"),
    ("wts-bench", "wts-bench", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("wts-bench", "wts-bench", ["--repeats", "x"], "argument --repeats: invalid int value: 'x'"),
    ("wts-tabletune", "wts-tabletune", [],
     "the following arguments are required: command"),
    ("wts-tabletune", "wts-tabletune profile", ["profile", "--out", "x", "--noise", "a"],
     "argument --noise: invalid float value: 'a'"),
]


@pytest.mark.parametrize("cli,prog,argv,message", BAD_COMMAND_LINES,
                         ids=[f"{case[1]} {' '.join(case[2])}" for case in BAD_COMMAND_LINES])
def test_bad_argument_is_one_line_with_a_pointer_to_help(capsys, cli, prog, argv, message):
  with pytest.raises(SystemExit) as exited:
    _cli(cli)(argv)
  assert exited.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith(f"{prog}: error: {message}"), err
  assert err.endswith(f" (see {prog} --help)\n"), err


@pytest.mark.parametrize("cli,argv,shown", [
    ("wts-generate", ["--help"], ["--dtype {bfloat16,float32}", "(default: bfloat16)",
                                  "(default: 64)", "(default: auto)"]),
    ("wts-convert", ["--help"], ["wts-convert inspect SRC",
                                 "(default: keep the checkpoint's dtype)"]),
    ("wts-tabletune", ["profile", "--help"], ["(default: modelled)"]),
])
def test_help_shows_the_defaults(capsys, cli, argv, shown):
  with pytest.raises(SystemExit) as exited:
    _cli(cli)(argv)
  assert exited.value.code == 0
  out = " ".join(capsys.readouterr().out.split())   # argparse wraps lines at the width
  for text in shown:
    assert text in out, (text, out)
