"""Compile a JAX program for an H200 on a machine without a GPU, and count what it moves.

Needs the CUDA plugin beside CPU jax (``pip install "jax[cuda12]==<jax version>"``); no
GPU is needed to compile. XLA compiles for the device described in
``h200_device.txtpb`` (132 SMs, 4.8 TB/s, 50 MB L2, sm_90a), so the optimized HLO — its
fusions, copies, library calls and kernels — is the one an H200 would run.

The byte model is per top-level operation of a computation: operand bytes read plus
result bytes written, with four corrections that follow what the GPU does:
- a dynamic-slice or gather, or a fusion of them, reads only what it writes (the
  slices, the rows taken);
- a dynamic-update-slice or scatter fusion works in place: it moves its update only;
- the cache-attention kernel (a Triton custom call whose two largest operands are a
  layer's ``[B, Kv, S, h]`` keys and values) stops each row at its length: those two
  count at ``cache_fraction`` of their size;
- bitcasts, tuples, parameters, constants and control ops move nothing.
It finds copies that should not exist (a weight sliced out before use, a cache
transposed each layer); the time still comes from the GPU.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1,
                "u8": 1, "s16": 2, "u16": 2, "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1,
                "f8e5m2": 1}
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^(ROOT )?%(\S+) = (.+?) ([a-z\-]+)\((.*)$")
_FREE = ("bitcast", "get-tuple-element", "tuple", "parameter", "fusion-done", "constant",
         "copy-done", "after-all", "while", "conditional", "call", "async-done",
         "partition-id", "replica-id", "opt-barrier")


def cuda_available() -> bool:
  """Whether jax has its CUDA plugin here (compiling for the H200 needs it)."""
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")   # no GPU to check
  try:
    import jax_plugins.xla_cuda12  # noqa: F401
  except ImportError:
    return False
  return True


_TOPOLOGY = None


def h200_sharding():
  """A SingleDeviceSharding on a compile-only H200."""
  global _TOPOLOGY
  from jax.experimental import topologies
  from jax.sharding import SingleDeviceSharding
  if _TOPOLOGY is None:
    _TOPOLOGY = topologies.get_topology_desc(
        platform="cuda", topology_name="h200", topology="1x1x1",
        target_config=(_HERE / "h200_device.txtpb").read_text())
  return SingleDeviceSharding(_TOPOLOGY.devices[0])


def abstract(tree, sharding):
  """``tree``'s arrays as ShapeDtypeStructs on ``sharding`` (nothing allocated)."""
  import jax
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      tree)


def compile_hlo(jitted, *abstract_args) -> str:
  """The optimized HLO text of ``jitted`` compiled for the H200. Pallas Triton kernels
  read the target GPU from the default device, so it is the H200 while tracing."""
  import jax
  device = next(iter(h200_sharding().device_set))
  with jax.default_device(device):
    return jitted.trace(*abstract_args).lower().compile().as_text()


def _bytes(text: str) -> int:
  total = 0
  for dtype, dims in _SHAPE.findall(text):
    count = 1
    for dim in filter(None, dims.split(",")):
      count *= int(dim)
    total += count * _DTYPE_BYTES[dtype]
  return total


def computations(hlo_text: str) -> dict[str, list[str]]:
  """Each computation's instruction lines, by name (the entry's name starts ``main``)."""
  found, current = {}, None
  for line in hlo_text.splitlines():
    match = re.match(r"^(ENTRY )?%(\S+) ", line)
    if match and line.rstrip().endswith("{"):
      current = match.group(2)
      found[current] = []
    elif line.startswith("}"):
      current = None
    elif current:
      found[current].append(line.strip())
  return found


def _called_roots(found: dict[str, list[str]]) -> dict[str, str]:
  """The opcode of each computation's ROOT (what a fusion calling it finally does)."""
  roots = {}
  for name, lines in found.items():
    for line in lines:
      match = _INSTRUCTION.match(line)
      if match and match.group(1):
        roots[name] = match.group(4)
  return roots


def traffic(found: dict[str, list[str]], name: str, *, cache_fraction: float = 1.0
            ) -> list[dict]:
  """One computation's operations: name, op, called computation, bytes read / written."""
  roots = _called_roots(found)
  shapes, rows = {}, []
  for line in found[name]:
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    op_name, out, op, rest = match.group(2), match.group(3), match.group(4), match.group(5)
    operands = re.findall(r"%([\w\.\-]+)", rest.split(")", 1)[0])
    called = re.search(r"calls=%([\w\.\-]+)", line)
    called = called.group(1) if called else ""
    if op == "fusion-start":   # ((operands), results, context): what it writes is results
      started = re.match(r"\(\((.*?)\), (.*), u32\[\]\)", out)
      out = started.group(2) if started else out
    shapes[op_name] = out
    if op in _FREE:
      continue
    written = _bytes(out)
    inner = " ".join(found.get(called, ()))
    root = roots.get(called, "")
    operand_bytes = [_bytes(shapes.get(o, "")) for o in operands]
    if root in ("dynamic-update-slice", "scatter") or op in ("dynamic-update-slice",
                                                             "scatter"):
      update = sorted(operand_bytes)[-2] if len(operand_bytes) > 1 else 0
      read = written = update
    elif root in ("dynamic-slice", "gather") or op in ("dynamic-slice", "gather"):
      read = written
    elif (" gather(" in inner or " dynamic-slice(" in inner) and "dot(" not in inner:
      # arrays sliced or gathered from give only the slices or rows taken
      read = written
    elif op == "custom-call" and "triton" in line:
      # the cache-attention kernel: its two largest operands are a layer's keys and
      # values, read up to each row's length
      caches = sorted(operand_bytes)[-2:]
      read = sum(operand_bytes) - sum(caches) + cache_fraction * sum(caches)
      if "output_to_operand_aliasing" in line:
        # the fused q/k/v attention kernel updates those caches in place: it writes
        # only the new tokens' rows (counted with the kernel's other outputs as nil)
        written -= sum(caches)
    else:
      read = sum(operand_bytes)
    rows.append(dict(name=op_name, op=op, calls=called, read=int(read), written=int(written),
                     output=out))
  return rows


