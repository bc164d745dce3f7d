"""The benchmark harness on CPU: the CLI end to end on a small shape, the correctness
gate, the JSON schema, the tables; the floor and timing arithmetic. GPU-only checks of
the timing chain's compiled form are marked ``gpu``."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import wts_jax
from wts_jax import sampling
from wts_jax.bench import cli, floor, gate, jax_paths, paths, report, runner, timing, torch_paths
from wts_jax.bench import flush as l2_flush
from wts_jax.inputs import random_inputs
from wts_jax.shapes import SHAPES

TOP_LEVEL_KEYS = ("device_kind", "jax_version", "jaxlib_version", "torch_version",
                  "triton_version", "timestamp", "command", "ceilings", "method",
                  "sanity", "records")
RECORD_KEYS = ("path", "head", "batch", "k", "rank", "vocab", "hidden", "w2_dtype", "mode",
               "l2", "median_us", "min_us", "p90_us", "floor_us", "x_floor", "check")
CEILING_KEYS = ("hbm_gbps", "l2_gbps", "sync_us", "sync_source")


def _prepare_wrong(head, base_logits, first_tokens, hidden, mode, *, return_logits=False):
  """The XLA walk with every token shifted by one: the gate must catch it."""
  xla = jax_paths.prepare_xla(head, base_logits, first_tokens, hidden, mode,
                          return_logits=return_logits)
  vocab = base_logits.shape[-1]

  def walk_fn(operands, first):
    out = xla.walk_fn(operands, first)
    return {"tokens": (out.tokens + 1) % vocab}

  return paths.jax_prepared(walk_fn, xla.operands, first_tokens)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
  out_dir = tmp_path_factory.mktemp("bench")
  out = str(out_dir / "quick.json")
  paths.register_path("wrong-tokens", lambda: None, _prepare_wrong, replace=True)
  stdout = io.StringIO()
  try:
    with contextlib.redirect_stdout(stdout):
      # flush_impl kernel (Pallas interpret mode here): the GPU's one-executable chains.
      code = cli.main(["--platform", "cpu", "--quick", "--shape", "small_v1000",
                       "--flush-impl", "kernel",
                       "--paths", "xla,torch-eager,torch-graph,wrong-tokens",
                       "--out", out, "--plot", str(out_dir / "quick.png")])
  finally:
    paths.unregister_path("wrong-tokens")
  assert code == 0
  with open(out) as handle:
    results = json.load(handle)
  return results, stdout.getvalue(), out


def _records(results, path):
  return [r for r in results["records"] if r["path"] == path]


def test_json_schema(quick_run):
  results, _, _ = quick_run
  for key in TOP_LEVEL_KEYS:
    assert key in results, key
  assert results["device_kind"] and results["jax_version"] == jax.__version__
  for key in CEILING_KEYS:
    assert key in results["ceilings"], key
  assert results["ceilings"]["hbm_gbps"] > 0 and results["ceilings"]["l2_gbps"] > 0
  assert "optimization_barrier" in results["method"]
  assert results["records"]
  for record in results["records"]:
    for key in RECORD_KEYS:
      assert key in record, (key, record["path"])
    assert record["mode"] in ("greedy", "sample") and record["l2"] in ("cold", "warm")
  # --quick on CPU: B 1,4 × K 4 × vanilla × greedy × cold,warm, for each of 4 paths.
  assert len(results["records"]) == 2 * 2 * 4
  assert {r["batch"] for r in results["records"]} == {1, 4}
  sanity = [s for s in results["sanity"] if s["framework"] == "jax"]
  assert sanity and all("median_us" in s or "error" in s for s in sanity)
  assert results["timing"]["flush_impl"] == "kernel" and not results["timing"][
      "flush_probe_error"]
  assert [(p["batch"], p["k"]) for p in results["point_times"]] == [(1, 4), (4, 4)]
  for phases in results["point_times"]:
    assert phases["total_s"] >= phases["compile_s"] + phases["timing_s"] > 0
  assert results["skipped_points"] == [] and results["interrupted"] is None
  for record in _records(results, "xla"):
    assert record["checked_walks"] == record["n_walks"]   # every walk of the chain


def test_full_grid_defaults_state_the_method():
  assert cli.FULL["walks_per_repeat"] == timing.DEFAULT_WALKS
  assert cli.FULL["repeats"] == timing.DEFAULT_REPEATS
  assert timing.DEFAULT_WALKS * timing.DEFAULT_REPEATS >= timing.MIN_WALKS_PER_FIGURE >= 50
  assert (f"N = {timing.DEFAULT_WALKS}, R = {timing.DEFAULT_REPEATS}" in timing.METHOD)


def test_command_buffer_settings_reach_the_chains():
  """--command-buffers: fusions and library calls but not custom calls (the default),
  none at all, or XLA's own default (no option set)."""
  from wts_jax.bench.support import chain_compiler_options
  from wts_jax.launch_options import KERNEL_COMPILER_OPTIONS
  assert chain_compiler_options("no-custom-calls") == KERNEL_COMPILER_OPTIONS
  assert chain_compiler_options("off") == {"xla_gpu_enable_command_buffer": ""}
  assert chain_compiler_options("xla-default") == {}
  assert cli.build_parser().parse_args([]).command_buffers == "no-custom-calls"
  assert cli.build_parser().parse_args(["--command-buffers", "off"]).command_buffers == "off"


def test_path_names_expand_default_and_all():
  assert cli._path_names(None) == paths.DEFAULT_PATHS
  assert cli._path_names("default,xla") == paths.DEFAULT_PATHS
  assert cli._path_names("all") == tuple(paths.PATHS)


def _has_torch() -> bool:
  try:
    import torch  # noqa: F401
  except ImportError:
    return False
  return True


def test_reference_and_torch_paths_are_checked_and_timed(quick_run):
  results, _, _ = quick_run
  if not _has_torch():
    pytest.skip("torch is not installed")
  for path in ("xla", "torch-eager"):
    for record in _records(results, path):
      assert record["check"].startswith("ok"), record["check"]
      assert record["median_us"] is not None and record["n_walks"] >= 1
      assert record["floor_us"] > 0 and record["x_floor"] is not None
      assert record["stepwise_floor_us"] > 0
  xla = _records(results, "xla")[0]
  assert set(xla["speedup_vs"]) == {"torch-eager"}
  eager = _records(results, "torch-eager")[0]
  assert eager["notes"]["torch_dtype"] == "bfloat16"


def test_torch_graph_skipped_with_reason_on_cpu(quick_run):
  results, _, _ = quick_run
  records = _records(results, "torch-graph")
  assert records
  for record in records:
    assert record["check"].startswith("skipped:") and "CUDA" in record["check"]
    assert record["median_us"] is None


def test_wrong_path_caught_by_gate_and_not_timed(quick_run):
  results, stdout, _ = quick_run
  records = _records(results, "wrong-tokens")
  assert records
  for record in records:
    assert record["check"].startswith("mismatch:"), record["check"]
    assert record["median_us"] is None and record["x_floor"] is None
    assert "speedup_vs" not in record
  assert "MISMATCH" in stdout


