"""What the decode loop's attention kernel lowers to on an H200, read on a CPU machine.

  python tools/kernel_resources.py --batches 16,64 --launches 64x4x3,32x4x3

Compiles ``qkv_attention.fused`` (the layer's attention the loop runs on a GPU) for the
H200 described in ``h200_device.txtpb`` (``hlo_traffic``: needs jax's CUDA plugin, no
GPU) at each batch and launch (KEYSxWARPSxSTAGES; none: the kernel's own choice), with
XLA's dump of the PTX it emits, then reads for each Pallas kernel of the program:
- its grid, threads and shared memory (XLA's thunk sequence: what the launch asks for);
- its registers a thread (``ptxas -v`` on that PTX: the CUDA plugin's ptxas);
- the programs an SM holds (the least of what registers, shared memory, threads and
  blocks allow) and the waves its grid takes over the H200's 132 SMs;
- a census of its PTX: tensor-core products, barriers, asynchronous copies, global loads
  by width.
A launch is chosen by measurement (``tools/attention_bench.py`` on a GPU); this says
beforehand which launches can hold more programs an SM, and what a change to the kernel
removed. Prints one JSON object a kernel and point.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# An H200 SM (compute capability 9.0): what occupancy is counted against.
SMS = 132
SM_REGISTERS = 65536
SM_SHARED_BYTES = 233472          # 228 KB, of which a block reserves 1 KB more
BLOCK_RESERVED_SHARED = 1024
SM_THREADS = 2048
SM_BLOCKS = 32
REGISTER_UNIT = 256               # registers are allotted a warp at a time, in 256s

_THUNK = re.compile(r"kCustomKernel .*?\] (\S+) grid: \[(\d+), (\d+), (\d+)\] threads: "
                    r"\[(\d+), (\d+), (\d+)\]\s+shared_memory: (\d+) bytes")
_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
_CENSUS = {
    "tensor_core": r"\b(?:mma|wgmma)\.",
    "barriers": r"\bbar\.sync\b|\bbarrier\.sync\b",
    "async_copies": r"\bcp\.async\.(?:cg|ca)\b",
    "global_loads_scalar": r"\bld\.global(?:\.[a-z]+)*\.b(?:8|16|32|64)\b",
    "global_loads_vector": r"\bld\.global(?:\.[a-z]+)*\.v[24]\.",
}


def programs_per_sm(registers: int, threads: int, shared_bytes: int) -> dict:
  """The programs (thread blocks) an H200 SM holds at once, by each limit and in all."""
  warps = -(-threads // 32)
  per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
  limits = {
      "by_registers": SM_REGISTERS // (per_warp * warps) if registers else SM_BLOCKS,
      "by_shared_memory": SM_SHARED_BYTES // (shared_bytes + BLOCK_RESERVED_SHARED),
      "by_threads": SM_THREADS // (warps * 32),
      "by_blocks": SM_BLOCKS,
  }
  return {**limits, "programs": min(limits.values())}


def thunk_kernels(text: str) -> dict[str, dict]:
  """{kernel name: grid, threads, shared memory} from XLA's thunk sequence dump."""
  found = {}
  for name, *sizes in _THUNK.findall(text):
    grid, threads, shared = [int(s) for s in sizes[:3]], [int(s) for s in sizes[3:6]], sizes[6]
    found[name] = dict(grid=grid, threads=threads[0] * threads[1] * threads[2],
                       shared_memory_bytes=int(shared))
  return found


def ptxas_registers(report: str) -> dict[str, int]:
  """{entry function: registers a thread} from ``ptxas -v``'s report."""
  found, entry = {}, None
  for line in report.splitlines():
    match = _PTXAS_ENTRY.search(line)
    if match:
      entry = match.group(1)
    match = _PTXAS_REGISTERS.search(line)
    if match and entry is not None:
      found[entry] = int(match.group(1))
  return found


def ptx_census(ptx: str, entry: str) -> dict[str, int]:
  """Instruction counts of one entry function's body in a PTX module."""
  start = ptx.find(f".entry {entry}(")
  if start < 0:
    return {}
  end = ptx.find(".entry ", start + 1)
  body = ptx[start:end if end > 0 else len(ptx)]
  return {name: len(re.findall(pattern, body)) for name, pattern in _CENSUS.items()}


def ptxas() -> str | None:
  """The ptxas of jax's CUDA plugin (its nvcc wheel), else one on the PATH."""
  try:
    import nvidia.cuda_nvcc
    found = Path(list(nvidia.cuda_nvcc.__path__)[0]) / "bin" / "ptxas"
    if found.exists():
      return str(found)
  except ImportError:
    pass
  return shutil.which("ptxas")