def entry_name(found: dict[str, list[str]]) -> str:
  return next(name for name in found if name.startswith("main"))


_NESTED = re.compile(r"(?:body|condition|true_computation|false_computation|to_apply)="
                     r"%([\w\.\-]+)|branch_computations=\{([^}]*)\}")


def top_level(found: dict[str, list[str]]) -> dict[str, int]:
  """The entry computation and the control-flow bodies it runs (while bodies and
  conditions, conditional branches, called computations) — the computations whose
  operations are kernels or library calls, not the insides of a fusion — each with how
  many times one run of the program runs it (a while loop's known trip count; 1 when
  the count is not known)."""
  times: dict[str, int] = {}
  queue = [(entry_name(found), 1)]
  while queue:
    name, count = queue.pop()
    if name in times or name not in found:
      continue
    times[name] = count
    for line in found[name]:
      if " fusion(" in line or "fusion-start(" in line or (
          "to_apply=" in line and " call(" not in line):   # a reduction's scalar lambda
        continue
      trips = re.search(r'known_trip_count":\{"n":"(\d+)"', line)
      inner = count * (int(trips.group(1)) if trips else 1)
      for single, several in _NESTED.findall(line):
        queue.extend((callee, inner) for callee in
                     ([single] if single else re.findall(r"%([\w\.\-]+)", several)))
  return times


def summary(hlo_text: str, *, cache_fraction: float = 1.0,
            weight_shapes: set[str] = frozenset(),
            cache_shapes: set[str] = frozenset()) -> dict:
  """Bytes the program's kernels and library calls move (a loop's body as many times as
  its known trip count):
  in all, by kind of operation, and the bytes
  written by operations other than a library call or a GEMM kernel that produce an
  array like a weight (``weight_shapes``, HLO shape strings such as
  ``bf16[9728,2560]``; ``_weight_like``): a weight copied, converted or concatenated
  before use; and the bytes written by copies of a cache layer (``cache_shapes``): a
  cache that could not be written in place."""
  found = computations(hlo_text)
  rows = [{**row, "read": row["read"] * times, "written": row["written"] * times}
          for name, times in top_level(found).items()
          for row in traffic(found, name, cache_fraction=cache_fraction)]
  by_kind: dict[str, int] = {}
  for row in rows:
    kind = row["op"] if row["op"] != "fusion" else re.sub(r"[\._]\d+.*$", "",
                                                           row["calls"] or "fusion")
    by_kind[kind] = by_kind.get(kind, 0) + row["read"] + row["written"]
  weight_like = _weight_like(weight_shapes)
  copies = sum(row["written"] for row in rows
               if row["op"] not in ("custom-call",) and not row["calls"].startswith("gemm")
               and _SHAPE.search(row["output"])
               and weight_like(_shape_text(row["output"])))
  cache_copies = sum(row["written"] for row in rows
                     if row["op"] == "copy" and _SHAPE.search(row["output"])
                     and _shape_text(row["output"]) in cache_shapes)
  return dict(moved_bytes=sum(r["read"] + r["written"] for r in rows),
              read_bytes=sum(r["read"] for r in rows),
              written_bytes=sum(r["written"] for r in rows),
              operations=len(rows),
              weight_copy_bytes=int(copies),
              cache_copy_bytes=int(cache_copies),
              by_kind=dict(sorted(by_kind.items(), key=lambda kv: -kv[1])))


def _dims(shape_text: str) -> list[int]:
  return [int(d) for d in _SHAPE.search(shape_text).group(2).split(",") if d]


def _weight_like(weight_shapes):
  """A test of whether an output (HLO shape string) is a weight's copy: a weight's shape,
  or (leading 1s dropped) a matrix with a weight's input dimension and at least as many
  rows as the smallest weight: a weight converted to another dtype, or weights
  concatenated along their outputs (XLA's merged products read that way)."""
  matrices = [w[-2:] for w in map(_dims, weight_shapes) if len(w) >= 2 and min(w[-2:]) > 1]
  inputs = {w[1] for w in matrices}
  fewest_rows = min((w[0] for w in matrices), default=None)

  def test(shape_text: str) -> bool:
    if shape_text in weight_shapes:
      return True
    if fewest_rows is None:
      return False
    dims = _dims(shape_text)
    while len(dims) > 2 and dims[0] == 1:
      dims = dims[1:]
    return len(dims) == 2 and dims[1] in inputs and dims[0] >= fewest_rows
  return test


def _shape_text(out: str) -> str:
  match = _SHAPE.search(out)
  return f"{match.group(1)}[{match.group(2)}]"


def hlo_shape(dtype, shape) -> str:
  """``bf16[9728,2560]`` for a numpy/jax dtype and a shape."""
  import numpy as np
  names = {"bfloat16": "bf16", "float32": "f32", "float16": "f16", "int8": "s8",
           "int32": "s32"}
  return f"{names.get(np.dtype(dtype).name, np.dtype(dtype).name)}[{','.join(map(str, shape))}]"
