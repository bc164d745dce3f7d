"""``wts-convert``: DeepSpec Qwen3 DSpark/DFlash drafter checkpoints to wts_jax.

  wts-convert SRC DST [--full] [--dtype bfloat16|float16|float32] [--force] [--progress]
  wts-convert inspect SRC

A refused checkpoint prints one ``error:`` line naming the key, file or value, exits
with status 2 and leaves no DST behind. Ctrl-C, SIGTERM, a closed terminal (SIGHUP) or
any other signal that would end the process removes what was staged and exits with
128 + the signal's number.
"""

from __future__ import annotations

import signal
import sys

from wts_jax.command_line import ArgumentParser
from wts_jax.convert.drafter_config import FLOAT_DTYPES
from wts_jax.convert.errors import ConversionError
from wts_jax.convert.interrupts import signal_name

EXIT_REFUSED = 2
INSPECT_COMMAND = "inspect"


def _convert_parser() -> ArgumentParser:
  parser = ArgumentParser(
      prog="wts-convert",
      usage="%(prog)s [-h] SRC DST [--full] [--dtype DTYPE] [--force] [--[no-]progress]\n"
            "       %(prog)s inspect SRC",
      description=(
          "Convert a DeepSpec Qwen3 DSpark/DFlash drafter checkpoint (PyTorch) into an\n"
          "orbax directory that wts_jax.load reads.\n\n"
          "  wts-convert SRC DST [--full] ...  convert\n"
          "  wts-convert inspect SRC           report what SRC holds, what would be\n"
          "                                    converted and why it would be refused\n\n"
          "A refusal is one `error:` line (exit 2) and leaves nothing at DST; a signal\n"
          "removes what was staged (exit 128 + the signal's number)."))
  parser.add_argument("src", metavar="SRC",
                      help="checkpoint directory (config.json + model.safetensors, a "
                           "sharded index, or pytorch_model*.bin) or one weights file")
  parser.add_argument("dst", metavar="DST", help="output directory (must not exist)")
  parser.add_argument("--full", action="store_true",
                      help="also convert the drafter backbone (embed_tokens, fc, "
                           "hidden_norm, layers.*, norm, lm_head)")
  parser.add_argument("--dtype", choices=("keep",) + FLOAT_DTYPES, default="keep",
                      help="cast the weights (default: keep the checkpoint's dtype)")
  parser.add_argument("--force", action="store_true",
                      help="replace DST if it is an earlier wts-convert output")
  progress = parser.add_mutually_exclusive_group()
  progress.add_argument("--progress", dest="progress", action="store_true", default=None,
                        help="draw a progress bar on stderr (default: when it is a terminal)")
  progress.add_argument("--no-progress", dest="progress", action="store_false",
                        help="never draw the progress bar")
  return parser


def _inspect_parser() -> ArgumentParser:
  parser = ArgumentParser(
      prog="wts-convert inspect",
      description="Report a checkpoint's format, head type, rank, shapes and dtype, what "
                  "would be converted, what is ignored, and why it would be refused.")
  parser.add_argument("src", metavar="SRC", help="checkpoint directory or weights file")
  return parser


def main(argv: list[str] | None = None) -> int:
  """Run the CLI; returns the exit status (0 converted/convertible, 2 refused)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  # A checkpoint directory literally named "inspect" is reachable as ./inspect.
  if argv and argv[0] == INSPECT_COMMAND:
    args = _inspect_parser().parse_args(argv[1:])
    from wts_jax.convert.report import inspect_checkpoint
    report, refusal = inspect_checkpoint(args.src)
    print(report)   # the report, the refusal included, on stdout; the refusal on stderr too
    if refusal is None:
      return 0
    print(f"wts-convert inspect: error: {refusal}", file=sys.stderr)
    return EXIT_REFUSED

  args = _convert_parser().parse_args(argv)
  from wts_jax.convert.converter import convert
  show_progress = sys.stderr.isatty() if args.progress is None else args.progress
  try:
    dst = convert(args.src, args.dst, full=args.full, dtype=args.dtype, force=args.force,
                  progress=show_progress)
  except ConversionError as err:
    print(f"wts-convert: error: {err}", file=sys.stderr)
    return EXIT_REFUSED
  except KeyboardInterrupt as interrupt:
    signum = getattr(interrupt, "signum", signal.SIGINT)
    wrote = getattr(interrupt, "wrote", None)
    outcome = "nothing was written" if wrote is None else f"after writing {wrote}"
    try:
      print(f"wts-convert: interrupted ({signal_name(signum)}); {outcome}", file=sys.stderr)
    except OSError:   # SIGHUP: the terminal that would show it is gone
      pass
    return 128 + signum   # the shell's status for a process ended by that signal
  print(f"wrote {dst}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
