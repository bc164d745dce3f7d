"""A small walk on each kernel, for compute-sanitizer (memcheck, racecheck) on the GPU.

  compute-sanitizer --tool racecheck python tools/sanitizer_case.py \
      [mosaic|triton|batched|batched-wg2|batched-producer|batched-producer-64n|batched-gated
       |batched-gated-split|batched-gated-table|batched-rnn-split|batched-rnn-split-m2
       |batched-rnn-joint-table
       |batched-widen-registers|batched-widen-smem|batched-int8p-m2|stacked|stacked-40]
      [SEEDS] [SPIN_LIMIT]

(A batched case's name + ``-refill-early``: the same walk with each streamed W2 chunk's
ring slot refilled, or released to the producer, before its epilogue:
``MosaicBatchedConfig.ring_refill="before_epilogue"``.)

``mosaic``: the Mosaic row kernel (B = 2); ``triton``: the Triton kernel (B = 2);

``batched``: the batched Mosaic kernel (B = 5, padded to 8 rows; its atomic exchange);
``batched-wg2``: the same with two warpgroups a block, the batch on N (their hand-overs);
``batched-producer`` / ``batched-producer-64n``: two warpgroups and a producer warpgroup,
32 / 64 rows on N (where a release without a barrier gave wrong tokens: NOTES v12);
``batched-gated``: the gated head on the batched kernel (G_e through the ring, hi + lo);
``batched-gated-split``: the same with its gate split over the 4 blocks (16 units each);
``batched-gated-table``: the same with its gate from its table (the batch on N, 16 rows:
the leader's gate staging beside two warpgroups and a producer);
``batched-rnn-split``: the rnn head, its update split likewise; ``-m2``: 40 rows on M,
two warpgroups (a 1-slot base ring each);
``batched-rnn-joint-table``: the rnn head from its joint table (B = 5 on N: the owners'
J_s s tile, WGMMAs and published halves, the state kept in shared memory);
``batched-widen-registers`` / ``batched-widen-smem``: an int8 W2 streamed as int8 and
widened in the kernel (into the WGMMA's A operand, or through each warpgroup's bf16 tile:
its stores and fence), two warpgroups on N;
``batched-int8p-m2``: int8 planes at 40 rows on M, two warpgroups and a producer (the
planner's choice there), the z rows gathered by the leader's four warps, each row's s_lo
loaded by a thread of its own.
``stacked`` / ``stacked-40``: the stacked int8-planes walk (``stacked_walk``) on 2 blocks of
6 tiles (V 712; 768 with W2 in its threads' rows, letter U), one tile resident and the
rest streamed: B = 5 on four phases (1-slot rings, a phase of one tile), B = 40 on two
(2-slot rings shared by two warpgroups); its spec's options by ``tools/stacked_probe.py``'s
letters in STACKED_OPTIONS (e.g. ``D+F``, or ``F+C+U`` for the API's at B <= 32: W1 in
fragment order, the base logits by async copies, W2 in its threads' rows).
SEEDS (default 1) fresh inputs are walked; the exit status is 1 if any differs.
SPIN_LIMIT (default 2^14) bounds each grid-barrier wait: a walk whose instrumented blocks
wait longer ends with the timeout status (4), not a race; raise it to let them finish.
"""

import dataclasses
import os
import sys

import jax
import numpy as np

import wts_jax
from wts_jax.heads import HeadConfig
from wts_jax.inputs import random_inputs


def stacked(batch: int, seeds: int, spin_limit: int) -> int:
  sys.path.insert(0, os.path.dirname(__file__))
  from stacked_probe import PLAN_LETTERS, plan_and_spec_options, walk_operands
  from wts_jax.pallas.stacked.launch import stacked_walk
  from wts_jax.pallas.stacked.plan import plan_stacked
  from wts_jax.pallas.stacked.spec import StackedSpec
  from wts_jax.pallas.head_operands import serial_operands
  from wts_jax.quantize import quantize_w2
  plan_options, spec_options = plan_and_spec_options(os.environ.get("STACKED_OPTIONS", ""))
  # (W2 in its threads' rows takes whole 64-row tiles: V 768, else 712)
  vocab = 768 if spec_options.get("w2_order") == "thread_rows" else 712
  config = HeadConfig(vocab_size=vocab, rank=64, hidden_size=64, head_type="vanilla")
  head = quantize_w2(wts_jax.make_head(config, seed=1), "int8", state="planes")
  plan_names = {name for name, _ in PLAN_LETTERS.values()}   # (its residency is fixed)
  plan = plan_stacked(vocab_size=vocab, rank=64, batch=batch, num_blocks=2,
                      smem_per_block=227 * 1024, resident=1,
                      **{k: v for k, v in plan_options.items() if k in plan_names})
  spec = StackedSpec(plan, batch, 4, spin_limit=spin_limit, **spec_options)
  print(plan.describe(), spec)
  walk = jax.jit(lambda *a: stacked_walk(spec, *a))
  cpu = jax.devices("cpu")[0]
  differ = 0
  for seed in range(seeds):
    base, first, _ = random_inputs(config, batch, 4, jax.random.key(2 + seed))
    tokens, status = walk(*walk_operands(spec, serial_operands(head, None), base, first))
    # (the reference on the CPU: no GPU autotuning under the tool, NOTES v25)
    ref = wts_jax.walk(*jax.device_put((head, base, first), cpu), None, impl="xla")
    same = np.array_equal(np.asarray(tokens), np.asarray(ref.tokens))
    differ += not same
    print(f"stacked B={batch} seed {seed}: tokens {'equal' if same else 'DIFFER'} "
          f"status {int(status)}")
  return 1 if differ else 0


