"""Attributing a profile's GPU kernels to the loop's phases (a synthetic trace: the CPU
records no GPU kernels) through the HLO's op_name metadata."""

import gzip
import json

import pytest

from wts_jax.specdecode import phase_profile

HLO = """
%fusion.1 = bf16[8,2560]{1,0} fusion(%p0), kind=kLoop, metadata={op_name="jit(run)/while/body/verify/dot_general"}
  ROOT %gemm.2 = f32[8,9728]{1,0} custom-call(%a, %b), metadata={op_name="jit(run)/while/body/drafter/dot_general" source_file="x.py"}
%pallas_call.3 = s32[1,7]{1,0} custom-call(%c), metadata={op_name="jit(run)/while/body/walk/pallas_call"}
%scatter.4 = bf16[1,8,768,128]{3,2,1,0} fusion(%d), metadata={op_name="jit(run)/while/body/scatter"}
"""


def _trace(tmp_path, events):
  run = tmp_path / "plugins" / "profile" / "run"
  run.mkdir(parents=True)
  meta = [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}}]
  with gzip.open(run / "perfetto_trace.json.gz", "wt") as f:
    json.dump({"traceEvents": meta + events}, f)
  return tmp_path


def test_kernels_are_summed_by_the_phase_of_their_hlo_operation(tmp_path):
  events = [{"ph": "X", "pid": 7, "dur": 100.0, "name": "k1", "args": {"hlo_op": "fusion.1"}},
            {"ph": "X", "pid": 7, "dur": 50.0, "name": "sm90_gemm", "args": {"hlo_op": "gemm.2"}},
            {"ph": "X", "pid": 7, "dur": 20.0, "name": "walk", "args": {"hlo_op": "pallas_call.3"}},
            {"ph": "X", "pid": 7, "dur": 5.0, "name": "s", "args": {"hlo_op": "scatter.4"}},
            {"ph": "X", "pid": 7, "tid": 9, "dur": 3.0, "name": "memcpy", "args": {}},
            {"ph": "X", "pid": 1, "dur": 999.0, "name": "host", "args": {"hlo_op": "fusion.1"}}]
  seconds = phase_profile.phase_seconds(
      phase_profile.attributed_kernels(_trace(tmp_path, events), HLO))
  assert seconds == pytest.approx({"verify": 100e-6, "drafter": 50e-6, "walk": 20e-6,
                                   "prefill": 0.0, "other": 5e-6, "unattributed": 3e-6})


def test_a_directory_without_a_trace_is_named(tmp_path):
  with pytest.raises(ValueError, match="no perfetto_trace"):
    phase_profile.phase_seconds(phase_profile.attributed_kernels(tmp_path, HLO))


def test_kernels_of_a_cuda_graph_go_by_their_name_or_the_kernel_before_them(tmp_path):
  """Inside XLA's command buffers hlo_op names the buffer: a fusion's kernel is named
  after its instruction; a library kernel (cuBLAS) takes its stream's previous phase."""
  def kernel(name, ts, dur, tid=3):
    return {"ph": "X", "pid": 7, "tid": tid, "ts": ts, "dur": dur, "name": name,
            "args": {"hlo_op": "command_buffer_12", "hlo_module": "jit_run"}}
  events = [kernel("nvjet_sm90_gemm", 0.0, 1.0),            # nothing before it
            kernel("fusion_1", 10.0, 100.0),                  # verify
            kernel("nvjet_sm90_gemm", 20.0, 7.0),            # after verify
            kernel("pallas_call_3", 30.0, 20.0),              # walk
            kernel("mha_forward", 40.0, 4.0),                 # after the walk
            kernel("scatter_4", 50.0, 5.0),                   # other
            kernel("mha_forward", 5.0, 2.0, tid=4)]           # another stream: nothing
  seconds = phase_profile.phase_seconds(
      phase_profile.attributed_kernels(_trace(tmp_path, events), HLO))
  assert seconds == pytest.approx({"verify": 107e-6, "drafter": 0.0, "walk": 24e-6,
                                   "prefill": 0.0, "other": 5e-6, "unattributed": 3e-6})


def test_the_top_kernels_by_device_time(tmp_path):
  events = [{"ph": "X", "pid": 7, "dur": d, "name": n, "args": {"hlo_op": op}}
            for n, d, op in (("gemm", 10.0, "fusion.1"), ("norm", 1.0, "fusion.1"),
                             ("gemm", 12.0, "fusion.1"), ("attn", 5.0, "fusion.1"),
                             ("walk", 50.0, "pallas_call.3"))]
  events.append({"ph": "X", "pid": 1, "dur": 99.0, "name": "host", "args": {}})
  top = phase_profile.kernel_seconds(
      phase_profile.attributed_kernels(_trace(tmp_path, events), HLO), ("verify",), top=2)
  assert top == [("gemm", 2, pytest.approx(22e-6)), ("attn", 1, pytest.approx(5e-6))]


