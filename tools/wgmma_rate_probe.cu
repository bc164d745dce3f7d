// How fast do a warpgroup's chained WGMMAs run on the H200: dense against 2:4-sparse
// int8, int8 against bf16, the A operand from registers against shared memory, with 1, 2
// or 4 warpgroups a block sharing the SM's tensor cores?
//
// The stacked int8-planes walk spends most of its tensor-core time exposed (NOTES v34:
// a quarter of the MACs on the same chain saves 20 µs at B 64, 6 at B 16). At B <= 16
// half of its 64 stacked rows are dead. A 2:4-sparse WGMMA whose two row halves take
// alternate pairs of each group of four K positions (W2's tile laid out to match) would
// do a tile's products in half the tensor time, if the sparse instruction runs at twice
// the dense rate in this chain. This program measures that, and what a bf16 W2 would
// cost on the same design (bf16 at half the int8 rate, a k16 step).
//
// Each warpgroup runs `iters` tiles; a tile is one chain of WGMMAs into one accumulator
// (the walk's: 8 dense m64n64k32 for a 64-row int8 tile at r = 256), committed and
// waited for. The operands' values do not matter for the time (random bits; the sparse
// metadata names positions 0 and 1 of every group). Timing only: nothing is checked.
//
// Build and run on the GPU: nvcc -O3 -arch=sm_90a -o /tmp/wgmma_rate tools/wgmma_rate_probe.cu
//                           /tmp/wgmma_rate [iters] > wgmma_rate.jsonl
// One JSON object a line: variant, warpgroups a block, instructions a tile, MACs a tile
// (dense-equivalent: the products the walk needs), median clocks a tile a warpgroup, the
// launch's µs, and the SM's rate in dense-equivalent int8-or-bf16 MACs a clock.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_probe.cuh"

namespace {

constexpr int kBlocks = 132;
constexpr int kSmemBytes = 64 * 1024;   // A and B tiles (the values do not matter)

enum Variant {
  kDenseS8Regs,     // 8 x m64n64k32 s8, A in registers: the walk's tile today
  kSparseS8Regs,    // 8 x m64n32k64 s8 2:4-sparse, A in registers: the same products at B <= 16
  kDenseS8Smem,     // 8 x m64n64k32 s8, A from shared memory
  kSparseS8Smem,    // 8 x m64n32k64 s8 2:4-sparse, A from shared memory
  kDenseBf16Regs,   // 16 x m64n64k16 bf16, A in registers: a bf16 W2's tile
  kHalfS8Regs,      // 8 x m64n32k32 s8, A in registers: half a tile (NOTES v34's H)
  kVariants
};
const char* kNames[kVariants] = {"dense-s8-regs", "sparse-s8-regs", "dense-s8-smem",
                                 "sparse-s8-smem", "dense-bf16-regs", "half-s8-regs"};
const int kInstructions[kVariants] = {8, 8, 8, 8, 16, 8};
// The products a tile stands for, dense-equivalent (the sparse chain's are the walk's
// 64 x 64 x 256 of a tile at B <= 16, half of its rows' pairs skipped).
const double kMacs[kVariants] = {64.0 * 64 * 256, 64.0 * 64 * 256, 64.0 * 64 * 256,
                                 64.0 * 64 * 256, 64.0 * 64 * 256, 64.0 * 32 * 256};

// A K-major shared-memory matrix descriptor, 128-byte swizzle: start address >> 4, the
// leading byte offset (unused by a swizzled K-major layout), the stride between 8-row
// groups (1024 bytes), the swizzle mode.
__device__ uint64_t descriptor(uint32_t address) {
  return (static_cast<uint64_t>((address & 0x3FFFF) >> 4))
         | (static_cast<uint64_t>(1) << 16)
         | (static_cast<uint64_t>(1024 >> 4) << 32)
         | (static_cast<uint64_t>(1) << 62);
}

#define ACC32(x)                                                                    \
  "+" x(acc[0]), "+" x(acc[1]), "+" x(acc[2]), "+" x(acc[3]), "+" x(acc[4]),        \
  "+" x(acc[5]), "+" x(acc[6]), "+" x(acc[7]), "+" x(acc[8]), "+" x(acc[9]),        \
  "+" x(acc[10]), "+" x(acc[11]), "+" x(acc[12]), "+" x(acc[13]), "+" x(acc[14]),   \
  "+" x(acc[15]), "+" x(acc[16]), "+" x(acc[17]), "+" x(acc[18]), "+" x(acc[19]),   \
  "+" x(acc[20]), "+" x(acc[21]), "+" x(acc[22]), "+" x(acc[23]), "+" x(acc[24]),   \
  "+" x(acc[25]), "+" x(acc[26]), "+" x(acc[27]), "+" x(acc[28]), "+" x(acc[29]),   \
  "+" x(acc[30]), "+" x(acc[31])
#define ACC16(x)                                                                    \
  "+" x(acc[0]), "+" x(acc[1]), "+" x(acc[2]), "+" x(acc[3]), "+" x(acc[4]),        \
  "+" x(acc[5]), "+" x(acc[6]), "+" x(acc[7]), "+" x(acc[8]), "+" x(acc[9]),        \
  "+" x(acc[10]), "+" x(acc[11]), "+" x(acc[12]), "+" x(acc[13]), "+" x(acc[14]),   \
  "+" x(acc[15])
#define D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"

// One WGMMA of the variant into `acc` (int32, or bf16's f32 bits).
template <int V>
__device__ __forceinline__ void wgmma(uint32_t* acc, const uint32_t* a, uint64_t adesc,
                                      uint64_t bdesc, uint32_t meta) {
  if constexpr (V == kDenseS8Regs) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 " D32
                 ", {%32, %33, %34, %35}, %36, p; }\n"
                 : ACC32("r") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  } else if constexpr (V == kSparseS8Regs) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sp.sync.aligned.m64n32k64.s32.s8.s8 " D16
                 ", {%16, %17, %18, %19}, %20, %21, 0, p; }\n"
                 : ACC16("r")
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(meta));
  } else if constexpr (V == kDenseS8Smem) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 " D32
                 ", %32, %33, p; }\n"
                 : ACC32("r") : "l"(adesc), "l"(bdesc));
  } else if constexpr (V == kSparseS8Smem) {
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sp.sync.aligned.m64n32k64.s32.s8.s8 " D16
                 ", %16, %17, %18, 0, p; }\n"
                 : ACC16("r") : "l"(adesc), "l"(bdesc), "r"(meta));
  } else if constexpr (V == kDenseBf16Regs) {   // (f32 accumulators as 32-bit registers)
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " D32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 0; }\n"
                 : ACC32("r") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  } else {   // kHalfS8Regs
    asm volatile("{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 " D16
                 ", {%16, %17, %18, %19}, %20, p; }\n"
                 : ACC16("r") : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc));
  }
}