def test_table_printed(quick_run):
  _, stdout, _ = quick_run
  assert "median µs per walk" in stdout
  for name in ("xla", "torch-eager", "torch-graph", "floor µs"):
    assert name in stdout
  assert "ceilings (measured in this run)" in stdout


def test_render_markdown(quick_run, capsys):
  _, _, out = quick_run
  assert cli.main(["--render", out]) == 0
  text = capsys.readouterr().out
  lines = text.splitlines()
  table = [line for line in lines if line.startswith("| ")]
  assert table[0].startswith("| shape | head |") and "xla" in table[0]
  assert set(table[1].replace("|", "").split()) <= {"---", "---:"}
  assert len(table) == 2 + 4   # header, rule, 2 batches × 2 L2 states
  assert "MISMATCH" in text


def test_compare_tokens_exact_and_with_margin():
  reference = np.array([[1, 2, 3], [4, 5, 6]])
  gaps = np.array([[1.0, 0.1, 1.0], [1.0, 1.0, 1.0]])
  assert gate.compare_tokens(reference, reference.copy())[0]
  tokens = reference.copy()
  tokens[0, 1:] = [9, 9]          # diverges at a near-tie, then differs after it
  passed, check, agreement = gate.compare_tokens(reference, tokens)
  assert not passed and check.startswith("mismatch: row 0 step 1")
  passed, check, agreement = gate.compare_tokens(reference, tokens, gaps, margin=0.25)
  assert passed and "near-tie" in check and agreement == pytest.approx(4 / 6)
  tokens[1, 0] = 7                # diverges where the reference's choice was clear
  passed, check, _ = gate.compare_tokens(reference, tokens, gaps, margin=0.25)
  assert not passed and "row 1 step 0" in check


def test_floor_arithmetic():
  ceilings = floor.Ceilings(hbm_gbps=1000.0, l2_gbps=4000.0, sync_us=2.0,
                            sync_source="given")
  nbytes = floor.WalkBytes(w2=8_000_000, base_logits=1_000_000, read_once=500_000,
                           outputs=500_000)
  terms = floor.walk_floor(nbytes, steps=5, ceilings=ceilings, resident_fraction=0.25)
  assert terms["floor_hbm_us"] == pytest.approx(10.0)              # 10 MB / 1 TB/s
  assert terms["floor_l2_us"] == pytest.approx(4 * 6_000_000 / 4000e3)
  assert terms["floor_sync_us"] == pytest.approx(10.0)
  assert terms["floor_us"] == pytest.approx(10.0 + 6.0 + 10.0)
  assert terms["stepwise_floor_us"] == pytest.approx((5 * 8e6 + 1e6) / 1000e3)
  assert floor.default_resident_fraction(132 * 390 * 1024 * 4, num_sms=132) == 0.25
  assert floor.default_resident_fraction(1000, num_sms=132) == 1.0


def test_walk_bytes_reads_the_head():
  config = SHAPES["small_v1000"].head_config("rnn", confidence=True)
  head = wts_jax.make_head(config)
  base, _, hidden = random_inputs(config, 2, 3, jax.random.key(0))
  nbytes = floor.walk_bytes(head, base, hidden)
  assert nbytes.w2 == 1000 * 32 * 2 and nbytes.base_logits == 2 * 3 * 1000 * 2
  joint = 3 * 32 * (2 * 32 + 48) * 2 + 3 * 32 * 2
  confidence = (48 + 32) * 2
  assert nbytes.read_once == joint + confidence + 2 * 3 * 32 * 2 + 2 * 3 * 48 * 2
  assert nbytes.outputs == 2 * 3 * 4 * 2


def test_summarize_subtracts_the_flush_only_chain():
  result = timing.summarize([1.0e-3, 1.2e-3, 1.1e-3], [0.5e-3, 0.7e-3, 0.6e-3], n_walks=10)
  assert result.median_us == pytest.approx(50.0)
  assert result.min_us == pytest.approx(40.0)
  assert result.flush_us == pytest.approx(60.0)