def test_device_time_counts_overlapping_kernels_once_and_no_copy(tmp_path):
  """Two kernels side by side, one after a gap, a copy whose recorded duration spans
  idle time, a set, a host event: the totals by name sum the kernels' durations, the
  busy time is the union of the kernels' intervals."""
  events = [{"ph": "X", "pid": 7, "ts": ts, "dur": d, "name": n, "args": {}}
            for n, ts, d in (("gemm", 0.0, 10.0), ("attn", 4.0, 12.0),
                             ("gemm", 30.0, 5.0), ("norm", 31.0, 1.0),
                             ("MemcpyD2D", 40.0, 5000.0), ("Memset 0", 3.0, 1.0))]
  events.append({"ph": "X", "pid": 1, "ts": 0.0, "dur": 99.0, "name": "host", "args": {}})
  totals, busy = phase_profile.device_time(_trace(tmp_path, events))
  assert totals == {"gemm": (2, pytest.approx(15e-6)), "attn": (1, pytest.approx(12e-6)),
                    "norm": (1, pytest.approx(1e-6))}
  assert busy == pytest.approx(21e-6)


def test_the_loops_idle_time_is_its_span_less_its_kernels():
  """Prefill kernels, the set-up before them and copies are not the loop's; a gap between
  the prefill and the loop or between iterations is idle."""
  def kernel(ts, dur, phase, name="k"):
    return {"ts": ts, "dur": dur, "name": name}, phase
  kernels = [kernel(-900.0, 2.0, "other", "input_concatenate_fusion"),
             kernel(0.0, 50.0, "prefill"), kernel(80.0, 10.0, "verify"),
             kernel(85.0, 10.0, "drafter"), kernel(95.0, 5.0, "walk"),
             kernel(100.0, 400.0, "other", "MemcpyD2H"), kernel(230.0, 20.0, "verify")]
  # the loop spans 50 .. 250 µs (from the prefill's end); its kernels cover 80 .. 100
  # and 230 .. 250
  assert phase_profile.loop_idle_seconds(kernels) == pytest.approx(160e-6)
  assert phase_profile.loop_idle_seconds(kernels[2:]) == pytest.approx(130e-6)
  assert phase_profile.loop_idle_seconds([kernel(0.0, 5.0, "prefill")]) == 0.0


def test_kernels_of_another_executable_are_not_the_loops(tmp_path):
  """A set-up or check executable's kernels may carry the loop's instruction names (each
  module numbers its own): they are left out of the phases and of the loop's span."""
  def kernel(ts, dur, op, module):
    return {"ph": "X", "pid": 7, "ts": ts, "dur": dur, "name": op.replace(".", "_"),
            "args": {"hlo_op": op, "hlo_module": module}}
  hlo = "HloModule jit_run, is_scheduled=true\n" + HLO.replace(
      "jit(run)/while/body/scatter", "jit(run)/prefill/scatter")
  events = [kernel(0.0, 10.0, "scatter.4", "jit_run"),        # the prefill
            kernel(20.0, 100.0, "fusion.1", "jit_run"),       # verify
            kernel(150.0, 20.0, "pallas_call.3", "jit_run"),  # walk
            kernel(400.0, 5.0, "scatter.4", "jit_check"),     # another executable
            kernel(410.0, 5.0, "fusion.1", "jit_check")]
  kernels = phase_profile.attributed_kernels(_trace(tmp_path, events), hlo)
  assert phase_profile.phase_seconds(kernels) == pytest.approx(
      {"verify": 100e-6, "drafter": 0.0, "walk": 20e-6, "prefill": 10e-6, "other": 0.0,
       "unattributed": 0.0})
  # the loop spans 10 .. 170 µs; its kernels cover 120 of it
  assert phase_profile.loop_idle_seconds(kernels) == pytest.approx(40e-6)


def test_a_prefill_named_kernel_after_the_loop_does_not_end_the_prefill():
  """The output assembled after the loop can be a fusion named after a prefill
  operation: the loop's span still starts at the prefill before its first iteration."""
  def kernel(ts, dur, phase):
    return {"ts": ts, "dur": dur, "name": "k"}, phase
  kernels = [kernel(0.0, 50.0, "prefill"), kernel(80.0, 20.0, "verify"),
             kernel(200.0, 20.0, "walk"), kernel(240.0, 10.0, "prefill")]
  # the loop spans 50 .. 250 µs; its kernels cover 50 of it
  assert phase_profile.loop_idle_seconds(kernels) == pytest.approx(150e-6)
  # a prefill kernel that ends beside the loop's first: the span starts at the loop's
  assert phase_profile.loop_idle_seconds(
      [kernel(0.0, 100.0, "prefill"), kernel(80.0, 20.0, "verify")]) == 0.0
