"""Assemble the stacked walk's inline PTX with ptxas on a machine without a GPU.

Lowering a Mosaic GPU kernel on the CPU builds its MLIR, inline assembly included, but
nothing reads the PTX inside the ``llvm.inline_asm`` ops until the GPU compiles the
kernel: a typo there costs a device call. This lowers the kernel (Qwen3-4B shape, the
options given), captures every inline-asm string it builds, and assembles each alone
with ``ptxas -arch=sm_90a`` (operands as registers of their constraint's type, inputs
zeroed; Mosaic's own asm with immediate operands is skipped).

  python tools/inline_ptx_check.py    # exit 1 and the ptxas errors if any fails
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (batch, StackedSpec options; "plan": plan_stacked's; "lab": StackedLab's): between
# them every inline-asm form the kernel has.
BUILDS = ((16, {}), (64, dict(w1_order="fragments")),
          (16, dict(greedy=False)),
          (64, dict(lab=dict(prefetch_base=True), plan=dict(base_slots=2))),
          (16, dict(greedy=False, plan=dict(base_slots=2))),
          (40, dict(plan=dict(base_slots=3))),
          (40, dict(plan=dict(base_slots=2, base_copies="tma"))),
          (16, dict(greedy=False, rotate_warps=True, skip_idle_warps=True,
                    plan=dict(base_slots=2, base_copies="tma"))),
          (64, dict(status="kernel", plan=dict(base_slots=2, base_copies="tma"))),
          (16, dict(w2_order="thread_rows", rotate_warps=True, skip_idle_warps=True,
                    greedy=False, plan=dict(base_slots=2))),
          (16, dict(w2_order="thread_rows", lab=dict(base_vector_reads=True),
                    plan=dict(base_slots=2))),
          (64, dict(w2_order="thread_rows", plan=dict(base_slots=2, base_copies="tma"))))
_TYPES = {"r": ".b32", "l": ".b64", "f": ".f32", "h": ".b16"}


def captured_asm(builds=BUILDS) -> dict[tuple[str, str], int]:
  """Every distinct (asm, constraints) the builds' lowering makes, with its count."""
  import jax
  import jax.numpy as jnp
  from jax._src.lib.mlir.dialects import llvm
  from lower_for_gpu import cuda_target
  from wts_jax.pallas.stacked.launch import stacked_walk
  from wts_jax.pallas.stacked.plan import plan_stacked
  from wts_jax.pallas.stacked.spec import StackedLab, StackedSpec

  seen: dict[tuple[str, str], int] = {}
  original = llvm.inline_asm

  def capture(result, operands, asm, constraints, *args, **kwargs):
    seen[(asm, constraints)] = seen.get((asm, constraints), 0) + 1
    return original(result, operands, asm, constraints, *args, **kwargs)

  vocab, rank = 151936, 256
  llvm.inline_asm = capture
  try:
    for batch, options in builds:
      options = dict(options)
      plan = plan_stacked(vocab_size=vocab, rank=rank, batch=batch, num_blocks=132,
                          smem_per_block=232448, **options.pop("plan", {}))
      spec = StackedSpec(plan, batch, 7, lab=StackedLab(**options.pop("lab", {})),
                         **options)
      shapes = (((vocab, rank), jnp.int8), ((batch, 7, vocab), jnp.bfloat16),
                ((2 * vocab, rank), jnp.int8), ((batch,), jnp.int32),
                ((vocab,), jnp.float32), ((vocab,), jnp.float32))
      args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
      sampling = None if spec.greedy else (
          jax.ShapeDtypeStruct((batch,), jnp.float32), jax.ShapeDtypeStruct((batch,), bool),
          jax.ShapeDtypeStruct((2,), jnp.uint32))
      with cuda_target():
        jax.jit(lambda *a, spec=spec: stacked_walk(spec, *a[:6], sampling=a[6] or None)
                ).trace(*args, sampling).lower(lowering_platforms=("cuda",))
  finally:
    llvm.inline_asm = original
  return seen


def ptx_module(asm: str, constraints: str, number: int) -> str | None:
  """A one-kernel PTX module running ``asm`` on declared registers, or None where an
  operand is not a register (Mosaic's own asm with immediates)."""
  parts = [c for c in constraints.split(",") if c]
  kinds = [c.lstrip("=") for c in parts]
  if any(not (k.isdigit() or k in _TYPES) for k in kinds):
    return None
  names, lines = [], []
  for i, kind in enumerate(kinds):
    if kind.isdigit():   # tied to an output: its register
      names.append(names[int(kind)])
      continue
    names.append(f"op{i}")
    lines.append(f".reg {_TYPES[kind]} op{i};")
    if not parts[i].startswith("="):
      lines.append(f"mov{_TYPES[kind]} op{i}, {'0f00000000' if kind == 'f' else 0};")
  body = re.sub(r"\$(\d+)", lambda m: names[int(m.group(1))],
                asm.replace("${:uid}", str(number)))
  return (".version 8.5\n.target sm_90a\n.address_size 64\n.visible .entry k() {\n"
          + "\n".join(lines) + "\n" + body + "\nret;\n}\n")


def check(builds=BUILDS) -> list[str]:
  """ptxas's errors, one string a failing asm (empty: every one assembles)."""
  ptxas = shutil.which("ptxas")
  if ptxas is None:
    raise FileNotFoundError("ptxas is not on PATH")
  failures = []
  with tempfile.TemporaryDirectory() as directory:
    for number, (asm, constraints) in enumerate(captured_asm(builds)):
      module = ptx_module(asm, constraints, number)
      if module is None:
        continue
      path = Path(directory) / f"asm{number}.ptx"
      path.write_text(module)
      run = subprocess.run([ptxas, "-arch=sm_90a", str(path), "-o", str(path) + ".cubin"],
                           capture_output=True, text=True)
      if run.returncode:
        failures.append(f"{run.stderr.strip()}\n--- the asm:\n{asm}")
  return failures


def main() -> int:
  failures = check()
  for failure in failures:
    print(failure, end="\n\n")
  print(f"{len(failures)} inline-asm blocks failed to assemble")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
