"""tools/loop_gaps.py on a synthetic trace: a loop's recurring gaps grouped by the kernels
around them, with what the host did meanwhile."""

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import loop_gaps  # noqa: E402


def _trace(tmp_path, events):
  meta = [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}},
          {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}}]
  path = tmp_path / "t.perfetto_trace.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": meta + events}, f)
  return path


def _kernel(name, ts, dur, module="jit_run", op="command_buffer_1"):
  return {"ph": "X", "pid": 7, "ts": ts, "dur": dur, "name": name,
          "args": {"hlo_module": module, "hlo_op": op}}


def test_gaps_recur_by_iteration_and_name_what_the_host_did(tmp_path, capsys):
  events = []
  for i in range(3):                      # three iterations of 100 µs: walk, gap, verify
    t = 100.0 * i
    events += [_kernel("walk", t, 20.0, op="mpmd_map.1"), _kernel("verify", t + 50.0, 40.0),
               _kernel("verify", t + 60.0, 10.0)]         # beside the first: counted once
    events.append({"ph": "X", "pid": 1, "ts": t + 30.0, "dur": 5.0, "name": "cuGraphLaunch"})
  events += [_kernel("other_program", 1000.0, 5.0, module="jit_stage"),
             {"ph": "X", "pid": 7, "ts": 2.0, "dur": 900.0, "name": "MemcpyD2D",
              "args": {"hlo_module": "jit_run"}}]
  path = _trace(tmp_path, events)
  assert loop_gaps.main([str(path)]) == 0
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  first, second, totals = lines
  assert (first["before"], first["after"], first["count"]) == ("walk", "verify", 3)
  assert first["median_us"] == 30.0 and first["before_op"] == "mpmd_map.1"
  assert first["host_during_longest"] == ["cuGraphLaunch"]
  assert (second["before"], second["after"], second["count"]) == ("verify", "walk", 2)
  assert second["median_us"] == 10.0
  assert totals == {"span_us": 290.0, "busy_us": 180.0, "idle_us": 110.0, "kernels": 9}


def test_a_trace_without_the_module_is_one_error_line(tmp_path, capsys):
  path = _trace(tmp_path, [_kernel("k", 0.0, 1.0, module="jit_stage")])
  assert loop_gaps.main([str(path)]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and "'jit_run'" in err and len(err.splitlines()) == 1


def test_each_cuda_graphs_host_launch_time_and_kernels(tmp_path, capsys):
  """Two graphs launched three times each: the host's launch times by graph id, the
  kernels a launch from the GPU events that name the graph."""
  events = []
  for i in range(3):
    t = 1000.0 * i
    events += [{"ph": "X", "pid": 1, "ts": t, "dur": 20.0 + i, "name": "cuGraphLaunch (CudaGraph:5)"},
               {"ph": "X", "pid": 1, "ts": t + 30.0, "dur": 400.0, "name": "cuGraphLaunch (CudaGraph:9)"}]
    for j in range(2):
      events.append({**_kernel("small", t + 25.0 + j, 1.0), "args": {
          "hlo_module": "jit_run", "hlo_op": "command_buffer_1", "cuda_graph_id": "5"}})
    for j in range(4):
      events.append({**_kernel("big", t + 430.0 + 10 * j, 10.0), "args": {
          "hlo_module": "jit_run", "hlo_op": "command_buffer_2", "cuda_graph_id": "9"}})
  path = _trace(tmp_path, events)
  assert loop_gaps.main([str(path)]) == 0
  lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
  rows = [line for line in lines if "graph" in line]
  assert lines[-1]["kernels"] == 18 and rows == loop_gaps.graph_launches(
      loop_gaps.read_trace(path))
  assert [row["graph"] for row in rows] == ["9", "5"]
  assert rows[0] == {"graph": "9", "launches": 3, "host_median_us": 400.0, "host_max_us": 400.0,
                     "kernels_per_launch": 4.0, "host_us_per_kernel": 100.0}
  assert rows[1]["host_median_us"] == 21.0 and rows[1]["kernels_per_launch"] == 2.0