def kernel_records(dump: Path, ptxas_path: str) -> list[dict]:
  """One record a Pallas kernel (``wts_…``) of the program XLA dumped into ``dump``."""
  kernels = {}
  for path in dump.glob("*thunk_sequence.txt"):
    kernels.update(thunk_kernels(path.read_text()))
  records = []
  for path in dump.glob("*.ptx"):
    ptx = path.read_text()
    ours = [name for name in kernels if name.startswith("wts_") and f".entry {name}(" in ptx]
    if not ours:
      continue
    report = subprocess.run([ptxas_path, "-arch=sm_90a", "-v", str(path), "-o", os.devnull],
                            capture_output=True, text=True, check=True).stderr
    registers = ptxas_registers(report)
    for name in ours:
      launch = kernels[name]
      occupancy = programs_per_sm(registers.get(name, 0), launch["threads"],
                                  launch["shared_memory_bytes"])
      programs = launch["grid"][0] * launch["grid"][1] * launch["grid"][2]
      records.append(dict(kernel=name, **launch, registers=registers.get(name),
                          programs_per_sm=occupancy, waves=programs / (SMS * occupancy["programs"]),
                          ptx=ptx_census(ptx, name)))
  return records


def compile_point(batch: int, steps: int, context: int, launch, *, heads: int,
                  kv_heads: int, head_dim: int) -> None:
  """Compile the fused attention for the H200 at one point (XLA dumps as it compiles)."""
  import jax
  import jax.numpy as jnp
  import hlo_traffic
  from wts_jax.specdecode import attention, qkv_attention
  sharding = hlo_traffic.h200_sharding()
  width = attention.padded_cache_len(context + steps)

  def spec(shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

  def attend(products, cos, sin, q_norm, k_norm, keys, values, start):
    return qkv_attention.fused(products, cos, sin, q_norm, k_norm, keys, values, start,
                               num_heads=heads, eps=1e-6, causal=True, launch_as=launch)
  table = spec((batch, steps, head_dim), jnp.float32)
  cache = spec((batch, kv_heads, width, head_dim))
  hlo_traffic.compile_hlo(jax.jit(attend, donate_argnums=(5, 6)),
                          spec((batch, steps, (heads + 2 * kv_heads) * head_dim)), table,
                          table, spec((head_dim,)), spec((head_dim,)), cache, cache,
                          spec((batch,), jnp.int32))


def main(argv=None, dump: Path | None = None) -> int:
  """The tool; ``dump``: the folder XLA was told to dump into before jax started (XLA
  reads its flags once), as the script's entry point arranges."""
  parser = argparse.ArgumentParser(prog="kernel_resources", description=__doc__.split("\n")[0])
  parser.add_argument("--batches", default="1,16,64")
  parser.add_argument("--steps", type=int, default=8, help="new tokens a row (default 8)")
  parser.add_argument("--context", type=int, default=512, help="cached positions (default 512)")
  parser.add_argument("--shape", default="32,8,128", help="query heads, kv heads, head dim")
  parser.add_argument("--launches", default="",
                      help="KEYSxWARPSxSTAGES items (default: the kernel's own choice)")
  args = parser.parse_args(argv)
  import hlo_traffic
  from attention_bench import parse_launches
  try:
    batches = [int(b) for b in args.batches.split(",")]
    heads, kv_heads, head_dim = (int(x) for x in args.shape.split(","))
  except ValueError:
    print(f"error: --batches {args.batches!r} and --shape {args.shape!r} must be "
          "comma-separated integers", file=sys.stderr)
    return 2
  launches = parse_launches(args.launches)
  if launches is None:
    print(f"error: --launches {args.launches!r}: each KEYSxWARPSxSTAGES", file=sys.stderr)
    return 2
  if dump is None:
    print("error: run as a script (XLA must be told where to dump before jax starts)",
          file=sys.stderr)
    return 2
  if not hlo_traffic.cuda_available() or ptxas() is None:
    print("error: compiling for the H200 needs jax's CUDA plugin and its ptxas "
          '(pip install "jax[cuda12]")', file=sys.stderr)
    return 2
  for batch in batches:
    for launch in launches or [None]:
      for path in dump.glob("*"):
        path.unlink()
      point = dict(batch=batch, steps=args.steps, context=args.context,
                   launch=None if launch is None else list(launch))
      try:
        compile_point(batch, args.steps, args.context, launch, heads=heads,
                      kv_heads=kv_heads, head_dim=head_dim)
      except ValueError as error:   # a launch whose key block does not divide a split
        print(json.dumps(dict(point, skipped=str(error))), flush=True)
        continue
      for record in kernel_records(dump, ptxas()):
        print(json.dumps(dict(point, **record)), flush=True)
  return 0


if __name__ == "__main__":
  with tempfile.TemporaryDirectory(prefix="kernel_resources_") as folder:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={folder}"
                               " --xla_dump_emitter_re=.* --xla_gpu_dump_llvmir=true")
    sys.exit(main(dump=Path(folder)))
