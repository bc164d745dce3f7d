// Does a 2:4-sparse int8 WGMMA compute what the stacked walk would ask of it?
//
// The stacked int8-planes walk stacks 32 requests' two z planes on the WGMMA's 64 rows;
// at B <= 16 half of them are dead. The sparse design puts each live row's two K halves
// on two rows instead: rows of warps 0-1 take positions 0 and 1 of every group of four
// K positions, rows of warps 2-3 positions 2 and 3, so a W2 tile's chain is four
// `m64n64k64` sparse WGMMAs (the products of eight dense `m64n64k32` on half the rows).
// Its compressed A is the z fragments the dense chain reads (four bytes of K a
// register), its metadata one constant a warp (0x44444444: positions 0, 1; 0xEEEEEEEE:
// 2, 3), so which of a group of four threads holds the metadata does not matter.
//
// This program runs one warpgroup's chain on a W2 tile stored as the walk stores it
// (K-major, 128-byte swizzle, two 128-byte K blocks of 64 rows) with random int8 A and
// B, and compares the int32 accumulators with the products computed on the host under
// that reading of the PTX ISA. It prints one JSON line: the mismatches and the first
// few (row, column, got, expected). (ptxas takes only selector 0 for integer types.)
//
// Build and run on the GPU: nvcc -O3 -gencode arch=compute_90a,code=sm_90a \
//   -o /tmp/wgmma_sparse tools/wgmma_sparse_layout_probe.cu && /tmp/wgmma_sparse

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_probe.cuh"

namespace {

constexpr int kRows = 64;          // the WGMMA's M: z's stacked rows
constexpr int kCols = 64;          // its N: a W2 tile's rows
constexpr int kRank = 256;         // K: the tile's row length in int8
constexpr int kSteps = 4;          // sparse m64n64k64 instructions a tile
constexpr int kTileBytes = kCols * kRank;
constexpr uint32_t kMetaLow = 0x44444444u;    // every group: positions 0 and 1
constexpr uint32_t kMetaHigh = 0xEEEEEEEEu;   // every group: positions 2 and 3

// Where byte (n, k) of a [64, 256] int8 tile lies in shared memory: two K blocks of
// 128 bytes, each 64 rows of 128 bytes in 8-row groups of 1024 bytes, 16-byte chunks
// XOR-swizzled by the row within its group (TMA's 128-byte swizzle).
int swizzled_offset(int n, int k) {
  const int block = k / 128, column = k % 128;
  return block * (kCols * 128) + (n / 8) * 1024 + (n % 8) * 128
         + (((column / 16) ^ (n % 8)) * 16) + column % 16;
}

__device__ uint64_t descriptor(uint32_t address) {
  return (static_cast<uint64_t>((address & 0x3FFFF) >> 4))
         | (static_cast<uint64_t>(1) << 16)
         | (static_cast<uint64_t>(1024 >> 4) << 32)
         | (static_cast<uint64_t>(1) << 62);
}

// One sparse m64n64k64 s8 WGMMA into `acc` (sparsity selector 0).
__device__ __forceinline__ void sparse_wgmma(int32_t* acc, const uint32_t* a,
                                             uint64_t bdesc, uint32_t meta) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sp.sync.aligned.m64n64k64.s32.s8.s8 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, %37, 0, p; }\n"
      : "+r"(acc[0]), "+r"(acc[1]), "+r"(acc[2]), "+r"(acc[3]), "+r"(acc[4]),
        "+r"(acc[5]), "+r"(acc[6]), "+r"(acc[7]), "+r"(acc[8]), "+r"(acc[9]),
        "+r"(acc[10]), "+r"(acc[11]), "+r"(acc[12]), "+r"(acc[13]), "+r"(acc[14]),
        "+r"(acc[15]), "+r"(acc[16]), "+r"(acc[17]), "+r"(acc[18]), "+r"(acc[19]),
        "+r"(acc[20]), "+r"(acc[21]), "+r"(acc[22]), "+r"(acc[23]), "+r"(acc[24]),
        "+r"(acc[25]), "+r"(acc[26]), "+r"(acc[27]), "+r"(acc[28]), "+r"(acc[29]),
        "+r"(acc[30]), "+r"(acc[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bdesc), "r"(meta));
}