def test_device_timing_counts_busy_time_per_run(tmp_path):
  """Device time (--timing device): a trace's GPU ops cut into runs at idle gaps, each
  run's span from its first op to its last (no flush kernel in this trace: the start is
  its first op), the flush-only runs subtracted; beside it
  the busy time (the union of its ops: overlaps once, idle time inside not at all) and
  the host wall clock."""
  import gzip
  events = [{"ph": "M", "name": "process_name", "pid": 1,
             "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}}]
  # Run 0 (a chain of 2 walks): busy 100 + 50 (a 20 µs overlap counted once, a 30 µs
  # gap not at all); run 1 (flush only): busy 40; run 2: busy 130; run 3: busy 40.
  ops = [(0, 80), (60, 40), (130, 50), (10_000, 40), (20_000, 130), (30_000, 40)]
  events += [{"ph": "X", "pid": 1, "ts": ts, "dur": dur, "name": "op"} for ts, dur in ops]
  events.append({"ph": "X", "pid": 2, "ts": 5, "dur": 9_000, "name": "host work"})
  (tmp_path / "plugins" / "profile").mkdir(parents=True)
  with gzip.open(tmp_path / "plugins" / "profile" / "x.trace.json.gz", "wt") as f:
    json.dump({"traceEvents": events}, f)
  found = timing.gpu_ops(str(tmp_path))
  assert found == [(float(ts), float(dur), "op") for ts, dur in ops]
  runs = timing.split_runs(found, gap_us=2_500)
  assert [len(run) for run in runs] == [3, 1, 1, 1]
  assert [timing.busy_us(run) for run in runs] == [150.0, 40.0, 130.0, 40.0]
  result = timing.device_timing(runs, [300e-6, 100e-6, 320e-6, 100e-6], n_walks=2)
  assert result.method == "device"   # spans 180 and 130 less 40, per walk
  assert sorted(result.samples_us) == pytest.approx([45.0, 70.0])
  record = result.as_record()
  assert record["timing_method"] == "device"
  assert record["device_busy_us"] == pytest.approx(((150 + 130) / 2 - 40) / 2)
  assert record["host_wall_us"] == pytest.approx(((300 + 320) / 2 - 100) / 2)
  assert record["span_from_first_op_us"] == pytest.approx(result.median_us)
  with pytest.raises(RuntimeError, match="holds 3 runs where 4 were timed"):
    timing.device_timing(runs[:3], [1e-4] * 4, n_walks=2)


def test_device_timing_starts_at_the_first_flush_step():
  """A run's device span starts at its first flush kernel: the executable's start (an
  argument copy, then the device idle while the host prepares the run) is not a walk's.
  Both chains get the same start; the reading from the first op is kept beside it."""
  flush = l2_flush.FLUSH_KERNEL_NAME
  def run(t0, startup_idle, walk_us):
    setup = [(t0, 1.0, "MemcpyH2D")]
    start = t0 + 1 + startup_idle
    ops = []
    for i in range(2):                  # two walks: flush 100, then the walk
      ops.append((start, 100.0, flush))
      start += 100
      if walk_us:
        ops.append((start, walk_us, "walk_kernel"))
        start += walk_us
    return setup + ops
  # The walk chain starts 300 µs later than the flush-only chain: a cost of the run.
  runs = [run(0, 400, 30), run(10_000, 100, 0), run(20_000, 400, 30), run(30_000, 100, 0)]
  result = timing.device_timing(runs, [1e-3] * 4, n_walks=2)
  assert result.median_us == pytest.approx(30.0)
  record = result.as_record()
  assert record["device_busy_us"] == pytest.approx(30.0)
  assert record["span_from_first_op_us"] == pytest.approx(30.0 + 300 / 2)
  # Without a flush kernel (the "static" flush) the span starts at the first op.
  plain = [[(s, d, "fusion") for s, d, _ in r] for r in runs]
  assert timing.device_timing(plain, [1e-3] * 4, n_walks=2).median_us == pytest.approx(180.0)


def test_device_timing_needs_a_gpu_trace():
  """On the CPU the trace has no GPU ops: asked for device time, the chain's timing is
  an error naming it, and the harness's default there is the host clock."""
  assert timing.default_timing_method() == "host"
  config = SHAPES["qwen3_4b"].head_config("vanilla", confidence=False)
  small = dataclasses.replace(config, vocab_size=512, rank=64, hidden_size=64)
  head = wts_jax.make_head(small)
  base, first, _ = random_inputs(small, 2, 2, jax.random.key(0))
  prepared = jax_paths.prepare_xla(head, base, first, None, paths.BenchMode("greedy"))
  flush = l2_flush.make_jax_flush_buffer(1 << 12)
  compiled = {}
  for name, fn in (("walks", prepared.walk_fn), ("flush", None)):
    lowered, finish = timing.lower_chain(fn, prepared.operands, first, flush, n_walks=2,
                                         flush_impl="static", cold=True)
    compiled[name] = finish(lowered.compile())
  with pytest.raises(RuntimeError, match="the device trace holds 0 runs"):
    timing.time_chain(compiled["walks"], compiled["flush"], first, flush, l2="cold",
                      repeats=2, method="device")
  with pytest.raises(ValueError, match="timing method 'wall'"):
    timing.time_chain(compiled["walks"], compiled["flush"], first, flush, l2="cold",
                      repeats=2, method="wall")
  host = timing.time_chain(compiled["walks"], compiled["flush"], first, flush, l2="cold",
                           repeats=2, method="host")
  assert host.method == "host" and len(host.samples_us) == 2


def test_torch_loop_matches_deepspec_sample_block_tokens():
  torch = pytest.importorskip("torch")
  from wts_jax.peers import deepspec_torch
  config = SHAPES["small_v1000"].head_config("gated", confidence=True)
  head = wts_jax.make_head(config, seed=3)
  base, first, hidden = random_inputs(config, 3, 5, jax.random.key(4))
  mode = paths.BenchMode("sample", 0.7, jax.random.key(5))
  prepared = torch_paths.prepare_torch_eager(head, base, first, hidden, mode)
  tokens = prepared.tokens(prepared.run())
  torch_head = deepspec_torch.from_wts_head(head, dtype=torch.bfloat16)
  noise = deepspec_torch.gumbel_noise_torch(sampling.seed_words(mode.key), 3, 5,
                                            config.vocab_size)
  expected, _, _ = deepspec_torch.sample_block_tokens(
      torch_head, torch_paths.to_torch(base, torch.device("cpu")),
      torch.from_numpy(np.array(first)), torch_paths.to_torch(hidden, torch.device("cpu")),
      temperature=0.7, gumbel=noise)
  np.testing.assert_array_equal(tokens, expected.numpy())


def _xla_walk(batch=2, steps=3):
  config = SHAPES["small_v1000"].head_config("vanilla", confidence=False)
  head = wts_jax.make_head(config)
  base, first, hidden = random_inputs(config, batch, steps, jax.random.key(0))
  return jax_paths.prepare_xla(head, base, first, hidden, paths.BenchMode("greedy")), first


def test_static_chain_keeps_every_walk_on_cpu():
  prepared, first = _xla_walk()
  chain = jax.jit(timing.build_chain(prepared.walk_fn, 3, cold=True))
  outputs, carry, flush = chain(prepared.operands, first, l2_flush.make_jax_flush_buffer(64))
  assert len(outputs) == 3
  for out in outputs:
    np.testing.assert_array_equal(np.asarray(out.tokens),
                                  np.asarray(prepared.run().tokens))
  assert int(flush[0]) == 3          # one flush before each walk


@pytest.mark.parametrize("carry_form", timing.CHAIN_CARRIES)
def test_chain_carries_tokens_or_their_last_column(carry_form):
  """Either carry feeds each walk the previous walk's last tokens where the flush says so,
  and leaves every walk's tokens alone; only the carried array's shape differs."""
  prepared, first = _xla_walk()
  chain = jax.jit(timing.build_chain(prepared.walk_fn, 3, cold=True, carry_form=carry_form))
  outputs, carry, _ = chain(prepared.operands, first, l2_flush.make_jax_flush_buffer(64))
  expected = np.asarray(prepared.run().tokens)
  for out in outputs:
    np.testing.assert_array_equal(np.asarray(out.tokens), expected)
  np.testing.assert_array_equal(np.asarray(carry),
                                expected if carry_form == "tokens" else expected[:, -1])
  with pytest.raises(ValueError, match="carry_form='last'"):
    timing.build_chain(prepared.walk_fn, 3, cold=True, carry_form="last")


def test_chain_takes_the_last_column_where_the_flush_flags_it():
  """With the flush buffer's head negative the next walk starts from the last column of
  the walk before (the dependency that orders the chain), in either carry form."""
  def walk(operands, first):
    return jnp.stack([first + 10, first + 20], axis=1)

  flush = -jnp.ones((64,), jnp.int32) * 5
  first = jnp.arange(3, dtype=jnp.int32)
  for carry_form in timing.CHAIN_CARRIES:
    outputs, _, _ = timing.build_chain(walk, 2, cold=True, carry_form=carry_form)(
        (), first, flush)
    np.testing.assert_array_equal(np.asarray(outputs[1]), np.asarray(first)[:, None]
                                  + np.array([[30, 40]]))


@pytest.mark.parametrize("flush_impl", ["cond", "kernel"])   # kernel: Pallas interpret
def test_one_chain_runs_cold_and_warm(flush_impl):
  """The runtime flush size makes one executable serve both L2 states: cold adds to the
  whole buffer before each walk, warm to its head only; the walks are the same."""
  prepared, first = _xla_walk()
  flush = l2_flush.make_jax_flush_buffer(3 * 4 * l2_flush.FLUSH_BLOCK)
  chain = jax.jit(timing.build_chain(prepared.walk_fn, 3, flush_impl=flush_impl))
  expected = np.asarray(prepared.run().tokens)
  for l2 in ("cold", "warm"):
    outputs, _, out = chain(prepared.operands, first, flush,
                            l2_flush.flush_elems_for(flush, l2))
    assert len(outputs) == 3
    for walk in outputs:
      np.testing.assert_array_equal(np.asarray(walk.tokens), expected)
    out = np.asarray(out)
    assert (out[:l2_flush.FLUSH_HEAD] == 3).all()
    if l2 == "cold":
      assert (out == 3).all()
  compiler = timing.ChainCompiler(1, flush_impl)
  chains = compiler.chains(prepared.walk_fn, prepared.operands, first, flush, n_walks=3,
                           l2s=["cold", "warm"])
  assert chains["cold"] is chains["warm"]            # one executable
  static = timing.ChainCompiler(1, "static").chains(
      prepared.walk_fn, prepared.operands, first, flush, n_walks=3, l2s=["cold", "warm"])
  assert static["cold"] is not static["warm"]
  flush_only = compiler.flush_only(first, flush, n_walks=3, l2s=["cold", "warm"])
  assert compiler.flush_only(first, flush, n_walks=3, l2s=["cold"])["cold"] is \
      flush_only["cold"]                              # cached across paths
  result = timing.time_chain(chains["warm"].result(), flush_only["warm"].result(), first,
                             flush, l2="warm", repeats=2, warmup=1)
  assert result.repeats == 2 and result.n_walks == 3


def test_flush_kernel_touches_what_it_must():
  flush = jnp.arange(4 * l2_flush.FLUSH_BLOCK, dtype=jnp.int32)
  for elems, touched in ((4 * l2_flush.FLUSH_BLOCK, 4 * l2_flush.FLUSH_BLOCK),
                         (l2_flush.FLUSH_BLOCK + 1, 2 * l2_flush.FLUSH_BLOCK),
                         (0, l2_flush.FLUSH_HEAD)):
    out = np.asarray(l2_flush.kernel_flush(flush, jnp.int32(5), jnp.int32(elems)))
    np.testing.assert_array_equal(out[:touched], np.asarray(flush)[:touched] + 5)
  assert l2_flush.check_flush_impl(flush, "kernel") is None
  assert l2_flush.check_flush_impl(flush, "cond") is None
  with pytest.raises(ValueError, match="whole"):
    l2_flush.kernel_flush(jnp.zeros(1000, jnp.int32), jnp.int32(1), jnp.int32(0))


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_flush_kernel_lowers_for_cuda():
  """The GPU flush step (a Pallas Triton kernel) lowers and verifies for CUDA here."""
  spec = importlib.util.spec_from_file_location(
      "lower_for_gpu", os.path.join(os.path.dirname(__file__), "..", "tools",
                                    "lower_for_gpu.py"))
  lower_for_gpu = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(lower_for_gpu)
  lower_for_gpu.verify_triton_modules()
  flush = jax.ShapeDtypeStruct((l2_flush.flush_elements(256 << 20),), jnp.int32)
  elems = jax.ShapeDtypeStruct((), jnp.int32)
  step = lambda x, n: l2_flush.kernel_flush(x, jnp.int32(1), n, interpret=False)
  with lower_for_gpu.cuda_target():
    text = jax.jit(step).trace(flush, elems).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("custom_call") == 1


@pytest.mark.gpu
def test_gpu_chain_is_not_cse_d():
  """On the GPU each of the N walks keeps its own loop and its own hoisted matmul."""
  config = SHAPES["qwen3_4b"].head_config("rnn", confidence=False)
  head = wts_jax.make_head(config)
  base, first, hidden = random_inputs(config, 4, 7, jax.random.key(0))
  prepared = jax_paths.prepare_xla(head, base, first, hidden, paths.BenchMode("greedy"))
  flush = l2_flush.make_jax_flush_buffer(1 << 20)
  elems = l2_flush.flush_elems_for(flush, "cold")
  single = jax.jit(timing.build_chain(prepared.walk_fn, 1, flush_impl="kernel")).lower(
      prepared.operands, first, flush, elems).compile().as_text()
  chained = jax.jit(timing.build_chain(prepared.walk_fn, 4, flush_impl="kernel")).lower(
      prepared.operands, first, flush, elems).compile().as_text()
  for op in (" while(", "custom-call(", "__triton_gemm"):
    print(op, single.count(op), chained.count(op))
    assert chained.count(op) == 4 * single.count(op), op
  assert single.count(" while(") >= 1


@pytest.mark.gpu
def test_gpu_quick_run(tmp_path):
  out = str(tmp_path / "gpu.json")
  assert cli.main(["--quick", "--paths", "xla,torch-eager,torch-graph", "--out", out]) == 0
  with open(out) as handle:
    results = json.load(handle)
  assert results["timing"]["method"] == "device"
  for record in results["records"]:
    if record["path"] in ("xla", "torch-eager", "torch-graph"):
      assert record["check"].startswith("ok"), record
      assert record["median_us"] > 0
    if record["path"] == "xla":   # the span: at least the busy time
      assert record["timing_method"] == "device"
      assert record["device_busy_us"] <= record["median_us"] + 1.0


def test_merge_keeps_records_of_every_run(quick_run, tmp_path, capsys):
  _, _, out = quick_run
  merged_path = str(tmp_path / "merged.json")
  assert cli.main(["--merge", out, out, "--out", merged_path]) == 0
  capsys.readouterr()
  with open(merged_path) as handle:
    merged = json.load(handle)
  single = report.read_json(out)
  assert len(merged["records"]) == 2 * len(single["records"])
  assert len(merged["runs"]) == 2 and merged["device_kind"] == single["device_kind"]


def test_plot_that_fails_after_the_work_is_one_error_line(quick_run, tmp_path, capsys,
                                                         monkeypatch):
  """The plot's path was writable when tried and its write fails afterwards (a disk that
  filled meanwhile): one ``error:`` line naming it and where the results are, exit 2."""
  _, _, out = quick_run
  def disk_full(*_args):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(report, "plot", disk_full)
  merged, png = tmp_path / "merged.json", tmp_path / "merged.png"
  assert cli.main(["--merge", out, "--out", str(merged), "--plot", str(png)]) == 2
  err = capsys.readouterr().err.strip()
  assert err == (f"error: --plot={str(png)!r}: No space left on device; the results are "
                 f"in {merged}"), err
  assert merged.exists() and not png.exists()


SMALL_GRID = ["--platform", "cpu", "--shape", "small_v1000", "--head", "vanilla",
              "--k", "4", "--mode", "greedy", "--l2", "cold,warm", "--paths", "xla",
              "--no-ceilings", "--repeats", "2", "--walks-per-repeat", "2", "--jobs", "1"]


def test_json_rewritten_after_every_point(tmp_path, monkeypatch, capsys):
  """The results JSON is rewritten (atomically) as the run goes: a run killed between
  two points keeps every point before it."""
  out = tmp_path / "run.json"
  written = []
  original = report.write_json

  def spy(results, path):
    original(results, path)
    with open(path) as handle:
      written.append(json.load(handle))

  monkeypatch.setattr(report, "write_json", spy)
  assert cli.main([*SMALL_GRID, "--batch", "1,2,3", "--out", str(out)]) == 0
  capsys.readouterr()
  counts = [len(snapshot["records"]) for snapshot in written]
  assert counts == sorted(counts) and counts[-1] == 3 * 2
  for done in (2, 4):   # the last snapshot holding exactly the first points
    snapshot = [s for s in written if len(s["records"]) == done][-1]
    assert len(snapshot["point_times"]) == done // 2
  assert sorted(os.listdir(tmp_path)) == ["run.json"]   # no temporary file left behind


def test_time_budget_stops_starting_points(tmp_path, monkeypatch, capsys):
  out = tmp_path / "budget.json"
  # The first point is expected to take nothing, every later one more than the budget.
  monkeypatch.setattr(runner.Runner, "point_estimate_s",
                      lambda self: 1e9 if self.point_times else 0.0)
  assert cli.main([*SMALL_GRID, "--batch", "1,2,3", "--time-budget-s", "1e6",
                   "--out", str(out)]) == 0
  text = capsys.readouterr().out
  results = report.read_json(str(out))
  assert {record["batch"] for record in results["records"]} == {1}
  assert [(p["batch"], p["k"]) for p in results["skipped_points"]] == [(2, 4), (3, 4)]
  assert all(p["reason"].startswith("time budget") and p["modes"] == ["greedy"]
             for p in results["skipped_points"])
  assert results["time_budget_s"] == 1e6
  assert "2 point(s) not run (time budget)" in text
  merged = report.merge([results, results])
  assert len(merged["skipped_points"]) == 4 and len(merged["point_times"]) == 2
  assert merged["runs"][0]["time_budget_s"] == 1e6


def test_sigterm_keeps_finished_points(tmp_path):
  """``timeout`` sends SIGTERM: the run writes what it finished, lists the rest, exits."""
  out = tmp_path / "term.json"
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(
             os.path.abspath(__file__))), os.environ.get("PYTHONPATH", "")])}
  process = subprocess.Popen(
      [sys.executable, "-m", "wts_jax.bench.cli", *SMALL_GRID,
       "--batch", "1,2,3,4,5,6,7,8", "--out", str(out)],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  try:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
      try:
        if report.read_json(str(out))["point_times"]:
          break
      except (OSError, ValueError, KeyError):
        pass
      time.sleep(0.2)
    assert process.poll() is None, process.communicate()[1].decode()[-2000:]
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 128 + signal.SIGTERM, (process.returncode,
                                                       stderr.decode()[-3000:])
  results = report.read_json(str(out))
  assert results["interrupted"].startswith("SIGTERM")
  finished = {p["batch"] for p in results["point_times"]}
  skipped = {p["batch"] for p in results["skipped_points"]}
  assert finished and skipped and finished | skipped == set(range(1, 9))
  assert not finished & skipped
  assert {r["batch"] for r in results["records"]} >= finished


@pytest.mark.parametrize("argv, message", [
    (["--batch", "abc"], "--batch 'abc': 'abc' is not an integer"),
    (["--batch", "0"], "--batch '0': 0 must be >= 1"),
    (["--k", "-1"], "--k '-1': -1 must be >= 1"),
    (["--render", "missing.json"], "'missing.json' is not a readable results JSON"),
    (["--head", "foo"], "--head 'foo': must be one of"),
    (["--head", ","], "--head ',': must name at least one value"),
    (["--paths", ","], "--paths ',': must name at least one value"),
    (["--batch", "4,4"], "--batch '4,4': names 4 more than once"),
    (["--mode", "sample", "--temperature", "-1"], "--temperature -1.0: --mode sample"),
    (["--mode", "sample", "--temperature", "nan"], "--temperature nan: --mode sample"),
    (["--repeats", "0"], "--repeats 0: must be >= 1"),
    (["--jobs", "0"], "--jobs 0: must be >= 1"),
    (["--flush-mb", "-1"], "--flush-mb -1.0: must be a finite number > 0"),
    (["--time-budget-s", "-5"], "--time-budget-s -5.0: must be a finite number > 0"),
    (["--resident-fraction", "2"], "--resident-fraction 2.0: must be in [0, 1]"),
    (["--out", "{folder}"], "is a folder, not a file path"),
    (["--plot", "{file}/x.png"], "cannot write a file there"),
])
def test_bad_arguments_print_one_error_line_and_exit_2(argv, message, capsys, tmp_path):
  # (argparse's own errors, an unknown flag, are one line too: tests/test_hardening.py)
  (tmp_path / "file").write_text("")
  argv = [a.format(folder=tmp_path, file=tmp_path / "file") for a in argv]
  assert cli.main(["--platform", "cpu", *argv]) == 2
  err = capsys.readouterr().err.strip()
  assert err == f"error: {err[len('error: '):]}" and len(err.splitlines()) == 1
  assert message in err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]   # nothing written


