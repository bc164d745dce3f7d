"""Compile the vocabulary-sharded walk for several H200s on a machine without a GPU.

Needs jax's CUDA plugin (``hlo_traffic``); no GPU. XLA compiles for N compile-only H200s
on one host (the device of ``h200_device.txtpb``, topology ``1x1xN``), so what it shows
is what N GPUs would run:

- the step-wise sharded walk (``impl="xla"``): the collectives a walk runs (one packed
  ``all_gather`` a step, nothing V-sized) and the bytes each device's program moves
  (``hlo_traffic``'s model; a loop body counted once);
- the in-kernel device exchange (``wts_jax.sharded.device_exchange_mgpu``): the probe
  kernel lowered and compiled for N GPUs (XLA's collective-metadata path: remote refs
  and semaphores, no NVLink multicast), and its inline PTX assembled by ``ptxas``.
  The Mosaic module itself is compiled to a cubin when the executable is loaded on the
  GPUs: that step, and every timing, needs the GPUs.

  python tools/lower_sharded_for_gpu.py [--devices 2]
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import hlo_traffic  # noqa: E402

_HERE = Path(__file__).resolve().parent
_COLLECTIVE = re.compile(r"= (\S+) (all-gather|all-reduce|all-to-all|collective-permute|"
                         r"reduce-scatter)(-start)?\(")


def h200_mesh(devices: int, axis: str = "tensor"):
  """A mesh of ``devices`` compile-only H200s on one host, along ``axis``."""
  import jax
  import numpy as np
  from jax.experimental import topologies
  topology = topologies.get_topology_desc(
      platform="cuda", topology_name="h200", topology=f"1x1x{devices}",
      target_config=(_HERE / "h200_device.txtpb").read_text())
  return jax.sharding.Mesh(np.array(topology.devices), (axis,),
                           axis_types=(jax.sharding.AxisType.Explicit,))


def compile_sharded_walk(devices: int = 2, head_type: str = "vanilla", batch: int = 16,
                         steps: int = 7, *, split_w1: bool = False,
                         temperature: float = 0.0, model: str = "qwen3_4b") -> str:
  """The optimized HLO of the sharded XLA walk at a Qwen3 DSpark shape, W2 (and W1
  when ``split_w1``) split along V over ``devices`` H200s."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  import wts_jax
  from wts_jax.heads import HeadConfig
  from wts_jax.sharded.local_walk import ShardLayout
  from wts_jax.sharded.placement import leaf_specs
  mesh = h200_mesh(devices)
  config = HeadConfig.qwen3_dspark(model, head_type)
  head = jax.eval_shape(lambda: wts_jax.make_head(config))
  leaves, treedef = jax.tree.flatten(head)
  layout = ShardLayout("tensor", None, config.vocab_size, split_w1)
  head = jax.tree.unflatten(treedef, [
      jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))
      for leaf, spec in zip(leaves, leaf_specs(head, layout))])
  whole = NamedSharding(mesh, P())
  base = jax.ShapeDtypeStruct((batch, steps, config.vocab_size), jnp.bfloat16,
                              sharding=NamedSharding(mesh, P(None, None, "tensor")))
  first = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=whole)
  hidden = (jax.ShapeDtypeStruct((batch, steps, config.hidden_size), jnp.bfloat16,
                                 sharding=whole) if config.needs_hidden else None)

  def run(head, base, first, hidden):
    key = jax.random.key(0) if temperature else None
    return wts_jax.walk(head, base, first, hidden, temperature=temperature, key=key).tokens

  return jax.jit(run).trace(head, base, first, hidden).lower().compile().as_text()