def main(backend: str, seeds: int = 1, spin_limit: int = 1 << 14) -> int:
  refill_early = backend.endswith("-refill-early")
  backend = backend.removesuffix("-refill-early")
  if backend.startswith("stacked"):
    return stacked(40 if backend == "stacked-40" else 5, seeds, spin_limit)
  # 4 blocks × 3 chunks of 64 rows (V a multiple of 8, not of 64): one resident, a
  # 2-slot ring (two streamed chunks a step): every code path runs.
  gated = backend.startswith("batched-gated")
  # (-joint-table: the rnn head's one-barrier update from its joint table, on N.)
  joint = backend == "batched-rnn-joint-table"
  rnn = backend.startswith("batched-rnn-split") or joint
  # (-m2: the rnn head's two warpgroups on M, each with a 1-slot base ring.)
  rnn_two_on_m = backend == "batched-rnn-split-m2"
  planes_on_m = backend == "batched-int8p-m2"
  table = backend == "batched-gated-table"
  config = HeadConfig(vocab_size=712, rank=64, hidden_size=64,
                      head_type="gated" if gated else "rnn" if rnn else "vanilla")
  head = wts_jax.make_head(config, seed=1)
  if table:
    head = wts_jax.with_gate_table(head)
  if joint:
    head = wts_jax.with_joint_table(head)
  widening = backend.removeprefix("batched-widen-") if "-widen-" in backend else None
  if widening or planes_on_m:
    from wts_jax.quantize import quantize_w2
    head = quantize_w2(head, "int8", state="planes" if planes_on_m else "float")
  batched = backend.startswith("batched")
  producer = backend.startswith("batched-producer")
  batch = 40 if rnn_two_on_m or planes_on_m else 5 if batched else 2
  if producer:
    batch = 64 if backend.endswith("64n") else 32
  if table:
    batch = 16
  # A bounded barrier: under the sanitizer every poll is instrumented (slow), and if the
  # tool ever ran the blocks one at a time the walk would end with a timeout status
  # instead of spinning 4M polls per step (session 9's mosaic run did not finish in
  # ~450 s; the cause is not known).
  kernel_config = case_config(backend, spin_limit)
  if refill_early:
    kernel_config = early_refill_config(kernel_config, widening)
  walk = jax.jit(lambda h, b, f, x: wts_jax.walk(h, b, f, x, impl="pallas",
                                                 config=kernel_config))
  differ = 0
  for seed in range(seeds):
    base, first, hidden = random_inputs(config, batch, 4, jax.random.key(2 + seed))
    out = walk(head, base, first, hidden)
    if planes_on_m:
      # The int8 planes' reference on the CPU: under the tool XLA's GPU autotuning is off,
      # and without it the XLA int8 reference's tokens changed on the H200 (NOTES v25).
      cpu = jax.devices("cpu")[0]
      ref = wts_jax.walk(*jax.device_put((head, base, first, hidden), cpu), impl="xla")
    else:
      ref = wts_jax.walk(head, base, first, hidden, impl="xla")
    same = np.array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    differ += not same
    print(f"{backend} seed {seed}: tokens {'equal' if same else 'DIFFER'} "
          f"status {int(out.status)}")
  return 1 if differ else 0


def case_config(backend: str, spin_limit: int):
  """The kernel config of a case (``backend`` without ``-refill-early``): 4 blocks, 64
  resident rows a block, a 2-slot ring, the bounded barrier."""
  if backend == "triton":
    return wts_jax.TritonConfig(num_programs=4, residency=64, num_stages=2,
                                sync_spin_limit=spin_limit)
  options = dict(num_blocks=4, residency=64, ring_stages=2, sync_spin_limit=spin_limit)
  if backend == "mosaic":
    return wts_jax.MosaicRowConfig(**options)
  widening = backend.removeprefix("batched-widen-") if "-widen-" in backend else None
  table = backend == "batched-gated-table"
  producer = backend.startswith("batched-producer")
  if backend == "batched-wg2" or producer or widening or table:
    options.update(warpgroups=2, batch_axis="n")
  if table:
    options.update(producer=True, serial_update="table")
  if widening:
    options.update(w2_widening=widening)
  if producer:
    options.update(producer=True)
  if backend in ("batched-rnn-split-m2", "batched-int8p-m2"):
    options.update(warpgroups=2, batch_axis="m")
  if "-split" in backend:
    options.update(serial_update="split")
  if backend == "batched-rnn-joint-table":
    options.update(serial_update="table", batch_axis="n")
  return wts_jax.MosaicBatchedConfig(**options)


def early_refill_config(config, widening):
  """A ``-refill-early`` case's config: ``config`` with ``ring_refill="before_epilogue"``,
  or as planned where the kernel widens an int8 W2 (its threads read the ring slots)."""
  if widening:
    return config
  return dataclasses.replace(config, ring_refill="before_epilogue")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "mosaic",
                int(sys.argv[2]) if len(sys.argv) > 2 else 1,
                int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 14))
