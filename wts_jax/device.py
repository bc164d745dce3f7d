"""The facts about the accelerator that the planners, the tuned tables and the floor model
read: one place, read once per ``walk`` call.

On a GPU every fact is the device's own (the opt-in shared memory from CUDA's table by
compute capability where the jaxlib does not report it). Without a GPU (interpret mode,
lowering for CUDA on the CPU) the kernels are planned as on the H200, the device they
were written and measured on.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
  kind: str                 # jax's ``device_kind``, e.g. "NVIDIA H200"
  num_sms: int              # streaming multiprocessors: the persistent grid's size
  smem_per_block: int       # opt-in shared memory one block may use (bytes)
  # CUDA compute capability (major, minor): what a kernel's instructions need (WGMMA:
  # (9, 0)); None for a device that is not a CUDA GPU.
  compute_capability: tuple[int, int] | None = None
  register_file_bytes: int = 256 * 1024   # per SM


# Hopper H200: 132 SMs, 227 KiB of opt-in shared memory per block (the figures CUDA
# reports for it), 64 Ki 32-bit registers per SM, compute capability 9.0.
H200 = DeviceFacts(kind="NVIDIA H200", num_sms=132, smem_per_block=227 * 1024,
                   compute_capability=(9, 0))

# The most shared memory a block may opt in to, by compute capability (CUDA's table of
# technical specifications): where a jaxlib does not report it.
OPTIN_SMEM_BY_CAPABILITY = {(8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 7): 163 * 1024,
                            (8, 9): 99 * 1024, (9, 0): 227 * 1024, (10, 0): 227 * 1024,
                            (12, 0): 99 * 1024}


def has_gpu() -> bool:
  return jax.default_backend() == "gpu"


def compute_capability(device) -> tuple[int, int] | None:
  """A jax device's compute capability as (major, minor), or None (not a CUDA GPU)."""
  text = getattr(device, "compute_capability", None)
  if not text:
    return None
  major, _, minor = str(text).partition(".")
  return int(major), int(minor or 0)


def current() -> DeviceFacts:
  """The default device's facts; without a GPU, the H200's under the device's kind."""
  device = jax.devices()[0]
  capability = compute_capability(device)
  if device.platform != "gpu" or capability is None:
    return dataclasses.replace(H200, kind=device.device_kind)
  smem = int(getattr(device, "shared_memory_per_block_optin", 0)
             or OPTIN_SMEM_BY_CAPABILITY.get(capability, 0))
  return DeviceFacts(kind=device.device_kind, num_sms=int(device.core_count),
                     smem_per_block=smem, compute_capability=capability)