@pytest.mark.parametrize("content", ["[1, 2]", "{}"])
def test_render_refuses_a_json_that_is_not_a_results_file(content, tmp_path, capsys):
  path = tmp_path / "x.json"
  path.write_text(content)
  assert cli.main(["--render", str(path)]) == 2
  assert "is not a wts-bench results JSON" in capsys.readouterr().err


def test_a_failed_point_or_path_is_reported_as_a_failure():
  assert cli.errored({"records": [{"path": "wts", "check": "skipped: no GPU"},
                                  {"path": "xla", "check": "ok"}]}) == []
  failures = cli.errored({
      "point_errors": [{"head": "vanilla", "batch": 1, "error": "ValueError: bad"}],
      "records": [{"path": "wts", "batch": 4, "check": "error: ValueError: x"},
                  {"path": "xla", "check": "ok", "error": "timing failed: boom"}]})
  assert len(failures) == 3 and "batch=4" in failures[1]


def test_the_floor_reads_the_kernels_real_plan():
  from wts_jax.heads import HeadConfig
  config = HeadConfig.qwen3_4b("vanilla")
  head = jax.eval_shape(lambda: wts_jax.make_head(config))
  base = jax.ShapeDtypeStruct((1, 7, config.vocab_size), jnp.bfloat16)
  plan = floor.kernel_plan(head, base)
  assert plan["impl"] == "mosaic_row" and "2 chunks resident" in plan["plan"]
  assert plan["resident_fraction"] == pytest.approx(2 * 132 * 64 / config.vocab_size)
  assert floor.kernel_plan(head, base, greedy=False)["impl"] == "mosaic_row"
  batch16 = jax.ShapeDtypeStruct((16, 7, config.vocab_size), jnp.bfloat16)
  assert floor.kernel_plan(head, batch16, greedy=False)["impl"] == "mosaic_batched"
  batch128 = jax.ShapeDtypeStruct((128, 7, config.vocab_size), jnp.bfloat16)
  assert floor.kernel_plan(head, batch128)["impl"] == "triton"
  batched = floor.kernel_plan(head, batch16)
  assert batched["impl"] == "mosaic_batched" and "batch rows on the WGMMA" in batched["plan"]
  ceilings = floor.Ceilings(hbm_gbps=4000.0, l2_gbps=8000.0, sync_us=2.0,
                            sync_source="given")
  nbytes = floor.WalkBytes(w2=77_791_232, base_logits=2_127_104, read_once=0, outputs=28)
  result = floor.walk_floor(nbytes, 7, ceilings, plan=plan)
  assert result["plan_floor_us"] > result["floor_us"]   # 11 % resident, not 66 %
  assert result["kernel_plan"] is plan
  # An int8-planes head's greedy walk: the stacked kernel's plan (its resident tiles).
  from wts_jax.quantize import quantize_w2
  planes = jax.eval_shape(lambda h: quantize_w2(h, "int8", state="planes"), head)
  stacked = floor.kernel_plan(planes, batch16)
  assert stacked["impl"] == "mosaic_stacked" and "stacked" in stacked["plan"]
  assert 0 < stacked["resident_fraction"] < 1