def lower_exchange_probe(devices: int = 2, steps: int = 7, blocks: int = 132):
  """The exchange probe's jitted ``shard_map`` lowered for ``devices`` H200s (the
  ``Lowered``: ``.as_text()`` its StableHLO, ``.compile()`` XLA's executable)."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P
  from wts_jax.sharded.device_exchange_mgpu import ROWS, exchange_probe
  mesh = h200_mesh(devices)
  split = NamedSharding(mesh, P("tensor"))
  scores = jax.ShapeDtypeStruct((devices * steps, blocks, ROWS), jnp.float32, sharding=split)
  indices = jax.ShapeDtypeStruct((devices * steps, blocks, ROWS), jnp.int32, sharding=split)
  first = jax.ShapeDtypeStruct((ROWS,), jnp.int32, sharding=NamedSharding(mesh, P()))
  probe = jax.shard_map(functools.partial(exchange_probe, axis_name="tensor"), mesh=mesh,
                        in_specs=(P("tensor"), P("tensor"), P()),
                        out_specs=(P(), P("tensor")), check_vma=False)
  return jax.jit(probe).trace(scores, indices, first).lower()


def probe_asm_check(devices: int = 2) -> tuple[int, list[str]]:
  """(how many inline-PTX blocks the probe's lowering builds were assembled, ``ptxas``'s
  errors: empty when every one assembles for sm_90a)."""
  from jax._src.lib.mlir.dialects import llvm
  import inline_ptx_check
  ptxas = shutil.which("ptxas")
  if ptxas is None:
    raise FileNotFoundError("ptxas is not on PATH")
  seen, original = {}, llvm.inline_asm

  def capture(result, operands, asm, constraints, *args, **kwargs):
    seen[(asm, constraints)] = True
    return original(result, operands, asm, constraints, *args, **kwargs)

  llvm.inline_asm = capture
  try:
    lower_exchange_probe(devices)
  finally:
    llvm.inline_asm = original
  failures, assembled = [], 0
  with tempfile.TemporaryDirectory() as directory:
    for number, (asm, constraints) in enumerate(seen):
      module = inline_ptx_check.ptx_module(asm, constraints, number)
      if module is None:
        continue
      assembled += 1
      path = Path(directory) / f"asm{number}.ptx"
      path.write_text(module)
      run = subprocess.run([ptxas, "-arch=sm_90a", str(path), "-o", f"{path}.cubin"],
                           capture_output=True, text=True)
      if run.returncode:
        failures.append(f"{run.stderr.strip()}\n--- the asm:\n{asm}")
  return assembled, failures


def collectives(hlo_text: str) -> list[tuple[str, str]]:
  """(op, result type) of each collective in an optimized HLO text."""
  return [(match.group(2), match.group(1)) for match in map(_COLLECTIVE.search,
                                                             hlo_text.splitlines())
          if match]


def walk_record(devices: int, head_type: str, batch: int, split_w1: bool) -> dict:
  text = compile_sharded_walk(devices, head_type, batch, split_w1=split_w1)
  moved = hlo_traffic.summary(text)
  return {"devices": devices, "head": head_type, "batch": batch, "split_w1": split_w1,
          "collectives": collectives(text),
          "bytes_moved_per_device_step": moved["moved_bytes"],
          "by_kind": moved["by_kind"]}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--devices", type=int, default=2)
  args = parser.parse_args(argv)
  if not hlo_traffic.cuda_available():
    print("error: compiling for the H200 needs jax[cuda12] (the CUDA plugin)",
          file=sys.stderr)
    return 2
  for head_type, batch, split_w1 in (("vanilla", 1, False), ("vanilla", 64, True),
                                     ("gated", 16, False), ("rnn", 16, False)):
    print(json.dumps(walk_record(args.devices, head_type, batch, split_w1)))
  lowered = lower_exchange_probe(args.devices)
  text = lowered.as_text()
  compiled = lowered.compile().as_text()
  print(json.dumps({"exchange_probe": "lowered and compiled",
                    "collective_metadata": "uses_xla_collective_metadata = true" in compiled,
                    "multicast": "multimem" in text}))
  assembled, failures = probe_asm_check(args.devices)
  for failure in failures:
    print(failure, file=sys.stderr)
  print(f"{len(failures)} of the probe's {assembled} inline-asm blocks failed to assemble")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
