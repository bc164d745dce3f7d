"""What the benchmark's runner leans on: the heads it builds, the timed chains' compiler
options, the versions it records, its log lines, and stopping cleanly on a signal."""

from __future__ import annotations

import platform as platform_module
import signal
import sys

from wts_jax.bench.options import DTYPES, QUANTIZED, QUANTIZED_PLANES


def make_bench_head(config, dtype_name: str, seed: int, gate_table: bool = True,
                    joint_table: bool = True):
  """(head, the bf16 head it was quantized from or None) for ``--dtype dtype_name``; a
  gated head with its gate table (``wts_jax.with_gate_table``) unless ``gate_table`` is
  False (``--gate-table off``); an rnn head with its contiguous J_h
  (``wts_jax.with_joint_hidden``) and, unless ``joint_table`` is False (``--joint-table
  off``), its joint table (``wts_jax.with_joint_table``)."""
  import jax.numpy as jnp
  from wts_jax import make_head, with_gate_table, with_joint_hidden, with_joint_table
  def tabled(head):
    if config.head_type == "rnn":
      head = with_joint_hidden(head)
      return with_joint_table(head) if joint_table else head
    return with_gate_table(head) if gate_table and config.head_type == "gated" else head
  if dtype_name in QUANTIZED + (QUANTIZED_PLANES,):
    from wts_jax.quantize import quantize_w2
    bf16_head = make_head(config, seed=seed, param_dtype=jnp.bfloat16)
    if dtype_name == QUANTIZED_PLANES:
      return quantize_w2(bf16_head, "int8", state="planes"), bf16_head
    return tabled(quantize_w2(bf16_head, dtype_name)), bf16_head
  return tabled(make_head(config, seed=seed, param_dtype=jnp.dtype(DTYPES[dtype_name]))), None


def chain_compiler_options(command_buffers: str) -> dict:
  """The XLA options of every timed JAX chain for ``--command-buffers``."""
  from wts_jax.launch_options import KERNEL_COMPILER_OPTIONS, NO_COMMAND_BUFFERS
  return {"no-custom-calls": dict(KERNEL_COMPILER_OPTIONS),
          "off": dict(NO_COMMAND_BUFFERS)}.get(command_buffers, {})


def versions() -> dict:
  import jax
  import jaxlib
  info = {"jax_version": jax.__version__, "jaxlib_version": jaxlib.__version__,
          "torch_version": None, "triton_version": None,
          "python_version": platform_module.python_version()}
  try:
    import torch
    info["torch_version"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
  except Exception:  # noqa: BLE001
    pass
  try:
    import triton
    info["triton_version"] = triton.__version__
  except Exception:  # noqa: BLE001
    pass
  device = jax.devices()[0]
  info["device_kind"] = device.device_kind
  info["platform"] = jax.default_backend()
  info["device_count"] = jax.device_count()
  return info


def error_text(err: BaseException) -> str:
  return f"{type(err).__name__}: {err}"[:500]


def log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


class Interrupted(BaseException):
  """SIGTERM (``timeout``'s signal) or SIGINT: the run stops after writing its JSON. A
  BaseException, like KeyboardInterrupt, so that no ``except Exception`` records it as
  one path's error and goes on."""


_STOP: dict = {"signal": None}   # set by the signal handler, read at safe points


def check_stop() -> None:
  """Raise ``Interrupted`` if a signal came (its own raise can be swallowed when it
  lands in a finalizer, so the runner also checks here between steps)."""
  if _STOP["signal"] is not None:
    raise Interrupted(_STOP["signal"])


def point_name(point: dict) -> str:
  return (f"{point['head']} B={point['batch']} K={point['k']} r={point['rank']} "
          f"{point['w2_dtype']}")


def progress_line(record: dict) -> str:
  where = (f"{record['path']:>16} {record['head']:>7} B={record['batch']:<3} "
           f"K={record['k']:<2} r={record['rank']} {record['mode']:<6} {record['l2']:<4}")
  if record.get("median_us") is None:
    text = (record.get("error") or record["check"]).strip()
    return f"{where}  {text.splitlines()[0][:300] if text else ''}"
  floor_text = (f"  {record['x_floor']:.2f}× floor" if record.get("x_floor") else "")
  return f"{where}  {record['median_us']:9.1f} µs{floor_text}  [{record['check']}]"


def stop_on_signals():
  """SIGTERM (what ``timeout`` sends) raises ``Interrupted`` in the main thread, so the
  runner writes its JSON before the process ends. Returns a function undoing it."""
  import threading
  if threading.current_thread() is not threading.main_thread():
    return lambda: None

  def handler(signum, frame):
    del frame
    _STOP["signal"] = signal.Signals(signum).name
    raise Interrupted(_STOP["signal"])

  _STOP["signal"] = None
  previous = signal.signal(signal.SIGTERM, handler)
  return lambda: signal.signal(signal.SIGTERM, previous)
