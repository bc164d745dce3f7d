"""``wts-generate``: speculative decoding from the command line.

  wts-generate --target QWEN3_DIR --drafter CONVERTED_DIR --ids 1,2,3 [--ids 4,5 ...]
               [--text "..."] [--max-new-tokens N] [--temperature T --seed S]
               [--draft-len K | --cost-table COSTS.json [--acceptance-prior chat]]
               [--walk auto|pallas|xla|none] [--eos-id ID] [--dtype ...]

QWEN3_DIR is a Hugging Face Qwen3 checkpoint directory; CONVERTED_DIR a
``wts-convert --full`` output of its DSpark drafter. Prompts are token ids; when
QWEN3_DIR holds a ``tokenizer.json``, ``--text`` prompts are accepted too and the output
is printed as text (through the ``tokenizers`` package), else as token ids, one line per
prompt. ``--draft-len`` fixes the tokens drafted per iteration (0: the target alone);
``--cost-table`` lets TableTune choose them every iteration (0 included) from a
``wts-tabletune profile`` table, its costs corrected from the loop's measured iterations
where the device has a clock. A bad argument or checkpoint is one ``error:`` line and
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wts_jax.command_line import ArgumentParser, int_in, number_in, print_error
from wts_jax.tabletune.traces import REGIMES

TOKENIZER_FILE = "tokenizer.json"
# jax.random.key keeps 32 bits of a seed without x64: larger seeds would alias smaller ones.
MAX_SEED = (1 << 32) - 1


def _ids(text: str) -> list[int]:
  try:
    ids = [int(part) for part in text.replace(" ", ",").split(",") if part]
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token ids")
  if not ids:
    raise argparse.ArgumentTypeError(f"{text!r} holds no token ids")
  return ids


def build_parser() -> ArgumentParser:
  parser = ArgumentParser(
      prog="wts-generate",
      description="Speculative decoding with a Qwen3 target, its DSpark drafter and the\n"
                  "serial-head walk, in one jitted loop.")
  parser.add_argument("--target", type=Path, required=True,
                      help="Hugging Face Qwen3 checkpoint directory")
  parser.add_argument("--drafter", type=Path, required=True,
                      help="wts-convert --full output of the DSpark drafter")
  parser.add_argument("--ids", type=_ids, action="append", default=[],
                      help="a prompt as comma-separated token ids (repeat for a batch)")
  parser.add_argument("--text", action="append", default=[],
                      help="a prompt as text (needs tokenizer.json in --target)")
  parser.add_argument("--max-new-tokens", type=int_in(1), default=64,
                      help="tokens generated per prompt at most (prompt + these must fit "
                           "the target's max_position_embeddings)")
  parser.add_argument("--temperature", type=number_in(0), default=0.0,
                      help="0 for greedy decoding; > 0 samples (lossless speculative "
                           "sampling)")
  parser.add_argument("--seed", type=int_in(0, MAX_SEED), default=0,
                      help="seed of the sampling key (with --temperature > 0)")
  drafting = parser.add_mutually_exclusive_group()
  drafting.add_argument("--draft-len", type=int_in(0), default=None,
                        help="tokens drafted per iteration, 0 for none (default: the "
                             "drafter's block size)")
  drafting.add_argument("--cost-table", type=Path, default=None,
                        help="a wts-tabletune cost table (JSON): TableTune chooses the "
                             "draft length every iteration among the table's")
  parser.add_argument("--acceptance-prior", default="chat",
                      choices=REGIMES,
                      help="with --cost-table: the acceptance TableTune starts from "
                           "before it has seen any")
  parser.add_argument("--walk", choices=("auto", "pallas", "xla", "none"), default="auto",
                      help="the serial head's walk: auto (the persistent kernel where it "
                           "runs, else XLA), pallas (the kernel, or an error), xla, or "
                           "none (the drafter's own tokens); the one used is printed")
  parser.add_argument("--eos-id", type=int_in(0), action="append", default=None,
                      help="token id that ends a sequence (default: config.json's "
                           "eos_token_id); repeat for several")
  parser.add_argument("--no-eos", action="store_true", help="ignore EOS")
  parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                      help="weights and compute dtype")
  return parser


def _target_config(parser: ArgumentParser, target_dir: Path) -> dict:
  """The target's config.json (its reader, Qwen3Config.from_hf, names what is wrong)."""
  path = target_dir / "config.json"
  try:
    config = json.loads(path.read_text())
  except OSError as err:
    raise ValueError(f"{path}: cannot read ({err.strerror or err})") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as err:
    raise ValueError(f"{path}: not valid JSON ({err})") from None
  from wts_jax.specdecode.qwen3 import Qwen3Config
  Qwen3Config.from_hf(config, str(path))
  return config


def _config_eos(config: dict, where: str) -> list[int] | None:
  """config.json's ``eos_token_id``: one token id, a list of them, or absent."""
  from wts_jax.convert.config_fields import ConfigFields
  fields = ConfigFields(config, where)
  if isinstance(config.get("eos_token_id"), list):
    return fields.int_list("eos_token_id", minimum=0)
  eos = fields.integer("eos_token_id", None, minimum=0)
  return None if eos is None else [eos]


