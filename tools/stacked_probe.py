"""The stacked int8-planes walk (``wts_jax.pallas.stacked``) against the XLA walk
and the batched kernel's plan, at the Qwen3-4B shape: tokens checked, then each walk's
device time after an L2 flush (``profile_batched.time_walks``), in one device call.

  python tools/stacked_probe.py --out $OUT/stacked [--batches 5,16,32,40,64]
      [--variants r9+s1,...]   (rN: the block's resident tiles, sN: ring slots a phase,
      F: W1 in fragment order; C the base logits by cp.async into shared memory, a tile
      ahead; K the same two tiles ahead, three slots; Q three tiles ahead, four slots;
      T the slots filled by one TMA copy a tile a warpgroup (with C, K or Q); R the
      warps' requests rotated over the warp schedulers; V a warp past the batch skips
      its fold; S the status reduced in the kernel; U (with C) W2's tiles in
      thread-rows order: a thread's 16 columns 16 consecutive rows, its base logits two
      16-byte copies (with T: its TMA slot's words read as two 16-byte loads).
      The lab overlay (``StackedLab``): E each step's base logits prefetched into the
      L2 a step ahead; G a programmatic dependent launch; U4 (with C + U) the async
      slots' words read as 16-byte loads too; timing only, tokens wrong: A a tile's
      fold cut to one column pair, L no base loads, M no WGMMA issued, N each tile's
      WGMMA on 16 of its rows (the same chain on the same gathered z, a quarter of the
      MACs))
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import profile_batched as pb  # noqa: E402

import wts_jax  # noqa: E402
from wts_jax.inputs import random_inputs  # noqa: E402
from wts_jax.pallas.stacked.launch import stacked_walk
from wts_jax.pallas.stacked.plan import WARPGROUPS, plan_stacked, tile_bytes
from wts_jax.pallas.stacked.spec import StackedLab, StackedSpec, w1_planes_operand, w2_operand
from wts_jax.pallas.head_operands import serial_operands  # noqa: E402

STEPS = 7


# A letter's ``StackedSpec`` option, or its lab overlay's (``StackedLab``); the rest are
# the plan's.
SPEC_LETTERS = {"F": ("w1_order", "fragments"), "R": ("rotate_warps", True),
                "V": ("skip_idle_warps", True), "S": ("status", "kernel"),
                "U": ("w2_order", "thread_rows")}
LAB_LETTERS = {"A": ("timing_ablation", "fold"), "L": ("timing_ablation", "base"),
               "M": ("timing_ablation", "mma"), "N": ("timing_ablation", "narrow_mma"),
               "E": ("prefetch_base", True), "G": ("dependent_launch", True),
               "U4": ("base_vector_reads", True)}
SPEC_OPTIONS = [name for name, _ in SPEC_LETTERS.values()]
LAB_OPTIONS = [name for name, _ in LAB_LETTERS.values()]
# A letter's ``plan_stacked`` option.
PLAN_LETTERS = {"C": ("base_slots", 2), "K": ("base_slots", 3), "Q": ("base_slots", 4),
                "T": ("base_copies", "tma")}


def variant_options(text: str) -> dict:
  options = {}
  for part in (p for p in text.split("+") if p):
    letters = SPEC_LETTERS | LAB_LETTERS | PLAN_LETTERS
    if part in letters:
      name, value = letters[part]
      options[name] = value
      continue
    m = re.fullmatch(r"([rs])(\d+)", part)
    if not m:
      raise SystemExit(f"error: bad variant option {part!r}")
    options[{"r": "resident", "s": "ring_stages"}[m[1]]] = int(m[2])
  return options


def plan_and_spec_options(text: str) -> tuple[dict, dict]:
  """``variant_options`` split into (``plan_stacked``'s, ``StackedSpec``'s), the lab
  overlay's as the spec's ``lab``."""
  options = variant_options(text)
  spec_options = {k: options.pop(k) for k in SPEC_OPTIONS if k in options}
  lab = {k: options.pop(k) for k in LAB_OPTIONS if k in options}
  if lab:
    spec_options["lab"] = StackedLab(**lab)
  return options, spec_options


def walk_operands(spec, operands, base, first):
  """``stacked_walk``'s operands after the spec: W1's planes in the order it asks for
  (the head carries both)."""
  return (w2_operand(spec, operands), base, w1_planes_operand(spec, operands), first,
          operands["w2_scale"], operands["w1_plane_scale"])


def special_run(kind, batch, head, operands, base, first, device, out, tries: int = 3,
                spec_options=None, plan_options=None):
  """One walk built with Mosaic GPU's profiler (``profile``: its regions summarised) or
  with the ptxas report and SASS dumped (``dump``). The profiler's buffer takes shared
  memory from W2's tiles: as much as the compiled kernel says it exceeds."""
  directory = os.path.join(out, f"{kind}-{batch}")
  os.makedirs(directory, exist_ok=True)
  reserve = pb.PROFILE_SPACE * 2 * 4 * WARPGROUPS + 1024 if kind == "profile" else 0
  def prepared(spec):
    return walk_operands(spec, operands, base, first)
  flags = (dict(MOSAIC_GPU_DUMP_TO=directory, MOSAIC_GPU_DUMP_PTXAS="1",
                MOSAIC_GPU_DUMP_SASS="1") if kind == "dump" else {})

  def attempt(reserve):
    plan = plan_stacked(vocab_size=head.config.vocab_size, rank=head.config.rank,
                        batch=batch, num_blocks=device.num_sms,
                        smem_per_block=device.smem_per_block - reserve,
                        **(plan_options or {}))
    spec_options_here = dict(spec_options or {})
    if kind == "profile":
      spec_options_here["lab"] = dataclasses.replace(
          spec_options_here.get("lab", StackedLab()), profile_dir=directory,
          profile_space=pb.PROFILE_SPACE)
    spec = StackedSpec(plan, batch, STEPS, **spec_options_here)
    jax.block_until_ready(jax.jit(lambda *a: stacked_walk(spec, *a))(*prepared(spec)))
    return plan

  os.environ.update(flags)
  try:
    # (A tile more than the excess: a plan drops whole tiles.)
    plan = pb.reserving_excess(attempt, reserve, tries=tries,
                               margin=tile_bytes(head.config.rank))
  finally:
    for name in flags:
      os.environ.pop(name, None)
  if kind == "dump":
    return pb.dump_stats(directory)
  return {"plan": plan.describe(), **pb.summarise_profile(directory, 1.98)}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--batches", default="5,16,32,40,64")
  parser.add_argument("--variants", default="")
  parser.add_argument("--walks", type=int, default=10)
  parser.add_argument("--compare", default="a", help="batched-kernel options to time beside")
  parser.add_argument("--profile", default="", help="batches to profile (regions a warpgroup)")
  parser.add_argument("--dump", default="", help="batches whose ptxas report and SASS to dump")
  parser.add_argument("--special-variant", default="",
                      help="the options (as --variants) of the profiled and dumped builds")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  heads = pb.Heads()
  head = heads("int8p")
  device = wts_jax.device.current()
  results = {"jax": jax.__version__, "device": str(jax.devices()[0].device_kind),
             "walks": args.walks, "points": []}
  special_plan, special_options = plan_and_spec_options(args.special_variant)
  if "resident" in special_plan:   # the profiler's buffer takes its room from resident tiles
    raise SystemExit(f"error: --special-variant {args.special_variant!r}: no rN")
  for batch in (int(b) for b in args.batches.split(",")):
    base, first, _ = random_inputs(heads.config("int8p"), batch, STEPS, jax.random.key(batch))
    want = np.asarray(wts_jax.walk(head, base, first, None, impl="xla").tokens)
    operands = serial_operands(head, None)
    for extra in ("profile", "dump"):
      if str(batch) in getattr(args, extra).split(","):
        record = {"variant": f"stacked:{batch}:{extra}:{args.special_variant}"}
        try:
          record[extra] = special_run(extra, batch, head, operands, base, first, device,
                                      args.out, spec_options=special_options,
                                      plan_options=special_plan)
        except Exception as err:
          record["error"] = f"{type(err).__name__}: {str(err)[:2000]}"
        pb.recorded(results, record)
    for variant in [""] + [v for v in args.variants.split(",") if v]:
      name = f"stacked:{batch}:{variant}"
      record = {"variant": name}
      try:
        options, spec_options = plan_and_spec_options(variant)
        plan = plan_stacked(vocab_size=head.config.vocab_size, rank=head.config.rank,
                            batch=batch, num_blocks=device.num_sms,
                            smem_per_block=device.smem_per_block, **options)
        spec = StackedSpec(plan, batch, STEPS, **spec_options)
        record["plan"] = plan.describe()

        def walk(w2, base, planes, first, w2_scale, s_lo, spec=spec):
          return stacked_walk(spec, w2, base, planes, first, w2_scale, s_lo)
        call = walk_operands(spec, operands, base, first)
        run = jax.jit(walk).lower(*call).compile()
        tokens, status = run(*call)
        tokens = np.asarray(tokens)
        record.update(status=int(status), tokens_equal=bool((tokens == want).all()))
        if spec.lab.timing_ablation:   # (timing only: its tokens are wrong by design)
          per_walk, kernel, _, _ = pb.time_walks(run, call, args.walks)
          record.update(ablation=spec.lab.timing_ablation,
                        walk_us_median=round(float(np.median(per_walk)), 1),
                        kernel_us_median=round(float(kernel), 1))
        elif not record["tokens_equal"]:
          differ = tokens != want
          record["tokens_differing"] = int(differ.sum())
          record["first_rows"] = [tokens[0].tolist(), want[0].tolist()]
        else:
          per_walk, kernel, _, _ = pb.time_walks(run, call, args.walks)
          record.update(walk_us_median=round(float(np.median(per_walk)), 1),
                        kernel_us_median=round(float(kernel), 1))
      except Exception as err:   # one variant's failure is a result too
        record["error"] = f"{type(err).__name__}: {str(err)[:2000]}"
      pb.recorded(results, record)
    if args.compare:
      variant = pb.parse_variant(f"int8p:{batch}:greedy:{args.compare}")
      try:
        _, run, operands_b, want_b = pb.build(variant, heads)
        per_walk, kernel, _, _ = pb.time_walks(run, operands_b, args.walks)
        record = {"variant": variant.name, "walk_us_median": round(float(np.median(per_walk)), 1),
                  "kernel_us_median": round(float(kernel), 1)}
      except Exception as err:
        record = {"variant": variant.name, "error": f"{type(err).__name__}: {str(err)[:500]}"}
      pb.recorded(results, record)
  pb.write_results(args.out, results)


if __name__ == "__main__":
  main()
