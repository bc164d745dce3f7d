// Does an L2 eviction priority keep part of a streamed W2 in the L2 across a walk's steps?
//
// The bf16 W2 (77.8 MB at the Qwen3 shape) is larger than the H200's L2 (60 MB); the
// batched walk streams ~69 MB of it every step and runs at about the HBM rate of those
// bytes (NOTES v22). If a fixed subset of the streamed chunks stayed in the L2 from one
// step to the next, only the rest would come from HBM. This program measures, on the walk's
// access pattern alone (132 persistent blocks, 18 chunks of 32 KB each, 2 of them not
// streamed, K steps in snake order, a grid barrier between steps, the L2 flushed before
// each timed launch), whether a priority set by PTX cache hints does that:
//   ld        plain 16-byte loads (no hint)
//   ld-hint   every load with .L2::cache_hint: the kept chunks evict_last, the rest
//             evict_first
//   ld-pf     a hinted cp.async.bulk.prefetch.L2 of each chunk, then plain loads (the
//             form a Mosaic kernel can use: its TMA copies take no hint)
//   bulk      cp.async.bulk (TMA's non-tensor form) into a 4-slot shared-memory ring
//   bulk-hint the same copies with .L2::cache_hint
//   bulk-pf   a hinted prefetch, then the unhinted copy (again the Mosaic-compatible form)
// for several counts of kept chunks a block. Hinted modes put the kept lines back to
// evict_normal (applypriority) at the end of each launch.
//
// Build and run on the GPU: nvcc -O3 -arch=sm_90a -o /tmp/l2prio tools/l2_priority_microbench.cu
//                           /tmp/l2prio [steps [set_aside_mb [resident [unhinted]]]] > l2_priority.jsonl
// resident: a block's chunks not streamed (2 by default); unhinted: the ld and bulk modes only.
// set_aside_mb: the L2 set aside for persisting accesses (cudaLimitPersistingL2CacheSize,
// 0 by default), in case evict_last lines are held only there.
// One JSON object a line: mode, kept chunks a block, kept MB, streamed MB a step, steps,
// the set-aside MB, median µs of the launch, µs a step, the launch's GB/s; the unhinted
// modes also with the L2 warm (not flushed between launches).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_probe.cuh"

namespace {

constexpr int kBlocks = 132;
constexpr int kThreads = 128;
constexpr int kChunkBytes = 64 * 256 * 2;  // 64 rows of a bf16 [V, 256] W2
constexpr int kChunks = 18;                // a block's chunks (V = 151 936)
constexpr int kDefaultResident = 2;        // not streamed (the planner's bf16 B 16 plan)
constexpr int kRing = 4;                   // the bulk modes' shared-memory slots
constexpr long kSpinLimit = 1L << 26;      // a barrier never hangs: it gives up and says so

enum Mode { kLd, kLdHint, kLdPrefetch, kBulk, kBulkHint, kBulkPrefetch, kModes };
const char* kModeNames[kModes] = {"ld", "ld-hint", "ld-pf", "bulk", "bulk-hint", "bulk-pf"};

__device__ uint64_t policy_for(bool kept) {
  uint64_t policy;
  if (kept) {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  }
  return policy;
}

// All blocks meet; the last to arrive opens the next generation. Gives up after
// kSpinLimit polls and records it in *timed_out.
__device__ void grid_sync(unsigned* count, volatile unsigned* generation, int* timed_out) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned seen = *generation;
    __threadfence();
    if (atomicAdd(count, 1) == gridDim.x - 1) {
      *count = 0;
      __threadfence();
      atomicAdd(const_cast<unsigned*>(generation), 1);
    } else {
      long spins = 0;
      while (*generation == seen) {
        if (++spins > kSpinLimit) {
          atomicExch(timed_out, 1);
          break;
        }
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__device__ uint32_t load_chunk(const char* chunk, bool hinted, uint64_t policy) {
  uint32_t sum = 0;
  for (int i = threadIdx.x; i < kChunkBytes / 16; i += blockDim.x) {
    const char* address = chunk + 16 * i;
    uint32_t a, b, c, d;
    if (hinted) {
      asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(address), "l"(policy));
    } else {
      asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(address));
    }
    sum ^= a ^ b ^ c ^ d;
  }
  return sum;
}

__device__ void prefetch_hinted(const char* chunk, uint64_t policy) {
  asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;"
               :: "l"(chunk), "r"(kChunkBytes), "l"(policy) : "memory");
}