def _walk_used(drafter, args, batch: int, dtype) -> str:
  """The walk implementation the loop will run (``--walk auto`` picks one)."""
  if args.walk == "none" or drafter.head is None:
    return "none"
  import jax
  import wts_jax
  steps = max(args.draft_len or drafter.config.block_size, 1)
  base = jax.ShapeDtypeStruct((batch, steps, drafter.config.vocab_size), dtype)
  return wts_jax.chosen_implementation(drafter.head, base, args.walk,
                                       temperature=args.temperature,
                                       return_logits=args.temperature > 0)


def _controller(path: Path, prior: str, block_size: int):
  """The TableTune controller of the cost table at ``path`` over the draft lengths the
  drafter can draft (ValueError naming the table)."""
  from wts_jax.tabletune.controller import TableTuneController
  from wts_jax.tabletune.cost_table import CostTable
  from wts_jax.tabletune.traces import regime_profile
  try:
    table = CostTable.load(path)
  except OSError as err:
    raise ValueError(f"--cost-table={str(path)!r}: cannot read ({err.strerror or err})"
                     ) from None
  except ValueError as err:
    raise ValueError(f"--cost-table={str(path)!r}: {err}") from None
  lens = tuple(k for k in table.draft_lens if k <= block_size)
  if len(lens) < 2:
    raise ValueError(f"--cost-table={str(path)!r} has draft lengths {list(table.draft_lens)}; "
                     f"the drafter drafts at most {block_size}: nothing to choose between")
  return TableTuneController.from_table(table, regime_profile(prior, lens[-1]),
                                        draft_lens=lens)


def main(argv: list[str] | None = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if not args.ids and not args.text:
    parser.error("give a prompt: --ids 1,2,3 or --text '...'")
  for name in ("target", "drafter"):
    if not getattr(args, name).is_dir():
      parser.error(f"argument --{name}: {str(getattr(args, name))!r} is not a directory")
  try:
    config = _target_config(parser, args.target)
  except ValueError as err:
    return print_error(err)
  tokenizer_path = args.target / TOKENIZER_FILE
  tokenizer = None
  if tokenizer_path.is_file():
    from tokenizers import Tokenizer   # only for text; token ids need no tokenizer
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
  elif args.text:
    parser.error(f"argument --text: needs {tokenizer_path}, which does not exist; pass "
                 "--ids")
  prompts = list(args.ids) + [tokenizer.encode(text).ids for text in args.text]
  positions = config.get("max_position_embeddings")
  longest = max(len(prompt) for prompt in prompts)
  if isinstance(positions, int) and longest + args.max_new_tokens > positions:
    parser.error(f"argument --max-new-tokens: {args.max_new_tokens} + the longest prompt "
                 f"({longest} tokens) exceeds the target's max_position_embeddings="
                 f"{positions}")
  try:
    eos = None if args.no_eos else (args.eos_id or _config_eos(config, str(args.target /
                                                                         "config.json")))
  except ValueError as err:
    return print_error(err)

  import jax
  import jax.numpy as jnp

  from wts_jax.convert.errors import ConversionError
  from wts_jax.specdecode.dspark import load_dspark
  from wts_jax.specdecode.generate_output import GenerateError
  from wts_jax.specdecode.loop import generate
  from wts_jax.specdecode.qwen3 import load_qwen3
  dtype = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}[args.dtype]
  try:
    target = load_qwen3(args.target, dtype=dtype)
    drafter = load_dspark(args.drafter, dtype=dtype)
    walk = _walk_used(drafter, args, len(prompts), dtype)
    draft_len = args.draft_len
    if args.cost_table is not None:
      draft_len = _controller(args.cost_table, args.acceptance_prior,
                              drafter.config.block_size)
    out = generate(target, drafter, prompts, args.max_new_tokens,
                   temperature=args.temperature, key=jax.random.key(args.seed),
                   draft_len=draft_len, walk_impl=args.walk, eos_id=eos)
  except (ValueError, TypeError, ConversionError, OSError, GenerateError) as err:
    return print_error(err)   # a generate status (NaN target, drafter or walk) included
  except MemoryError:
    return print_error("out of host memory loading the checkpoints")
  except RuntimeError as err:   # XLA's RESOURCE_EXHAUSTED: the device is too small
    if "RESOURCE_EXHAUSTED" not in str(err):
      raise
    return print_error(f"out of device memory: {str(err).splitlines()[0]}")
  for row in out.rows():
    print(tokenizer.decode(row) if tokenizer is not None else " ".join(map(str, row)))
  lengths = out.acceptance_length()
  print(f"{int(out.iterations)} iterations; walk: {walk} (--walk {args.walk}); tokens per "
        "verify pass: " + ", ".join(f"{value:.2f}" for value in lengths), file=sys.stderr)
  if args.cost_table is not None:
    state = out.policy_state
    print(f"TableTune: drafting K = {int(state.draft_len)} at the end, "
          f"{int(state.probes)} probes, {int(state.timed)} iterations timed",
          file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
