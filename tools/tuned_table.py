"""Write a device's tuned table (``wts_jax/pallas/tuned/<device>/walk.json``) from the
planners' choices, or check the committed one against them.

  python tools/tuned_table.py --write [--device "NVIDIA H200"]
  python tools/tuned_table.py --check [--device "NVIDIA H200"]   # exit 1 on a difference

For every head (vanilla, gated with and without its gate table, rnn with and without its
joint table), rank (64, 128, 256) at Qwen3's V, W2 (bf16, int8, int8 planes), greedy and
sampled, and every batch size from 1 to ``OPEN_FROM`` (the last range open-ended), the
backend the planners' fallback order takes on the device (``preference.fallback_order``,
the first that accepts) and its config with every planner choice written out; equal
neighbours merged into one range. The planners' rules were read from measurements on the
H200, so this is where a measured sweep (``tools/profile_batched.py``) writes its
winners in turn: an entry edited by hand or by a sweep is data, not code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax

VOCAB = 151936
RANKS = (64, 128, 256)
OPEN_FROM = 160   # past this many rows every choice is constant (launches of 64 rows)
# The batched kernel's choices a table entry writes out (the rest: the planner's budget).
BATCHED_CHOICES = ("batch_axis", "warpgroups", "producer", "serial_update", "merge_tiles",
                   "w2_widening", "base_stages", "status", "ring_refill")


def heads():
  """(head type, derived table, W2 form, the abstract head) of every table key."""
  import wts_jax
  from wts_jax.heads import HeadConfig
  for head_type, tables in (("vanilla", (None,)), ("gated", (None, "gate")),
                            ("rnn", (None, "joint"))):
    for rank in RANKS:
      base = jax.eval_shape(lambda: wts_jax.make_head(
          HeadConfig.qwen3_4b(head_type, rank=rank)))
      forms = {"bfloat16": base,
               "int8": jax.eval_shape(lambda h: wts_jax.quantize_w2(h, "int8"), base)}
      if head_type == "vanilla":
        forms["int8_planes"] = jax.eval_shape(
            lambda h: wts_jax.quantize_w2(h, "int8", state="planes"), base)
      for w2, head in forms.items():
        for table in tables:
          derive = {"gate": wts_jax.with_gate_table, "joint": wts_jax.with_joint_table}
          yield head_type, table, rank, w2, (
              jax.eval_shape(derive[table], head) if table else head)


def chosen(head, batch: int, greedy: bool, device) -> tuple[str, dict] | None:
  """(backend, its config's choices) the planners take for this walk, or None (XLA)."""
  from wts_jax.pallas import backend, mosaic_batched_backend, mosaic_plan
  from wts_jax.walk_config import MosaicBatchedConfig, MosaicRowConfig
  shapes = backend.WalkShapes(batch=batch, steps=7, greedy=greedy)
  choice = backend.choose(head, shapes, "auto", None, require_gpu=False, device=device)
  if choice.impl == "xla":
    return None
  if choice.impl == "mosaic_batched":
    config, _ = mosaic_batched_backend.resolve(head, shapes, MosaicBatchedConfig(), device)
    return choice.impl, {name: getattr(config, name) for name in BATCHED_CHOICES}
  if choice.impl == "mosaic_stacked":
    return choice.impl, {"status": choice.plan.status}
  if choice.impl == "mosaic_row":
    return choice.impl, {"gemv": mosaic_plan.mosaic_gemv(head, MosaicRowConfig())}
  return choice.impl, {}


def entries(device_kind: str) -> list[dict]:
  from wts_jax.device import H200
  # (planned on the device's facts with no table of its own: the planners alone)
  device = dataclasses.replace(H200, kind=f"{device_kind} (planners)")
  out = []
  for head_type, table, rank, w2, head in heads():
    for mode, greedy in (("greedy", True), ("sampled", False)):
      runs = []
      for batch in range(1, OPEN_FROM + 1):
        choice = chosen(head, batch, greedy, device)
        if runs and runs[-1][2] == choice:
          runs[-1][1] = batch
        else:
          runs.append([batch, batch, choice])
      runs[-1][1] = None
      for low, high, choice in runs:
        if choice is None:
          continue
        impl, config = choice
        out.append({"head": head_type, "table": table, "vocab": VOCAB, "rank": rank,
                    "w2": w2, "mode": mode, "batch": [low, high], "impl": impl,
                    "config": config})
  return out


def table_text(device_kind: str) -> str:
  lines = ",\n".join("    " + json.dumps(entry) for entry in entries(device_kind))
  about = ("impl='auto' on this device: for each head (its derived table), V, r, W2 form, "
           "mode and batch range, the backend and config the planners' rules (read from "
           "measurements on the H200) take; written by tools/tuned_table.py")
  return (f'{{\n  "device_kind": {json.dumps(device_kind)},\n  "about": {json.dumps(about)},\n'
          f'  "entries": [\n{lines}\n  ]\n}}\n')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  action = parser.add_mutually_exclusive_group(required=True)
  action.add_argument("--write", action="store_true")
  action.add_argument("--check", action="store_true")
  parser.add_argument("--device", default="NVIDIA H200")
  args = parser.parse_args(argv)
  from wts_jax.pallas import preference
  path = preference.table_file(args.device)
  text = table_text(args.device)
  if args.write:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path} ({text.count(chr(10)) - 5} entries)")
    return 0
  same = path.exists() and path.read_text() == text
  print(f"{'same' if same else 'DIFFERENT'}: {path} against the planners")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
