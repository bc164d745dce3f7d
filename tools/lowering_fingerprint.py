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
  python tools/lowering_fingerprint.py --spellings         # new API == old API, here

``--against`` checks REV out in a temporary git worktree and runs this same script
there (the cases use only the public API both sides share: ``walk``, ``WalkConfig``,
``make_head``, ``quantize_w2``). ``--spellings`` checks, in this tree, that each
backend-specific spelling (``impl="mosaic"``, ``MosaicConfig``…) lowers exactly as the
``WalkConfig`` spelling it replaces.
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

# Old spelling: impl="pallas" with WalkConfig(**config). The rank-192 auto case is the
# intended change of the backend seam (Mosaic instead of XLA), listed in EXPECTED_CHANGES.
CASES = {
    # Mosaic, asked for by name, at the Qwen3 shape.
    **{f"mosaic-{head}-b{b}-{mode}-{w2}-{gemv}": dict(
        head_type=head, batch=b, temperature=t, quantize=q,
        config=dict(backend="mosaic", mosaic_gemv=gemv))
       for head in ("vanilla",)
       for b in (1, 4) for mode, t in (("greedy", 0.0), ("sampled", 0.8))
       for w2, q in (("bf16", None), ("int8", "int8"))
       for gemv in ("auto", "registers", "wgmma")},
    **{f"mosaic-gated-b{b}-{mode}-{w2}": dict(
        head_type="gated", batch=b, temperature=t, quantize=q,
        config=dict(backend="mosaic"))
       for b in (1, 4) for mode, t in (("greedy", 0.0), ("sampled", 0.8))
       for w2, q in (("bf16", None), ("int8", "int8"))},
    "mosaic-residency-none": dict(config=dict(backend="mosaic", residency="none")),
    "mosaic-residency-half": dict(config=dict(backend="mosaic", residency=0.5)),
    "mosaic-residency-fifth": dict(config=dict(backend="mosaic", residency=0.2)),
    "mosaic-residency-rows": dict(config=dict(backend="mosaic", residency=256)),
    "mosaic-stages3": dict(config=dict(backend="mosaic", residency=0, num_stages=3)),
    "mosaic-group2": dict(config=dict(backend="mosaic", mosaic_group=2)),
    "mosaic-nosnake": dict(config=dict(backend="mosaic", mosaic_snake=False)),
    "mosaic-blocks64": dict(config=dict(backend="mosaic", num_programs=64)),
    "mosaic-spin": dict(config=dict(backend="mosaic", sync_spin_limit=1000)),
    "mosaic-rank192": dict(rank=192, config=dict(backend="mosaic")),
    # The batched kernel on either axis, every head (int8 planes for the vanilla one).
    **{f"mosaic-batched-{label}-b{b}-{axis}-{mode}": dict(
        head_type=head, batch=b, temperature=t, quantize=q,
        config=dict(backend="mosaic", mosaic_kernel="batched", mosaic_batch_axis=axis))
       for label, head, q in (("vanilla", "vanilla", None),
                              ("vanilla-int8p", "vanilla", "int8p"),
                              ("gated", "gated", None), ("rnn", "rnn", None))
       for b in (16, 70) for axis in ("m", "n")
       for mode, t in (("greedy", 0.0), ("sampled", 0.8))},
    # Triton, asked for by name.
    **{f"triton-vanilla-b{b}-{mode}": dict(batch=b, temperature=t,
                                           config=dict(backend="triton"))
       for b in (1, 4, 64) for mode, t in (("greedy", 0.0), ("sampled", 0.8))},
    "triton-vanilla-b16-logits": dict(batch=16, logits=True, logprobs=True,
                                      config=dict(backend="triton")),
    "triton-int8-b1": dict(quantize="int8", config=dict(backend="triton")),
    "triton-int8-b4-sampled": dict(quantize="int8", batch=4, temperature=1.0,
                                   config=dict(backend="triton")),
    "triton-gated-b1-split": dict(head_type="gated", temperature=0.8, logprobs=True,
                                  config=dict(backend="triton")),
    "triton-gated-b4-redundant": dict(head_type="gated", batch=4,
                                      config=dict(backend="triton",
                                                  serial_update="redundant")),
    "triton-rnn-b16-logits": dict(head_type="rnn", batch=16, logits=True,
                                  config=dict(backend="triton")),
    "triton-rnn-b1-sampled": dict(head_type="rnn", temperature=1.0,
                                  config=dict(backend="triton")),
    "triton-residency-none": dict(config=dict(backend="triton", residency="none")),
    "triton-residency-half": dict(config=dict(backend="triton", residency=0.5)),
    "triton-residency-tenth": dict(config=dict(backend="triton", residency=0.1)),
    "triton-residency-rows": dict(config=dict(backend="triton", residency=64)),
    "triton-tuned": dict(config=dict(backend="triton", tile_rows=32, num_warps=4,
                                     num_stages=2, num_programs=66)),
    "triton-rank64": dict(rank=64, quantize="int8", config=dict(backend="triton")),
    "triton-rank64-full": dict(rank=64, quantize="int8",
                               config=dict(backend="triton", residency="full")),
    # The automatic choice (impl="pallas": among the kernels; impl="auto": or XLA).
    **{f"auto-{head}-b{b}-{mode}-{w2}": dict(
        head_type=head, batch=b, temperature=t, quantize=q, config={})
       for head in ("vanilla", "gated", "rnn")
       for b in (1, 4, 16) for mode, t in (("greedy", 0.0), ("sampled", 0.8))
       for w2, q in (("bf16", None), ("int8", "int8"))},
    "auto-vanilla-b1-logits": dict(logits=True, config={}),
    "auto-vanilla-b1-fp8": dict(quantize="fp8", impl="auto", config={}),
    "auto-rank192-b1": dict(rank=192, impl="auto", config={}),
    "auto-rank128-b1": dict(rank=128, impl="auto", config={}),
    "auto-rank64-b4": dict(rank=64, batch=4, impl="auto", config={}),
    "auto-vanilla-b128": dict(batch=128, impl="auto", config={}),
    "auto-vanilla-b256": dict(batch=256, impl="auto", config={}),
    "xla-vanilla-b4": dict(batch=4, impl="xla", config=None),
    "xla-gated-b1-sampled": dict(head_type="gated", temperature=0.8, impl="xla",
                                 config=None),
}

