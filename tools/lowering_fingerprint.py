"""Fingerprint the kernel launches ``wts_jax.walk`` makes, to prove a refactor changed
nothing: the same kernels, launched with the same parameters, for the same inputs.

For each case (a head, shapes, options and an ``impl``/``config`` spelled through the
public API) the walk is traced for CUDA on the CPU — the device taken to be an H200 —
and two texts are kept: the jaxpr of the whole call (the kernel body, grid, compiler
parameters and scratch of every ``pallas_call``, printed without source locations) and
the lowered StableHLO with the kernels' serialized payloads blanked (those embed source
file paths). Identical texts mean identical launches, since lowering is a function of
the jaxpr.

  python tools/lowering_fingerprint.py --save DIR          # write one file per case
  python tools/lowering_fingerprint.py --compare DIR       # exit 1 on any difference
  python tools/lowering_fingerprint.py --against REV       # this tree against commit REV

``--against`` checks REV out in a temporary git worktree and runs this same script
there; ``spelled`` writes each case in the API of the tree it runs in. Run it with
``JAX_PLATFORMS=cpu`` on jax >= 0.11 (where every kernel path lowers).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp

# A case: the head (``head_type``, ``rank``, ``quantize``: None, "int8", "int8p" — z as
# two int8 planes — or "fp8"; ``derive``: "gate_table", "joint_table" or "joint_hidden"),
# the walk (``batch``, ``steps``, ``temperature``, ``logits``, ``logprobs``) and its
# spelling: ``impl`` (default "pallas") and ``config`` — None, or (backend, fields) with
# backend "mosaic" (the Mosaic kernels' options; ``kernel`` names one of them: "rows",
# "batched", "stacked") or "triton". ``spelled`` turns that into the API of the tree the
# script runs in.
def _mosaic(**fields):
  return ("mosaic", fields)


def _triton(**fields):
  return ("triton", fields)


CASES = {
    # The row kernel, asked for by name, at the Qwen3 shape.
    **{f"mosaic-{head}-b{b}-{mode}-{w2}-{gemv}": dict(
        head_type=head, batch=b, temperature=t, quantize=q, config=_mosaic(gemv=gemv))
       for head in ("vanilla",)
       for b in (1, 4) for mode, t in (("greedy", 0.0), ("sampled", 0.8))
       for w2, q in (("bf16", None), ("int8", "int8"))
       for gemv in ("auto", "registers", "wgmma")},
    **{f"mosaic-gated-b{b}-{mode}-{w2}": dict(
        head_type="gated", batch=b, temperature=t, quantize=q, config=_mosaic())
       for b in (1, 4) for mode, t in (("greedy", 0.0), ("sampled", 0.8))
       for w2, q in (("bf16", None), ("int8", "int8"))},
    **{f"mosaic-rows-int8p-b{b}-{mode}{'-x2' if held else ''}": dict(
        batch=b, temperature=t, quantize="int8p",
        config=_mosaic(kernel="rows", register_chunks=held))
       for b in (1, 4) for mode, t in (("greedy", 0.0), ("sampled", 0.8))
       for held in (0, 2)},
    "mosaic-residency-none": dict(config=_mosaic(residency="none")),
    "mosaic-residency-half": dict(config=_mosaic(residency=0.5)),
    "mosaic-residency-fifth": dict(config=_mosaic(residency=0.2)),
    "mosaic-residency-rows": dict(config=_mosaic(residency=256)),
    "mosaic-stages3": dict(config=_mosaic(residency=0, ring_stages=3)),
    "mosaic-group2": dict(config=_mosaic(group=2)),
    "mosaic-resident-group2": dict(config=_mosaic(gemv="wgmma", resident_group=2)),
    "mosaic-nosnake": dict(config=_mosaic(snake=False)),
    "mosaic-blocks64": dict(config=_mosaic(num_blocks=64)),
    "mosaic-spin": dict(config=_mosaic(sync_spin_limit=1000)),
    "mosaic-rank192": dict(rank=192, config=_mosaic()),
    # The batched kernel on either axis, every head (int8 planes for the vanilla one).
    **{f"mosaic-batched-{label}-b{b}-{axis}-{mode}": dict(
        head_type=head, batch=b, temperature=t, quantize=q,
        config=_mosaic(kernel="batched", batch_axis=axis))
       for label, head, q in (("vanilla", "vanilla", None),
                              ("vanilla-int8p", "vanilla", "int8p"),
                              ("gated", "gated", None), ("rnn", "rnn", None))
       for b in (16, 70) for axis in ("m", "n")
       for mode, t in (("greedy", 0.0), ("sampled", 0.8))},
    # ... its planner's choices at other batch sizes, every head and W2.
    **{f"mosaic-batched-auto-{label}-b{b}-{mode}": dict(
        head_type=head, batch=b, temperature=t, quantize=q,
        config=_mosaic(kernel="batched"))
       for label, head, q in (("vanilla", "vanilla", None),
                              ("vanilla-int8", "vanilla", "int8"),
                              ("vanilla-int8p", "vanilla", "int8p"),
                              ("gated", "gated", None), ("gated-int8", "gated", "int8"),
                              ("rnn", "rnn", None), ("rnn-int8", "rnn", "int8"))
       for b in (1, 4, 32, 64) for mode, t in (("greedy", 0.0), ("sampled", 0.8))},
    # ... an int8 W2 widened before or in the kernel.
    **{f"mosaic-batched-widen-{widening}-{head}-b{b}-{mode}": dict(
        head_type=head, batch=b, temperature=t, quantize="int8",
        config=_mosaic(kernel="batched", w2_widening=widening))
       for widening in ("xla", "registers", "smem") for head in ("vanilla", "gated")
       for b in (4, 16) for mode, t in (("greedy", 0.0), ("sampled", 0.8))},
    # ... its options where the config names them.
    **{f"mosaic-batched-{name}": dict(head_type=head, batch=b, temperature=t,
                                      config=_mosaic(kernel="batched", **fields))
       for name, head, b, t, fields in (
           ("wg1-n-b32", "vanilla", 32, 0.0, dict(batch_axis="n", warpgroups=1)),
           ("wg2-m-b16", "vanilla", 16, 0.0, dict(batch_axis="m", warpgroups=2)),
           ("producer-off-b64", "vanilla", 64, 0.0, dict(producer=False)),
           ("producer-on-b64-sampled", "vanilla", 64, 0.8,
            dict(producer=True, warpgroups=2)),
           ("merge-tiles-off-b8", "vanilla", 8, 0.0,
            dict(batch_axis="n", warpgroups=2, merge_tiles=False)),
           ("base-stages2-b16", "vanilla", 16, 0.0, dict(base_stages=2)),
           ("status-flags-b16", "vanilla", 16, 0.0, dict(status="flags")),
           ("refill-early-b16", "vanilla", 16, 0.0, dict(ring_refill="before_epilogue")),
           ("refill-late-b1", "vanilla", 1, 0.0, dict(ring_refill="after_epilogue")),
           ("residency-none-b16", "vanilla", 16, 0.0, dict(residency="none")),
           ("stages3-b16", "vanilla", 16, 0.0, dict(residency=0, ring_stages=3)),
           ("nosnake-b16", "vanilla", 16, 0.0, dict(snake=False)),
           ("gated-split-b4", "gated", 4, 0.0, dict(serial_update="split")),
           ("gated-redundant-b4", "gated", 4, 0.0, dict(serial_update="redundant")),
           ("gated-redundant-b16-sampled", "gated", 16, 0.8,
            dict(serial_update="redundant")),
           ("rnn-split-b4-n", "rnn", 4, 0.0, dict(serial_update="split", batch_axis="n")),
           ("rnn-wg2-m-b16", "rnn", 16, 0.8, dict(batch_axis="m", warpgroups=2)))},
    "mosaic-batched-status-kernel-int8p-b16": dict(
        quantize="int8p", batch=16, config=_mosaic(kernel="batched", status="kernel")),
    # ... the gated head's gate table and the rnn head's joint table.
    **{f"mosaic-{label}-b{b}-{mode}-{w2}": dict(
        head_type=head, derive=derive, batch=b, temperature=t, quantize=q,
        config=_mosaic(**fields))
       for label, head, derive, fields in (
           ("gate-table", "gated", "gate_table", {}),
           ("gate-table-asked", "gated", "gate_table", dict(serial_update="table")),
           ("joint-table", "rnn", "joint_table", {}),
           ("joint-table-asked", "rnn", "joint_table", dict(serial_update="table")))
       for b in (1, 4, 16) for mode, t in (("greedy", 0.0), ("sampled", 0.8))
       for w2, q in (("bf16", None), ("int8", "int8"))},
    "mosaic-joint-hidden-b4": dict(head_type="rnn", derive="joint_hidden", batch=4,
                                   config=_mosaic()),
    # The stacked kernel (int8 planes, vanilla head).
    **{f"mosaic-stacked-b{b}-{mode}": dict(
        batch=b, temperature=t, quantize="int8p", config=_mosaic(kernel="stacked"))
       for b in (1, 4, 16, 33, 64, 70) for mode, t in (("greedy", 0.0), ("sampled", 0.8))},
    "mosaic-stacked-status-flags-b16": dict(
        batch=16, quantize="int8p", config=_mosaic(kernel="stacked", status="flags")),
    "mosaic-stacked-blocks64-b4": dict(
        batch=4, quantize="int8p", config=_mosaic(kernel="stacked", num_blocks=64)),
    "mosaic-stacked-stages3-b4": dict(
        batch=4, quantize="int8p", config=_mosaic(kernel="stacked", ring_stages=3)),
    # impl="mosaic": the best Mosaic kernel.
    **{f"mosaic-best-{label}-b{b}-{mode}": dict(
        head_type=head, batch=b, temperature=t, quantize=q, impl="mosaic", config=None)
       for label, head, q in (("vanilla", "vanilla", None),
                              ("vanilla-int8", "vanilla", "int8"),
                              ("vanilla-int8p", "vanilla", "int8p"),
                              ("gated", "gated", None), ("rnn", "rnn", None))
       for b in (1, 4, 16, 64) for mode, t in (("greedy", 0.0), ("sampled", 0.8))},
    # Triton, asked for by name.
    **{f"triton-vanilla-b{b}-{mode}": dict(batch=b, temperature=t, config=_triton())
       for b in (1, 4, 64) for mode, t in (("greedy", 0.0), ("sampled", 0.8))},
    "triton-vanilla-b16-logits": dict(batch=16, logits=True, logprobs=True,
                                      config=_triton()),
    "triton-int8-b1": dict(quantize="int8", config=_triton()),
    "triton-int8-b4-sampled": dict(quantize="int8", batch=4, temperature=1.0,
                                   config=_triton()),
    "triton-gated-b1-split": dict(head_type="gated", temperature=0.8, logprobs=True,
                                  config=_triton()),
    "triton-gated-b4-redundant": dict(head_type="gated", batch=4,
                                      config=_triton(serial_update="redundant")),
    "triton-rnn-b16-logits": dict(head_type="rnn", batch=16, logits=True,
                                  config=_triton()),
    "triton-rnn-b1-sampled": dict(head_type="rnn", temperature=1.0, config=_triton()),
    "triton-residency-none": dict(config=_triton(residency="none")),
    "triton-residency-half": dict(config=_triton(residency=0.5)),
    "triton-residency-tenth": dict(config=_triton(residency=0.1)),
    "triton-residency-rows": dict(config=_triton(residency=64)),
    "triton-tuned": dict(config=_triton(tile_rows=32, num_warps=4, num_stages=2,
                                        num_programs=66)),
    "triton-rank64": dict(rank=64, quantize="int8", config=_triton()),
    "triton-rank64-full": dict(rank=64, quantize="int8", config=_triton(residency="full")),
    # The automatic choice (impl="pallas": among the kernels; impl="auto": or XLA).
    **{f"auto-{head}-b{b}-{mode}-{w2}": dict(
        head_type=head, batch=b, temperature=t, quantize=q, config=None)
       for head in ("vanilla", "gated", "rnn")
       for b in (1, 4, 16) for mode, t in (("greedy", 0.0), ("sampled", 0.8))
       for w2, q in (("bf16", None), ("int8", "int8"))},
    **{f"auto-{label}-b{b}-{mode}": dict(
        head_type=head, derive=derive, batch=b, temperature=t, quantize=q, impl="auto",
        config=None)
       for label, head, derive, q in (("vanilla-int8p", "vanilla", None, "int8p"),
                                      ("gate-table", "gated", "gate_table", None),
                                      ("joint-table", "rnn", "joint_table", None),
                                      ("joint-table-int8", "rnn", "joint_table", "int8"))
       for b in (1, 2, 4, 8, 16, 32, 48, 64, 100) for mode, t in (("greedy", 0.0),
                                                                 ("sampled", 0.8))},
    "auto-vanilla-b1-logits": dict(logits=True, config=None),
    "auto-vanilla-int8p-b4-logprobs": dict(quantize="int8p", batch=4, temperature=0.8,
                                           logprobs=True, impl="auto", config=None),
    "auto-vanilla-b1-fp8": dict(quantize="fp8", impl="auto", config=None),
    "auto-rank192-b1": dict(rank=192, impl="auto", config=None),
    "auto-rank128-b1": dict(rank=128, impl="auto", config=None),
    "auto-rank64-b4": dict(rank=64, batch=4, impl="auto", config=None),
    "auto-vanilla-b128": dict(batch=128, impl="auto", config=None),
    "auto-vanilla-b256": dict(batch=256, impl="auto", config=None),
    "xla-vanilla-b4": dict(batch=4, impl="xla", config=None),
    "xla-gated-b1-sampled": dict(head_type="gated", temperature=0.8, impl="xla",
                                 config=None),
}

# Cases whose launch a change makes on purpose, and why (none for a refactor).
EXPECTED_CHANGES: dict[str, str] = {}


# The Mosaic options only one kernel takes: a case's fields without ``kernel`` name it.
ROW_FIELDS = {"gemv", "group", "resident_group", "register_chunks"}
BATCHED_FIELDS = {"base_stages", "batch_axis", "warpgroups", "producer", "serial_update",
                  "merge_tiles", "w2_widening", "ring_refill"}
KERNEL_IMPLS = {"rows": "mosaic_row", "batched": "mosaic_batched", "stacked": "mosaic_stacked"}


def spelled(case):
  """(impl, config) of ``case`` in the API of the tree this script runs in: a tree with
  ``MosaicConfig`` (one config for the Mosaic kernels, ``kernel`` naming one) or one
  with a config a kernel."""
  import wts_jax
  impl = case.get("impl", "pallas")
  if case["config"] is None:
    return impl, None
  backend, fields = case["config"]
  if backend == "triton":
    return impl, wts_jax.TritonConfig(**fields)
  if hasattr(wts_jax, "MosaicConfig"):
    return impl, wts_jax.MosaicConfig(**fields)
  # (a field at MosaicConfig's default names no kernel: "auto" chose as without it)
  fields = {name: value for name, value in fields.items()
            if (name, value) not in (("gemv", "auto"), ("kernel", "auto"))}
  kernel = fields.pop("kernel", None)
  if kernel is None and not fields:   # (the Mosaic kernels' own choice)
    return "mosaic", None
  if kernel is None:   # (the row kernel's walks at one row but for the split heads)
    kernel = ("rows" if fields.keys() & ROW_FIELDS or not fields.keys() & BATCHED_FIELDS
              and case.get("head_type", "vanilla") == "vanilla" else "batched")
  config_type = {"rows": wts_jax.MosaicRowConfig, "batched": wts_jax.MosaicBatchedConfig,
                 "stacked": wts_jax.MosaicStackedConfig}[kernel]
  return KERNEL_IMPLS[kernel], config_type(**fields)


@contextlib.contextmanager
def as_if_on_a_gpu():
  """Trace as on an H200: the dispatcher sees a GPU and the H200's facts (its tuned
  table too, where the tree has ``preference``); jax >= 0.11 gets an abstract GPU."""
  from wts_jax import device
  original, original_facts = jax.default_backend, device.current
  jax.default_backend = lambda: "gpu"
  try:
    import wts_jax.pallas.preference  # noqa: F401
    device.current = lambda: device.H200
  except ImportError:   # (a tree without a tuned table of configs: the planners')
    pass
  try:
    mesh = contextlib.nullcontext()
    if jax.__version_info__ >= (0, 11):
      from jax._src.mesh import AbstractDevice, AbstractMesh
      mesh = jax.sharding.use_abstract_mesh(AbstractMesh(
          (1,), ("x",), abstract_device=AbstractDevice(
              device_kind="NVIDIA H200", num_cores=132, platform="gpu")))
    with mesh:
      yield
  finally:
    jax.default_backend = original
    device.current = original_facts


def _walk_function(case):
  import wts_jax
  from wts_jax.heads import HeadConfig
  head_config = HeadConfig.qwen3_4b(case.get("head_type", "vanilla"),
                                    rank=case.get("rank", 256))
  head = jax.eval_shape(lambda: wts_jax.make_head(head_config))
  if case.get("quantize") == "int8p":   # z as two int8 planes
    head = jax.eval_shape(lambda h: wts_jax.quantize_w2(h, "int8", state="planes"), head)
  elif case.get("quantize"):
    head = jax.eval_shape(lambda h: wts_jax.quantize_w2(h, case["quantize"]), head)
  derive = {"gate_table": "with_gate_table", "joint_table": "with_joint_table",
            "joint_hidden": "with_joint_hidden"}.get(case.get("derive"))
  if derive:
    head = jax.eval_shape(getattr(wts_jax, derive), head)
  batch, steps = case.get("batch", 1), case.get("steps", 7)
  temperature = case.get("temperature", 0.0)
  impl, config = spelled(case)

  def run(head, base, first, hidden):
    return wts_jax.walk(head, base, first, hidden, temperature=temperature,
                        key=jax.random.key(0) if temperature else None,
                        return_logits=case.get("logits", False),
                        return_logprobs=case.get("logprobs", False),
                        impl=impl, config=config)

  args = (head, jax.ShapeDtypeStruct((batch, steps, head_config.vocab_size), jnp.bfloat16),
          jax.ShapeDtypeStruct((batch,), jnp.int32),
          jax.ShapeDtypeStruct((batch, steps, head_config.hidden_size), jnp.bfloat16))
  return run, args


def fingerprint(case) -> str:
  """The jaxpr of the walk and its StableHLO with the kernel payloads blanked."""
  run, args = _walk_function(case)
  with as_if_on_a_gpu():
    try:
      jaxpr = jax.make_jaxpr(run)(*args)
      hlo = jax.jit(run).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    except Exception as err:  # a refusal is part of the behaviour too
      return f"error: {type(err).__name__}: {err}\n"
  hlo = re.sub(r'backend_config = (\{[^\n]*\}|"[^"\n]*")', "backend_config = <kernel>", hlo)
  hlo = re.sub(r"mhlo\.backend_config = \{[^\n]*?\}\}", "mhlo.backend_config = <kernel>", hlo)
  text = jaxpr.pretty_print(source_info=False, name_stack=False, use_color=False)
  return f"{text}\n--- stablehlo ---\n{hlo}"


def _same(before: str, after: str) -> bool:
  # A refusal stays a refusal; its wording may change.
  return before == after or (before.startswith("error:") and after.startswith("error:"))


def save(directory: pathlib.Path, names):
  directory.mkdir(parents=True, exist_ok=True)
  for name in names:
    (directory / f"{name}.txt").write_text(fingerprint(CASES[name]))
    print(f"saved {name}", flush=True)


def compare(directory: pathlib.Path, names) -> int:
  changed = 0
  for name in names:
    before_path = directory / f"{name}.txt"
    if not before_path.exists():
      print(f"new      {name}")
      continue
    same = _same(before_path.read_text(), fingerprint(CASES[name]))
    if same and name in EXPECTED_CHANGES:
      print(f"SAME?    {name}: expected a change ({EXPECTED_CHANGES[name]})")
      changed += 1
    elif same:
      print(f"same     {name}")
    elif name in EXPECTED_CHANGES:
      print(f"changed  {name} (expected: {EXPECTED_CHANGES[name]})")
    else:
      print(f"CHANGED  {name}")
      changed += 1
  return 1 if changed else 0


def against(revision: str, names) -> int:
  root = pathlib.Path(__file__).resolve().parent.parent
  with tempfile.TemporaryDirectory() as scratch:
    tree, out = pathlib.Path(scratch) / "tree", pathlib.Path(scratch) / "before"
    subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree),
                    revision], check=True, capture_output=True)
    try:
      env = dict(os.environ, PYTHONPATH=str(tree))
      subprocess.run([sys.executable, __file__, "--save", str(out), *names], check=True,
                     env=env, cwd=tree, stdout=subprocess.DEVNULL)
    finally:
      subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                     check=True)
    return compare(out, names)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  action = parser.add_mutually_exclusive_group(required=True)
  action.add_argument("--save", type=pathlib.Path, metavar="DIR")
  action.add_argument("--compare", type=pathlib.Path, metavar="DIR")
  action.add_argument("--against", metavar="REV")
  parser.add_argument("cases", nargs="*", help="case names (default: all)")
  args = parser.parse_args(argv)
  unknown = [name for name in args.cases if name not in CASES]
  if unknown:
    parser.error(f"unknown case(s) {unknown}; known: {sorted(CASES)}")
  names = args.cases or list(CASES)
  if args.save:
    save(args.save, names)
    return 0
  if args.compare:
    return compare(args.compare, names)
  return against(args.against, names)


if __name__ == "__main__":
  sys.exit(main())
