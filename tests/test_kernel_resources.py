"""``tools/kernel_resources.py``: the occupancy arithmetic and the readers of XLA's and
ptxas's reports everywhere; the whole tool where jax's CUDA plugin can compile for the
H200."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
import hlo_traffic  # noqa: E402
import kernel_resources  # noqa: E402


@pytest.mark.parametrize("registers, threads, shared, limits", [
    # 168 registers at 4 warps: 21 units of 256 a warp, 3 programs by registers; 76 KB of
    # shared memory (+1 KB reserved) fits twice in 228 KB.
    (168, 128, 77824, dict(by_registers=3, by_shared_memory=2, programs=2)),
    (168, 128, 43008, dict(by_registers=3, by_shared_memory=5, programs=3)),
    # 250 registers round up to 8192 a warp: two programs of four warps.
    (250, 128, 77824, dict(by_registers=2, by_shared_memory=2, programs=2)),
    (128, 256, 1024, dict(by_registers=2, by_shared_memory=114, by_threads=8, programs=2)),
    (32, 32, 0, dict(by_registers=64, by_blocks=32, programs=32)),
])
def test_programs_an_sm_holds(registers, threads, shared, limits):
  found = kernel_resources.programs_per_sm(registers, threads, shared)
  assert {key: found[key] for key in limits} == limits


def test_the_reports_are_read():
  thunks = ("001: kCustomKernel [source | sink] wts_qkv_attention grid: [64, 8, 1] "
            "threads: [128, 1, 1]  shared_memory: 77824 bytes\n"
            "002: kCustomKernel [prev=001 (1) | sink] loop_add_fusion grid: [160, 1, 1] "
            "threads: [128, 1, 1]  shared_memory: 0 bytes\n")
  assert kernel_resources.thunk_kernels(thunks) == {
      "wts_qkv_attention": dict(grid=[64, 8, 1], threads=128, shared_memory_bytes=77824),
      "loop_add_fusion": dict(grid=[160, 1, 1], threads=128, shared_memory_bytes=0)}
  report = ("ptxas info    : Compiling entry function 'wts_a' for 'sm_90a'\n"
            "ptxas info    : Used 168 registers, used 1 barriers\n"
            "ptxas info    : Compiling entry function 'wts_b' for 'sm_90a'\n"
            "ptxas info    : Used 56 registers\n")
  assert kernel_resources.ptxas_registers(report) == {"wts_a": 168, "wts_b": 56}
  ptx = (".visible .entry wts_a(\n mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 x;\n"
         " bar.sync 0;\n bar.sync 0;\n cp.async.cg.shared.global [a], [b], 16;\n"
         " ld.global.b16 r, [p];\n ld.global.v4.b32 {a,b,c,d}, [p];\n}\n"
         ".visible .entry wts_b(\n bar.sync 0;\n}\n")
  assert kernel_resources.ptx_census(ptx, "wts_a") == dict(
      tensor_core=1, barriers=2, async_copies=1, global_loads_scalar=1,
      global_loads_vector=1)
  assert kernel_resources.ptx_census(ptx, "wts_b")["barriers"] == 1
  assert kernel_resources.ptx_census(ptx, "wts_c") == {}


def test_bad_input_is_refused(capsys):
  assert kernel_resources.main(["--launches", "64x4"], dump=Path("unused")) == 2
  assert "error: --launches '64x4'" in capsys.readouterr().err
  assert kernel_resources.main(["--batches", "two"], dump=Path("unused")) == 2
  assert "error: --batches 'two'" in capsys.readouterr().err
  assert kernel_resources.main([]) == 2
  assert "error: run as a script" in capsys.readouterr().err


@pytest.mark.skipif(not hlo_traffic.cuda_available() or kernel_resources.ptxas() is None,
                    reason="compiling for the H200 needs jax's CUDA plugin and its ptxas")
def test_the_fused_attention_kernel_on_the_h200():
  """The fused kernel at four rows: its launch, registers, the programs an SM holds and
  its tensor-core products, from a compile for the H200; a key block that does not
  divide the split is skipped, named why."""
  env = dict(os.environ, PYTHONPATH=str(TOOLS.parent), JAX_PLATFORMS="")
  run = subprocess.run([sys.executable, str(TOOLS / "kernel_resources.py"), "--batches", "4",
                        "--context", "56", "--launches", "32x4x3,256x4x3"],
                       capture_output=True, text=True, env=env, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  records = [json.loads(line) for line in run.stdout.splitlines()]
  fused = [r for r in records if r.get("kernel") == "wts_qkv_attention"]
  assert len(fused) == 1 and fused[0]["launch"] == [32, 4, 3]
  assert fused[0]["threads"] == 128 and fused[0]["registers"] > 0
  assert fused[0]["programs_per_sm"]["programs"] >= 1 and fused[0]["ptx"]["tensor_core"] > 0
  assert [r["launch"] for r in records if "skipped" in r] == [[256, 4, 3]]
