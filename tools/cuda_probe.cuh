// What the standalone CUDA probes under tools/ share: a CUDA call checked (an `error:`
// line and exit status 1 on failure) and a shared-memory address for PTX operands.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                              \
  do {                                                                           \
    cudaError_t err_ = (call);                                                   \
    if (err_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "error: %s: %s\n", #call, cudaGetErrorString(err_));  \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}
