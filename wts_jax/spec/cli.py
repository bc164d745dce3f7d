"""``wts-generate``: speculative decoding from the command line.

  wts-generate --target QWEN3_DIR --drafter CONVERTED_DIR --ids 1,2,3 [--ids 4,5 ...]
               [--text "..."] [--max-new-tokens N] [--temperature T --seed S]
               [--draft-len K] [--walk auto|pallas|xla|none] [--eos-id ID] [--dtype ...]

QWEN3_DIR is a Hugging Face Qwen3 checkpoint directory; CONVERTED_DIR a
``wts-convert --full`` output of its DSpark drafter. Prompts are token ids; when
QWEN3_DIR holds a ``tokenizer.json``, ``--text`` prompts are accepted too and the output
is printed as text (through the ``tokenizers`` package), else as token ids, one line per
prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"


def _ids(text: str) -> list[int]:
  try:
    ids = [int(part) for part in text.replace(" ", ",").split(",") if part]
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids")
  if not ids:
    raise argparse.ArgumentTypeError(f"{text!r} holds no token ids")
  return ids


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="wts-generate",
      description="Speculative decoding with a Qwen3 target, its DSpark drafter and the "
                  "serial-head walk, in one jitted loop.")
  parser.add_argument("--target", type=Path, required=True,
                      help="Hugging Face Qwen3 checkpoint directory")
  parser.add_argument("--drafter", type=Path, required=True,
                      help="wts-convert --full output of the DSpark drafter")
  parser.add_argument("--ids", type=_ids, action="append", default=[],
                      help="a prompt as comma-separated token ids (repeat for a batch)")
  parser.add_argument("--text", action="append", default=[],
                      help="a prompt as text (needs tokenizer.json in --target)")
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--temperature", type=float, default=0.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--draft-len", type=int, default=None,
                      help="tokens drafted per iteration (default: the block size)")
  parser.add_argument("--walk", choices=("auto", "pallas", "xla", "none"), default="auto")
  parser.add_argument("--eos-id", type=int, action="append", default=None,
                      help="token id that ends a sequence (default: config.json's "
                           "eos_token_id); repeat for several")
  parser.add_argument("--no-eos", action="store_true", help="ignore EOS")
  parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
  return parser


def _config_eos(target_dir: Path) -> list[int] | None:
  try:
    config = json.loads((target_dir / "config.json").read_text())
  except (OSError, json.JSONDecodeError):
    return None   # load_qwen3 reports an unreadable config with its path
  eos = config.get("eos_token_id")
  if eos is None:
    return None
  return [eos] if isinstance(eos, int) else list(eos)


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if not args.ids and not args.text:
    parser.error("give a prompt: --ids 1,2,3 or --text '...'")
  if args.max_new_tokens < 1:
    parser.error(f"--max-new-tokens={args.max_new_tokens} must be >= 1")
  for name in ("target", "drafter"):
    if not getattr(args, name).is_dir():
      parser.error(f"--{name}={str(getattr(args, name))!r} is not a directory")
  tokenizer_path = args.target / TOKENIZER_FILE
  tokenizer = None
  if tokenizer_path.is_file():
    from tokenizers import Tokenizer   # only for text; token ids need no tokenizer
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
  elif args.text:
    parser.error(f"--text needs {tokenizer_path}, which does not exist; pass --ids")
  prompts = list(args.ids) + [tokenizer.encode(text).ids for text in args.text]
  eos = None if args.no_eos else (args.eos_id or _config_eos(args.target))

  import jax
  import jax.numpy as jnp

  from wts_jax.convert.errors import ConversionError
  from wts_jax.spec.dspark import load_dspark
  from wts_jax.spec.loop import GenerateError, generate
  from wts_jax.spec.qwen3 import load_qwen3
  dtype = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}[args.dtype]
  try:
    target = load_qwen3(args.target, dtype=dtype)
    drafter = load_dspark(args.drafter, dtype=dtype)
    out = generate(target, drafter, prompts, args.max_new_tokens,
                   temperature=args.temperature, key=jax.random.key(args.seed),
                   draft_len=args.draft_len, walk_impl=args.walk, eos_id=eos)
  except (ValueError, TypeError, ConversionError, OSError, GenerateError) as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  for row in out.rows():
    print(tokenizer.decode(row) if tokenizer is not None else " ".join(map(str, row)))
  lengths = out.acceptance_length()
  print(f"{int(out.iterations)} iterations; tokens per verify pass: "
        + ", ".join(f"{value:.2f}" for value in lengths), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
