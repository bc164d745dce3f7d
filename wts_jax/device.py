"""The facts about the accelerator that the planners, the tuned tables and the floor model
read: one place, read once per ``walk`` call.

Where the device does not report a fact (a CPU that lowers for CUDA, an older jaxlib),
the H200's figure stands in: it is the device the kernels were written and measured on.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
  kind: str                 # jax's ``device_kind``, e.g. "NVIDIA H200"
  num_sms: int              # streaming multiprocessors: the persistent grid's size
  smem_per_block: int       # opt-in shared memory one block may use (bytes)
  l2_bytes: int
  register_file_bytes: int = 256 * 1024   # per SM


# Hopper H200: 132 SMs, 227 KiB of opt-in shared memory per block, a 60 MiB L2 (the
# figures CUDA reports for it), 64 Ki 32-bit registers per SM.
H200 = DeviceFacts(kind="NVIDIA H200", num_sms=132, smem_per_block=227 * 1024,
                   l2_bytes=60 * 1024 * 1024)


def has_gpu() -> bool:
  return jax.default_backend() == "gpu"


def current() -> DeviceFacts:
  """The default device's facts; the H200's for any figure it does not report."""
  device = jax.devices()[0]
  return DeviceFacts(
      kind=device.device_kind,
      num_sms=int(getattr(device, "core_count", None) or H200.num_sms),
      smem_per_block=int(getattr(device, "shared_memory_per_block_optin", 0)
                         or H200.smem_per_block),
      l2_bytes=H200.l2_bytes)