// `compressed` [64 rows][128 bytes]: row m's compressed A, 32 bytes an instruction.
// `tile` the swizzled W2 tile. `out` [64][64] int32 accumulators by (row, column).
__global__ void __launch_bounds__(128) chain(const int8_t* compressed, const int8_t* tile,
                                             int32_t* out) {
  __shared__ __align__(1024) int8_t tile_s[kTileBytes];
  for (int i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(tile_s)[i] = reinterpret_cast<const uint32_t*>(tile)[i];
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, q = lane % 4;
  const int row = 16 * warp + g;
  const uint32_t meta = warp < 2 ? kMetaLow : kMetaHigh;
  const uint32_t tile_at = smem_address(tile_s);
  int32_t acc[32] = {};
  uint32_t a[kSteps][4];
  for (int i = 0; i < kSteps; ++i) {   // the dense m64k32 int8 A fragment of 32 bytes
    const int8_t* low = compressed + row * 128 + 32 * i;
    const int8_t* high = compressed + (row + 8) * 128 + 32 * i;
    a[i][0] = *reinterpret_cast<const uint32_t*>(low + 4 * q);
    a[i][1] = *reinterpret_cast<const uint32_t*>(high + 4 * q);
    a[i][2] = *reinterpret_cast<const uint32_t*>(low + 16 + 4 * q);
    a[i][3] = *reinterpret_cast<const uint32_t*>(high + 16 + 4 * q);
  }
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    // K' 64 bytes an instruction: 0 and 64 in the first 128-byte block, then the second.
    const uint32_t at = tile_at + (i / 2) * (kCols * 128) + (i % 2) * 64;
    sparse_wgmma(acc, a[i], descriptor(at), meta);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  for (int j = 0; j < 8; ++j) {   // accumulator (row, 8j + 2q + c) and (row + 8, ...)
    for (int c = 0; c < 2; ++c) {
      out[row * kCols + 8 * j + 2 * q + c] = acc[4 * j + c];
      out[(row + 8) * kCols + 8 * j + 2 * q + c] = acc[4 * j + 2 + c];
    }
  }
}

int mismatches(const std::vector<int8_t>& compressed, const std::vector<int8_t>& swizzled,
               const std::vector<int32_t>& expected, int8_t* d_compressed, int8_t* d_tile,
               int32_t* d_out, std::vector<int32_t>& got) {
  CHECK(cudaMemcpy(d_compressed, compressed.data(), compressed.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_tile, swizzled.data(), swizzled.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(d_out, 0, kRows * kCols * 4));
  chain<<<1, 128>>>(d_compressed, d_tile, d_out);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpy(got.data(), d_out, kRows * kCols * 4, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < kRows * kCols; ++i) bad += got[i] != expected[i];
  return bad;
}

}  // namespace

int main() {
  std::mt19937 random(7);
  std::uniform_int_distribution<int> byte(-128, 127);
  std::vector<int8_t> compressed(kRows * 128), tile(kTileBytes), swizzled(kTileBytes);
  for (auto& v : compressed) v = static_cast<int8_t>(byte(random));
  for (auto& v : tile) v = static_cast<int8_t>(byte(random));
  for (int n = 0; n < kCols; ++n) {
    for (int k = 0; k < kRank; ++k) swizzled[swizzled_offset(n, k)] = tile[n * kRank + k];
  }
  // The products under the design's reading: row m's compressed byte 2j + e (j a group
  // of the whole row's 64) meets K position 4j + e (warps 0-1) or 4j + 2 + e (warps 2-3).
  std::vector<int32_t> expected(kRows * kCols), got(kRows * kCols);
  for (int m = 0; m < kRows; ++m) {
    const int offset = (m / 16) < 2 ? 0 : 2;
    for (int n = 0; n < kCols; ++n) {
      int32_t sum = 0;
      for (int j = 0; j < kRank / 4; ++j) {
        for (int e = 0; e < 2; ++e) {
          sum += static_cast<int32_t>(compressed[m * 128 + 2 * j + e])
                 * static_cast<int32_t>(tile[n * kRank + 4 * j + offset + e]);
        }
      }
      expected[m * kCols + n] = sum;
    }
  }
  int8_t *d_compressed, *d_tile;
  int32_t* d_out;
  CHECK(cudaMalloc(&d_compressed, compressed.size()));
  CHECK(cudaMalloc(&d_tile, kTileBytes));
  CHECK(cudaMalloc(&d_out, kRows * kCols * 4));
  const int bad = mismatches(compressed, swizzled, expected, d_compressed, d_tile, d_out, got);
  std::printf("{\"mismatches\": %d, \"of\": %d, \"first\": [", bad,
              kRows * kCols);
  int shown = 0;
  for (int i = 0; i < kRows * kCols && shown < 6; ++i) {
    if (got[i] != expected[i]) {
      std::printf("%s[%d, %d, %d, %d]", shown ? ", " : "", i / kCols, i % kCols, got[i],
                  expected[i]);
      ++shown;
    }
  }
  std::printf("]}\n");
  return bad == 0 ? 0 : 1;
}