template <int V>
__global__ void __launch_bounds__(512) chains(int iters, long long* clocks, uint32_t* sink) {
  extern __shared__ __align__(1024) char tiles[];
  for (int i = threadIdx.x; i < kSmemBytes / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(tiles)[i] = 2654435761u * (i + 1);
  }
  __syncthreads();
  const uint32_t base = (smem_address(tiles) + 1023) & ~1023u;
  const uint64_t a_tile = descriptor(base), b_tile = descriptor(base + 32768);
  uint32_t a[4] = {threadIdx.x * 7919u, threadIdx.x * 104729u, threadIdx.x ^ 0x5bd1e995u,
                   threadIdx.x + 0x9e3779b9u};
  const uint32_t meta = 0x44444444u;   // every group of four: positions 0 and 1
  uint32_t acc[32] = {};
  constexpr int kSteps = kInstructions[V];
  // A step's advance along K in 16-byte units: 32 bytes (k32 int8, k16 bf16), 64 (k64).
  constexpr int kAdvance = (V == kSparseS8Regs || V == kSparseS8Smem) ? 4 : 2;
  const long long start = clock64();
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      const int step = k % 8;   // (bf16's 16 steps run over the tile's 8 twice)
      wgmma<V>(acc, a, a_tile + kAdvance * step, b_tile + kAdvance * step, meta);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  const long long stop = clock64();
  if (threadIdx.x % 128 == 0) {
    clocks[blockIdx.x * 4 + threadIdx.x / 128] = stop - start;
  }
  uint32_t folded = 0;
  for (int i = 0; i < 32; ++i) folded ^= acc[i];
  sink[blockIdx.x * blockDim.x + threadIdx.x] = folded;   // (keeps the chain)
}

template <int V>
void measure(int warpgroups, int iters, long long* clocks, uint32_t* sink) {
  CHECK(cudaFuncSetAttribute(chains<V>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemBytes + 1024));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  std::vector<long long> per_tile;
  std::vector<long long> host(kBlocks * 4);
  for (int rep = 0; rep < 6; ++rep) {
    CHECK(cudaEventRecord(start));
    chains<V><<<kBlocks, 128 * warpgroups, kSmemBytes + 1024>>>(iters, clocks, sink);
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep == 0) continue;   // (the first launch warms up)
    times.push_back(ms * 1000.0f);
    CHECK(cudaMemcpy(host.data(), clocks, host.size() * sizeof(long long),
                     cudaMemcpyDeviceToHost));
    for (int b = 0; b < kBlocks; ++b) {
      for (int w = 0; w < warpgroups; ++w) per_tile.push_back(host[b * 4 + w] / iters);
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(per_tile.begin(), per_tile.end());
  const double us = times[times.size() / 2];
  const long long clocks_per_tile = per_tile[per_tile.size() / 2];
  // The SM's rate: every warpgroup's tiles over the median warpgroup's clocks.
  const double macs_per_clock = kMacs[V] * warpgroups / static_cast<double>(clocks_per_tile);
  std::printf("{\"variant\": \"%s\", \"warpgroups\": %d, \"instructions_per_tile\": %d, "
              "\"macs_per_tile\": %.0f, \"iters\": %d, \"clocks_per_tile\": %lld, "
              "\"launch_us\": %.1f, \"sm_macs_per_clock\": %.0f}\n",
              kNames[V], warpgroups, kInstructions[V], kMacs[V], iters, clocks_per_tile, us,
              macs_per_clock);
  std::fflush(stdout);
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
}

template <int V>
void measure_all(int iters, long long* clocks, uint32_t* sink) {
  for (int warpgroups : {1, 2, 4}) measure<V>(warpgroups, iters, clocks, sink);
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (iters < 1) {
    std::fprintf(stderr, "error: iters=%s must be an integer >= 1\n", argv[1]);
    return 2;
  }
  long long* clocks;
  uint32_t* sink;
  CHECK(cudaMalloc(&clocks, kBlocks * 4 * sizeof(long long)));
  CHECK(cudaMalloc(&sink, kBlocks * 512 * sizeof(uint32_t)));
  measure_all<kDenseS8Regs>(iters, clocks, sink);
  measure_all<kSparseS8Regs>(iters, clocks, sink);
  measure_all<kDenseS8Smem>(iters, clocks, sink);
  measure_all<kSparseS8Smem>(iters, clocks, sink);
  measure_all<kDenseBf16Regs>(iters, clocks, sink);
  measure_all<kHalfS8Regs>(iters, clocks, sink);
  return 0;
}