# Cases whose launch the backend seam changes on purpose, and why.
EXPECTED_CHANGES = {
    "auto-rank192-b1": "Triton refuses rank 192 and Mosaic runs it: impl='auto' no "
                       "longer falls back to XLA",
}


def new_spellings():
  """(case name, spelling in the backend-specific API) pairs, for ``--spellings``."""
  from wts_jax import MosaicConfig, TritonConfig
  return [
      ("mosaic-vanilla-b1-greedy-bf16-auto", dict(impl="mosaic", config=MosaicConfig())),
      ("mosaic-vanilla-b4-sampled-int8-wgmma",
       dict(impl="mosaic", config=MosaicConfig(gemv="wgmma"))),
      ("mosaic-gated-b1-greedy-bf16", dict(impl="mosaic", config=None)),
      ("mosaic-residency-half", dict(impl="mosaic", config=MosaicConfig(residency=0.5))),
      ("mosaic-stages3", dict(impl="mosaic",
                              config=MosaicConfig(residency=0, ring_stages=3))),
      ("mosaic-group2", dict(impl="mosaic", config=MosaicConfig(group=2))),
      ("mosaic-nosnake", dict(impl="mosaic", config=MosaicConfig(snake=False))),
      ("mosaic-blocks64", dict(impl="mosaic", config=MosaicConfig(num_blocks=64))),
      ("mosaic-spin", dict(impl="mosaic", config=MosaicConfig(sync_spin_limit=1000))),
      ("triton-vanilla-b1-greedy", dict(impl="triton", config=None)),
      ("triton-vanilla-b4-sampled", dict(impl="triton", config=TritonConfig())),
      ("triton-gated-b4-redundant",
       dict(impl="triton", config=TritonConfig(serial_update="redundant"))),
      ("triton-residency-rows", dict(impl="triton", config=TritonConfig(residency=64))),
      ("triton-tuned", dict(impl="triton", config=TritonConfig(
          tile_rows=32, num_warps=4, num_stages=2, num_programs=66))),
      ("auto-vanilla-b1-greedy-bf16", dict(impl="auto", config=None)),
      ("auto-vanilla-b1-greedy-int8", dict(impl="auto", config=None)),
      ("auto-vanilla-b1-sampled-bf16", dict(impl="auto", config=None)),
      ("auto-gated-b4-greedy-bf16", dict(impl="auto", config=None)),
      ("auto-rnn-b16-sampled-int8", dict(impl="auto", config=None)),
  ]


@contextlib.contextmanager
def as_if_on_a_gpu():
  """Trace as on an H200: the dispatcher sees a GPU; jax >= 0.11 gets an abstract one."""
  original = jax.default_backend
  jax.default_backend = lambda: "gpu"
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


def _walk_function(case, spelling=None):
  import wts_jax
  from wts_jax.heads import HeadConfig
  head_config = HeadConfig.qwen3_4b(case.get("head_type", "vanilla"),
                                    rank=case.get("rank", 256))
  head = jax.eval_shape(lambda: wts_jax.make_head(head_config))
  if case.get("quantize") == "int8p":   # z as two int8 planes
    head = jax.eval_shape(lambda h: wts_jax.quantize_w2(h, "int8", state="planes"), head)
  elif case.get("quantize"):
    head = jax.eval_shape(lambda h: wts_jax.quantize_w2(h, case["quantize"]), head)
  batch, steps = case.get("batch", 1), case.get("steps", 7)
  temperature = case.get("temperature", 0.0)
  if spelling is None:
    impl = case.get("impl", "pallas")
    config = case["config"]
    config = None if config is None else wts_jax.WalkConfig(**config)
  else:
    impl, config = spelling["impl"], spelling["config"]

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


def fingerprint(case, spelling=None) -> str:
  """The jaxpr of the walk and its StableHLO with the kernel payloads blanked."""
  run, args = _walk_function(case, spelling)
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


def spellings() -> int:
  failures = 0
  for name, spelling in new_spellings():
    same = _same(fingerprint(CASES[name]), fingerprint(CASES[name], spelling))
    print(f"{'same' if same else 'DIFFERENT':9}{name}: {spelling}")
    failures += not same
  return 1 if failures else 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  action = parser.add_mutually_exclusive_group(required=True)
  action.add_argument("--save", type=pathlib.Path, metavar="DIR")
  action.add_argument("--compare", type=pathlib.Path, metavar="DIR")
  action.add_argument("--against", metavar="REV")
  action.add_argument("--spellings", action="store_true")
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
  if args.against:
    return against(args.against, names)
  return spellings()


if __name__ == "__main__":
  sys.exit(main())