def test_the_floor_stays_under_the_public_int8_kernel():
  """At the H200's HBM read rate (4.2 TB/s by a 4 GB reduction), an L2 at 10 TB/s and
  the Triton kernel's 2.1 µs barrier the model predicts less than the public int8
  kernel measured at every batch — and all of its W2 on chip (SMEM + registers)."""
  ceilings = floor.Ceilings(hbm_gbps=4200.0, l2_gbps=10_000.0, sync_us=2.1,
                            sync_source="given")
  for batch, measured in floor.PUBLIC_INT8_US.items():
    predicted = floor.public_int8_floor(ceilings, batch)
    assert predicted["resident_fraction"] == 1.0
    assert predicted["floor_us"] < measured, (batch, predicted["floor_us"])


def _fake_ceiling_sources(monkeypatch, *, stream_hbm, stream_l2, barrier, kernel_sync):
  """The harness's ceilings with each source replaced by a fixed figure (GB/s, µs)."""
  from wts_jax.bench import microbench
  monkeypatch.setattr(floor.jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(floor, "device_num_sms", lambda: 132)
  monkeypatch.setattr(floor, "measure_hbm_gbps", lambda nbytes: {"hbm_read_gbps": 3500.0})
  monkeypatch.setattr(floor, "measure_l2_gbps", lambda nbytes: {
      "l2_chained_gbps": 3000.0, "l2_fused_gbps": 2900.0})
  monkeypatch.setattr(floor, "sync_latency", lambda given: (
      (given, "given", None) if given is not None else (kernel_sync, "measured", None)))
  monkeypatch.setattr(microbench, "stream_gbps", lambda nbytes, programs, passes=1: (
      stream_l2 if passes > 1 else stream_hbm))
  def barrier_us(programs, rounds):
    if isinstance(barrier, Exception):
      raise barrier
    return barrier
  monkeypatch.setattr(microbench, "barrier_us", barrier_us)


def test_ceilings_take_the_best_estimate_so_the_floor_stays_under_real_kernels(monkeypatch):
  """Bandwidth: the larger of the XLA reductions' and the streaming kernel's; the step
  exchange: the smaller of our kernel's and the bare barrier's — and the run records
  whether the floor then stays under the public int8 kernel."""
  _fake_ceiling_sources(monkeypatch, stream_hbm=3900.0, stream_l2=9000.0, barrier=1.2,
                        kernel_sync=3.2)
  ceilings = floor.measure_ceilings(hbm_bytes=1 << 20, l2_bytes=1 << 20)
  assert (ceilings.hbm_gbps, ceilings.l2_gbps, ceilings.sync_us) == (3900.0, 9000.0, 1.2)
  assert ceilings.sync_source == "barrier microbenchmark"
  assert ceilings.details["kernel_exchange_us"] == 3.2
  check = floor.public_int8_check(ceilings)
  assert all(entry["below"] for entry in check.values()), check
  # With our kernel's exchange (3.2 µs a step) the floor at one row is above the public
  # kernel's 31.4 µs: the wrong floor the barrier's figure replaces.
  slow = floor.Ceilings(hbm_gbps=3500.0, l2_gbps=3000.0, sync_us=3.2, sync_source="measured")
  assert not floor.public_int8_check(slow)["1"]["below"]
  line = report._ceilings_line({"ceilings": {**slow.as_record(),
                                             "public_int8_check": floor.public_int8_check(slow)}})
  assert "above the public int8 kernel's measured walk at B = 1" in line


def test_ceilings_keep_their_own_estimates_when_a_microbenchmark_fails(monkeypatch):
  _fake_ceiling_sources(monkeypatch, stream_hbm=100.0, stream_l2=100.0,
                        barrier=RuntimeError("a barrier of 132 programs timed out"),
                        kernel_sync=3.2)
  ceilings = floor.measure_ceilings(hbm_bytes=1 << 20, l2_bytes=1 << 20)
  assert (ceilings.hbm_gbps, ceilings.l2_gbps, ceilings.sync_us) == (3500.0, 3000.0, 3.2)
  assert ceilings.sync_source == "measured"
  assert "timed out" in ceilings.details["microbenchmark_error"]
  # A given exchange is used as is; the barrier is not run.
  _fake_ceiling_sources(monkeypatch, stream_hbm=100.0, stream_l2=100.0,
                        barrier=RuntimeError("not run"), kernel_sync=3.2)
  ceilings = floor.measure_ceilings(hbm_bytes=1 << 20, l2_bytes=1 << 20, sync_latency_us=2.5)
  assert (ceilings.sync_us, ceilings.sync_source) == (2.5, "given")
  assert "microbenchmark_error" not in ceilings.details


def test_the_floor_microbenchmarks_read_everything_and_lower_for_cuda():
  from wts_jax.bench import microbench
  block = microbench.STREAM_BLOCK
  x = jnp.arange(2 * 3 * block, dtype=jnp.float32)
  sums = microbench.stream(x, programs=2, passes=2, interpret=True)
  np.testing.assert_allclose(sums, 2 * x.reshape(2, 3, block).sum(1).reshape(-1))
  if jax.__version_info__ >= (0, 11):
    pytest.skip("CUDA lowering without a GPU needs an abstract mesh on jax >= 0.11")
  lowered = jax.jit(lambda: microbench.barriers(programs=132, rounds=3)).trace().lower(
      lowering_platforms=("cuda",)).as_text()
  assert "wts_barrier_rounds" in lowered


@pytest.mark.mosaic
@pytest.mark.parametrize("global_scratch, dependent_launch, shape",
                         [(True, False, {}), (False, False, {}), (True, True, {}),
                          (True, False, dict(smem_bytes=0, warpgroups=1, blocks=66,
                                             reduce=False))],
                         ids=["as-the-walks", "no-scratch", "dependent", "small-unreduced"])
def test_the_launch_shape_sanity_kernel_lowers_for_cuda(global_scratch, dependent_launch,
                                                        shape):
  """The sanity lines' empty kernel of the walks' launch shape builds for the GPU (no
  GPU needed), and so do the timeline tool's other shapes; as a dependent launch it
  waits on ``griddepcontrol.wait`` and only then; its status is reduced after it
  unless asked not to be."""
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  from lower_for_gpu import cuda_target
  walk = timing._launch_shape_walk(global_scratch, dependent_launch, **shape)
  with cuda_target():
    text = jax.jit(lambda tokens: walk(None, tokens)["tokens"]).trace(
        jax.ShapeDtypeStruct((16,), jnp.int32)).lower(
            lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
  if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 11):
    # (jax 0.10 serializes the kernel's module: its PTX is not in the text)
    assert ("griddepcontrol.wait" in text) == dependent_launch
  assert ("reduce" in text.split("mosaic_gpu")[-1]) == shape.get("reduce", True)


@pytest.mark.parametrize("kernel,patch,default,patched", [
    ("stacked", "_stacked_status", "kernel", "flags"),
    ("batched", "_batched_status", "kernel", "flags")])
def test_bench_variants_patch_a_kernel_spec_only_while_their_walk_traces(
    kernel, patch, default, patched):
  """``tools/bench_variants.py``'s ``wts-stacked-status-flags`` and
  ``wts-batched-status-flags``: the API's stacked / batched plan (whose status defaults
  are "kernel") patched while that path's walk traces, then restored."""
  import importlib
  from wts_jax import device
  from wts_jax.pallas.backend import WalkShapes
  from wts_jax.quantize import quantize_w2
  from wts_jax.walk_config import MosaicBatchedConfig, MosaicStackedConfig
  bench_variants = _bench_variants_module()
  config = dataclasses.replace(SHAPES["small_v1000"].head_config("vanilla",
                                                                confidence=False), rank=64)
  head = wts_jax.make_head(config)
  if kernel == "stacked":
    head = quantize_w2(head, "int8", state="planes")
  backend = importlib.import_module(f"wts_jax.pallas.mosaic_{kernel}_backend")
  options = {"stacked": MosaicStackedConfig, "batched": MosaicBatchedConfig}[kernel]()
  original = backend.plan
  plans = {"walk": lambda: backend.plan(head, WalkShapes(batch=16, steps=7), options,
                                        device.H200)}
  before, seen, after = _spec_fields_while_tracing(
      lambda prepare: getattr(bench_variants, patch)(prepare, "flags"), "status", plans)
  assert before == after == {"walk": default} and seen == [{"walk": patched}]
  assert backend.plan is original


@pytest.mark.mosaic
@pytest.mark.skipif(jax.__version_info__ < (0, 11),
                    reason="the rnn head's one-row plan puts the batch on N (jax >= 0.11)")
def test_bench_variants_deep_ring_deepens_the_rnn_heads_ring_only_while_it_traces():
  """``tools/bench_variants.py``'s ``wts-ring-deep``: the rnn head's batched plan (int8
  W2, the Qwen3-4B shape, one row) takes ring slots before resident chunks while that
  path's walk traces (the vanilla and gated heads' preference), and the planner's own
  rule after; the gated head's split gate at 64 rows with one warpgroup takes the deeper
  ring by default."""
  from wts_jax import device
  from wts_jax.bench.registry import jax_prepared
  from wts_jax.heads import HeadConfig
  from wts_jax.pallas import mosaic_batched_backend
  from wts_jax.pallas.backend import WalkShapes
  from wts_jax.quantize import quantize_w2
  from wts_jax.walk_config import MosaicBatchedConfig
  bench_variants = _bench_variants_module()

  def ring_of(head, batch, config=MosaicBatchedConfig()):
    plan = mosaic_batched_backend.plan(head, WalkShapes(batch=batch, steps=7), config,
                                       device.H200).plan
    return plan.resident_chunks, plan.ring_stages
  gated = wts_jax.with_gate_table(wts_jax.make_head(HeadConfig.qwen3_4b("gated")))
  assert ring_of(gated, 64, MosaicBatchedConfig(warpgroups=1)) == (0, 3)
  rnn = quantize_w2(wts_jax.make_head(HeadConfig.qwen3_4b("rnn")), "int8")
  assert ring_of(rnn, 1) == (3, 2)
  seen = []

  def prepare(*args, **kwargs):
    def walk_fn(operands, first):
      seen.append(ring_of(rnn, 1))
      return {"tokens": first[:, None]}
    return jax_prepared(walk_fn, (), jnp.zeros((2,), jnp.int32))
  original = mosaic_batched_backend.auto_ring_preference
  bench_variants._deep_ring(prepare)().walk_fn((), jnp.zeros((2,), jnp.int32))
  assert seen == [(1, 4)]
  assert (mosaic_batched_backend.auto_ring_preference is original
          and ring_of(rnn, 1) == (3, 2))


@pytest.mark.mosaic
@pytest.mark.skipif(jax.__version_info__ < (0, 11),
                    reason="the rnn head's one-row plan puts the batch on N (jax >= 0.11)")
def test_bench_variants_shallow_joint_ring_only_while_it_traces():
  """``tools/bench_variants.py``'s ``wts-joint-ring-shallow``: the rnn head's joint-table
  plan (int8 W2, the Qwen3-4B shape, one row; the head's shapes only) takes the split
  update's two ring slots first while that path's walk traces, the deeper ring after."""
  from wts_jax import device
  from wts_jax.bench.registry import jax_prepared
  from wts_jax.heads import HeadConfig
  from wts_jax.pallas import mosaic_batched_backend
  from wts_jax.pallas.backend import WalkShapes
  from wts_jax.quantize import quantize_w2
  from wts_jax.walk_config import MosaicBatchedConfig
  bench_variants = _bench_variants_module()
  rings = []

  def ring_of_joint_head():
    def planned():
      head = quantize_w2(wts_jax.with_joint_table(
          wts_jax.make_head(HeadConfig.qwen3_4b("rnn"))), "int8")
      plan = mosaic_batched_backend.plan(head, WalkShapes(batch=1, steps=7),
                                         MosaicBatchedConfig(), device.H200).plan
      assert plan.joint_table
      rings.append((plan.resident_chunks, plan.ring_stages))
      return jnp.zeros(())
    jax.eval_shape(planned)
    return rings[-1]
  assert ring_of_joint_head() == (4, 4)
  seen = []

  def prepare(*args, **kwargs):
    def walk_fn(operands, first):
      seen.append(ring_of_joint_head())
      return {"tokens": first[:, None]}
    return jax_prepared(walk_fn, (), jnp.zeros((2,), jnp.int32))
  original = mosaic_batched_backend.auto_ring_preference
  bench_variants._shallow_joint_ring(prepare)().walk_fn((), jnp.zeros((2,), jnp.int32))
  assert seen == [(6, 2)]
  assert (mosaic_batched_backend.auto_ring_preference is original
          and ring_of_joint_head() == (4, 4))


def _spec_fields_while_tracing(patch, field, plans):
  """A bench_variants patch of the batched planner: ``field`` of each of ``plans`` (name:
  a function planning it) before, while the patched path's walk traces, and after."""
  from wts_jax.bench.registry import jax_prepared

  def now():
    return {name: getattr(plan_of(), field) for name, plan_of in plans.items()}
  before, seen = now(), []

  def prepare(*args, **kwargs):
    def walk_fn(operands, first):
      seen.append(now())
      return {"tokens": first[:, None]}
    return jax_prepared(walk_fn, (), jnp.zeros((2,), jnp.int32))
  patch(prepare)().walk_fn((), jnp.zeros((2,), jnp.int32))
  return before, seen, now()


def _bench_variants_module():
  import sys
  from pathlib import Path
  sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
  import bench_variants
  return bench_variants


def _batched_plan_of(head, config):
  from wts_jax import device
  from wts_jax.pallas import mosaic_batched_backend
  from wts_jax.pallas.backend import WalkShapes
  return lambda: mosaic_batched_backend.plan(head, WalkShapes(batch=16, steps=3), config,
                                             device.H200)


def test_bench_variants_ring_refill_early_patch_skips_kernel_widening():
  """``wts-ring-refill-early``: ``BatchedSpec.ring_refill`` "before_epilogue" while the
  path's walk traces, but not where an int8 W2 is widened in the kernel (its threads
  read the slots)."""
  from wts_jax.heads import HeadConfig
  from wts_jax.quantize import quantize_w2
  from wts_jax.walk_config import MosaicBatchedConfig
  bench_variants = _bench_variants_module()
  head = wts_jax.make_head(HeadConfig(vocab_size=1024, rank=64, hidden_size=64,
                                      head_type="vanilla"))
  plans = {"bf16": _batched_plan_of(head, MosaicBatchedConfig(residency="none",
                                                              ring_stages=2)),
           "int8-smem": _batched_plan_of(quantize_w2(head, "int8"), MosaicBatchedConfig(
               batch_axis="m", w2_widening="smem"))}
  before, seen, after = _spec_fields_while_tracing(bench_variants._early_ring_refill,
                                                   "ring_refill", plans)
  assert before == after == {"bf16": "after_epilogue", "int8-smem": "after_epilogue"}
  assert seen == [{"bf16": "before_epilogue", "int8-smem": "after_epilogue"}]


def test_bench_variants_ring_refill_late_patch_sets_every_batched_plan():
  """``wts-ring-refill-late``: ``BatchedSpec.ring_refill`` "after_epilogue" while the
  path's walk traces, a 1-slot ring's (the planner's "before_epilogue") included."""
  from wts_jax.heads import HeadConfig
  from wts_jax.walk_config import MosaicBatchedConfig
  bench_variants = _bench_variants_module()
  head = wts_jax.make_head(HeadConfig(vocab_size=1024, rank=64, hidden_size=64,
                                      head_type="vanilla"))
  plans = {slots: _batched_plan_of(head, MosaicBatchedConfig(residency="none",
                                                             ring_stages=stages))
           for slots, stages in (("one-slot", 1), ("two-slot", 2))}
  before, seen, after = _spec_fields_while_tracing(bench_variants._late_ring_refill,
                                                   "ring_refill", plans)
  assert before == after == {"one-slot": "before_epilogue", "two-slot": "after_epilogue"}
  assert seen == [{"one-slot": "after_epilogue", "two-slot": "after_epilogue"}]


def test_bench_variants_hoist_split_sums_the_same_products_while_the_walk_traces():
  """``tools/bench_variants.py``'s ``wts-hoist-splitP``: the hoist's GEMM as P partial
  products on K (close to the one GEMM's terms: the same products, another order), in
  every module that calls it while the path's walk traces, and the originals after."""
  import importlib
  from wts_jax.bench.registry import jax_prepared
  from wts_jax.heads.base import hidden_terms
  bench_variants = _bench_variants_module()
  hidden = jax.random.normal(jax.random.key(1), (3, 5, 64), jnp.bfloat16)
  weight = jax.random.normal(jax.random.key(2), (48, 64), jnp.bfloat16)
  bias = jax.random.normal(jax.random.key(3), (48,), jnp.float32)
  split = bench_variants.split_hidden_terms(4)(hidden, weight, bias)
  np.testing.assert_allclose(np.asarray(split), np.asarray(hidden_terms(hidden, weight, bias)),
                             rtol=1e-5, atol=1e-4)
  eqns = jax.make_jaxpr(bench_variants.split_hidden_terms(4))(hidden, weight, bias).eqns
  batched_dots = [eqn for eqn in eqns if eqn.primitive.name == "dot_general"
                  and eqn.params["dimension_numbers"][1][0]]   # (a batch dimension: the parts)
  assert len(batched_dots) == 1
  modules = [importlib.import_module(name) for name in bench_variants.HOIST_CALLERS]
  seen = []

  def prepare(*args, **kwargs):
    def walk_fn(operands, first):
      seen.append([module.hidden_terms is hidden_terms for module in modules])
      return {"tokens": first[:, None]}
    return jax_prepared(walk_fn, (), jnp.zeros((2,), jnp.int32))
  bench_variants._hoist_split(prepare, 4)().walk_fn((), jnp.zeros((2,), jnp.int32))
  assert seen == [[False, False, False]]
  assert all(module.hidden_terms is hidden_terms for module in modules)


def test_a_cpu_run_prints_no_gpu_floor_warning_and_no_negative_times():
  """On the CPU the public kernel's H200 figures say nothing about the floor, and a
  per-walk time below zero (a chain faster than the subtracted flush-only chain's
  median) is the clock's noise, not a time."""
  slow = floor.Ceilings(hbm_gbps=43.0, l2_gbps=366.0, sync_us=2.1, sync_source="design-doc")
  assert floor.public_int8_check(slow, platform="cpu") == {}
  assert not floor.public_int8_check(slow, platform="gpu")["1"]["below"]
  line = report._ceilings_line({"ceilings": {**slow.as_record(),
                                             "public_int8_check": {}}})
  assert "too low" not in line
  lines = report._sanity_lines({"sanity": [
      {"framework": "jax", "kind": "xla 1-element op", "batch": 4, "l2": "cold",
       "median_us": 15.36, "min_us": -80.84, "p90_us": 114.64}]})
  assert "-80.84" not in lines[0] and "min < 0 (the clock's noise)" in lines[0], lines