__device__ void bulk_copy(char* slot, uint64_t* barrier, const char* chunk, bool hinted,
                          uint64_t policy) {
  uint32_t bar = smem_address(barrier);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(bar), "r"(kChunkBytes) : "memory");
  if (hinted) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 :: "r"(smem_address(slot)), "l"(chunk), "r"(kChunkBytes), "r"(bar),
                    "l"(policy) : "memory");
  } else {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];"
                 :: "r"(smem_address(slot)), "l"(chunk), "r"(kChunkBytes), "r"(bar)
                 : "memory");
  }
}

__device__ void bulk_wait(uint64_t* barrier, uint32_t parity, int* timed_out) {
  uint32_t bar = smem_address(barrier), done = 0;
  for (long spins = 0; !done; ++spins) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;"
                 " selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    if (spins > kSpinLimit) {
      atomicExch(timed_out, 1);
      return;
    }
  }
}

__global__ void walk_stream(const char* w2, int steps, int mode, int kept, int resident,
                            unsigned* count, unsigned* generation, int* timed_out,
                            uint32_t* sink) {
  const int streamed = kChunks - resident;
  extern __shared__ __align__(128) char ring[];            // kRing chunks
  __shared__ __align__(8) uint64_t ring_barriers[kRing];
  const char* mine = w2 + static_cast<size_t>(blockIdx.x) * kChunks * kChunkBytes;
  const bool bulk = mode >= kBulk;
  if (bulk && threadIdx.x == 0) {
    for (int s = 0; s < kRing; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;"
                   :: "r"(smem_address(&ring_barriers[s])) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  // The stream of (step, j) chunk reads in the walk's order: snake over the streamed ones.
  auto chunk_of = [&](int index) {
    int step = index / streamed, j = index % streamed;
    return resident + ((step & 1) ? streamed - 1 - j : j);
  };
  auto is_kept = [&](int chunk) { return chunk - resident < kept; };
  uint32_t sum = 0;
  const int total = steps * streamed;
  if (!bulk) {
    for (int index = 0; index < total; ++index) {
      int chunk = chunk_of(index);
      const char* address = mine + static_cast<size_t>(chunk) * kChunkBytes;
      uint64_t policy = policy_for(is_kept(chunk));
      if (mode == kLdPrefetch && threadIdx.x == 0) prefetch_hinted(address, policy);
      sum ^= load_chunk(address, mode == kLdHint, policy);
      if (index % streamed == streamed - 1) grid_sync(count, generation, timed_out);
    }
  } else {
    // One thread issues every copy, kRing ahead; all wait for a slot's copy, then free it.
    auto issue = [&](int index) {
      int chunk = chunk_of(index);
      const char* address = mine + static_cast<size_t>(chunk) * kChunkBytes;
      uint64_t policy = policy_for(is_kept(chunk));
      if (mode == kBulkPrefetch) prefetch_hinted(address, policy);
      int slot = index % kRing;
      bulk_copy(ring + slot * kChunkBytes, &ring_barriers[slot], address,
                mode == kBulkHint, policy);
    };
    if (threadIdx.x == 0) {
      for (int index = 0; index < kRing && index < total; ++index) issue(index);
    }
    for (int index = 0; index < total; ++index) {
      int slot = index % kRing;
      bulk_wait(&ring_barriers[slot], (index / kRing) & 1, timed_out);
      sum ^= reinterpret_cast<const uint32_t*>(ring + slot * kChunkBytes)[threadIdx.x];
      __syncthreads();   // the slot read by everyone before its refill
      if (threadIdx.x == 0 && index + kRing < total) issue(index + kRing);
      if (index % streamed == streamed - 1) grid_sync(count, generation, timed_out);
    }
  }
  if (mode != kLd && mode != kBulk) {   // the kept lines back to the normal priority
    for (int chunk = resident; chunk < resident + kept; ++chunk) {
      const char* base = mine + static_cast<size_t>(chunk) * kChunkBytes;
      for (int line = threadIdx.x; line < kChunkBytes / 128; line += blockDim.x) {
        asm volatile("applypriority.global.L2::evict_normal [%0], 128;"
                     :: "l"(base + 128 * line) : "memory");
      }
    }
  }
  if (sum == 0x9e3779b9u) sink[blockIdx.x] = sum;   // keeps the loads; (almost) never true
}

}  // namespace

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 7;
  if (steps < 1) {
    std::fprintf(stderr, "error: steps=%s must be an integer >= 1\n", argv[1]);
    return 2;
  }
  double set_aside_mb = argc > 2 ? std::atof(argv[2]) : 0.0;
  int resident = argc > 3 ? std::atoi(argv[3]) : kDefaultResident;
  if (resident < 0 || resident >= kChunks) {
    std::fprintf(stderr, "error: resident=%s must be an integer in [0, %d)\n", argv[3], kChunks);
    return 2;
  }
  const bool unhinted_only = argc > 4 && std::string(argv[4]) == "unhinted";
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  if (set_aside_mb < 0 || set_aside_mb * 1e6 > prop.persistingL2CacheMaxSize) {
    std::fprintf(stderr, "error: set_aside_mb=%s must be in [0, %.1f]\n", argv[2],
                 prop.persistingL2CacheMaxSize / 1e6);
    return 2;
  }
  CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize,
                           static_cast<size_t>(set_aside_mb * 1e6)));
  const size_t w2_bytes = static_cast<size_t>(kBlocks) * kChunks * kChunkBytes;
  const size_t flush_bytes = 256u << 20;
  char *w2, *flush;
  unsigned *count, *generation;
  int* timed_out;
  uint32_t* sink;
  CHECK(cudaMalloc(&w2, w2_bytes));
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMalloc(&count, sizeof(unsigned)));
  CHECK(cudaMalloc(&generation, sizeof(unsigned)));
  CHECK(cudaMalloc(&timed_out, sizeof(int)));
  CHECK(cudaMalloc(&sink, kBlocks * sizeof(uint32_t)));
  CHECK(cudaMemset(w2, 1, w2_bytes));
  CHECK(cudaMemset(count, 0, sizeof(unsigned)));
  CHECK(cudaMemset(generation, 0, sizeof(unsigned)));
  CHECK(cudaMemset(timed_out, 0, sizeof(int)));
  const int smem = kRing * kChunkBytes;
  CHECK(cudaFuncSetAttribute(walk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const double streamed_mb = double(kBlocks) * (kChunks - resident) * kChunkBytes / 1e6;
  const int kept_counts[] = {0, 4, 6, 8, 10, 12};
  for (int mode = 0; mode < kModes; ++mode) {
    const bool hinted = mode != kLd && mode != kBulk;
    if (hinted && unhinted_only) continue;
    // (Unhinted: nothing kept, and once more with the L2 left warm, the L2's own rate.)
    for (int kept : kept_counts) for (bool cold : {true, false}) {
      if ((!hinted && kept != 0) || (hinted && !cold)) continue;
      // (Only streamed chunks can be kept: past them the hints would reach the next
      // block's chunks, or past W2.)
      if (kept > kChunks - resident) continue;
      std::vector<float> times;
      for (int rep = 0; rep < 21; ++rep) {
        if (cold) CHECK(cudaMemsetAsync(flush, rep & 0xff, flush_bytes));   // as wts-bench
        CHECK(cudaEventRecord(start));
        walk_stream<<<kBlocks, kThreads, smem>>>(
            w2, steps, mode, kept, resident, count, generation, timed_out, sink);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaGetLastError());
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (rep > 0) times.push_back(ms * 1000.0f);   // the first launch warms up
      }
      int failed = 0;
      CHECK(cudaMemcpy(&failed, timed_out, sizeof(int), cudaMemcpyDeviceToHost));
      std::sort(times.begin(), times.end());
      float median = times[times.size() / 2];
      std::printf("{\"mode\": \"%s\", \"l2\": \"%s\", \"kept_chunks\": %d, \"kept_mb\": %.1f, "
                  "\"resident_chunks\": %d, \"streamed_mb_per_step\": %.1f, \"steps\": %d, "
                  "\"set_aside_mb\": %.1f, "
                  "\"median_us\": %.1f, \"us_per_step\": %.2f, \"gbps\": %.0f, "
                  "\"barrier_timed_out\": %s}\n",
                  kModeNames[mode], cold ? "cold" : "warm", kept,
                  double(kBlocks) * kept * kChunkBytes / 1e6,
                  resident, streamed_mb, steps, set_aside_mb, median, median / steps,
                  streamed_mb * steps / median * 1e3, failed ? "true" : "false");
      std::fflush(stdout);
    }
  }
  return 0;
}
