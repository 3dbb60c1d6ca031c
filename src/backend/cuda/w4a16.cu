// W4A16 linear on the compressed-tensors layout as published (packed i32 [N, K/8], nibble j of
// word c = column 8c+j stored as q+8; f32 scales [N, K/group]). Small T (decode, verify): each
// block stages x in shared memory and its warps stream 4 weight rows each, once per 8 tokens,
// dequantising in registers with fp32 accumulation. Large T (prefill): the weight is dequantised to a bf16 scratch
// matrix and multiplied with cuBLAS (a tensor-core W4A16 GEMM is future work).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

namespace {

constexpr int kTokensPerPass = 8;   // tokens sharing one pass over the weights
constexpr int kRowsPerWarp = 4;     // output rows per warp
constexpr int kWarps = 8;           // warps per block: 32 rows share each x tile
constexpr int kTileWords = 128;     // packed words (1024 columns) per x tile in shared memory

// Block: kWarps * kRowsPerWarp output rows. For each pass of up to 8 tokens, x is staged in
// shared memory 1024 columns at a time (16 KB) and every warp streams its rows' words for that
// tile, dequantising in registers; lanes keep partial sums and reduce once at the end.
__global__ void __launch_bounds__(kWarps * 32) w4a16_gemv_kernel(const bf16* x, const uint32_t* packed,
                                                                const float* scales, bf16* out, int T, int N,
                                                                int K, int group) {
  __shared__ uint4 xs[kTokensPerPass][kTileWords];  // 8 bf16 per uint4: x[t, 8c .. 8c+7]
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kWarps + warp) * kRowsPerWarp;
  const int words = K / 8, groups = K / group;
  for (int t0 = 0; t0 < T; t0 += kTokensPerPass) {
    const int tt_n = min(kTokensPerPass, T - t0);
    float acc[kRowsPerWarp][kTokensPerPass];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int tt = 0; tt < kTokensPerPass; ++tt) acc[r][tt] = 0.f;
    for (int c0 = 0; c0 < words; c0 += kTileWords) {
      const int tile = min(kTileWords, words - c0);
      __syncthreads();  // the previous tile is no longer read
      for (int i = threadIdx.x; i < tt_n * tile; i += blockDim.x) {
        const int tt = i / tile, c = i % tile;
        xs[tt][c] = __ldg(reinterpret_cast<const uint4*>(x + int64_t(t0 + tt) * K) + c0 + c);
      }
      __syncthreads();
      // Lane owns words [4 lane, 4 lane + 4) of the tile (32 columns, one scale group): one
      // 16-byte load per row, all rows' loads issued before any is used.
      const int c = 4 * lane;
      if (c < tile) {
        uint4 wv[kRowsPerWarp];
        float sc[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const int n = min(row0 + r, N - 1);  // clamped rows are computed and not stored
          wv[r] = __ldg(reinterpret_cast<const uint4*>(packed + int64_t(n) * words + c0 + c));
          sc[r] = __ldg(scales + int64_t(n) * groups + ((c0 + c) * 8) / group);
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const uint32_t ws[4] = {wv[r].x, wv[r].y, wv[r].z, wv[r].w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            float w[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) w[j] = static_cast<float>(static_cast<int>((ws[q] >> (4 * j)) & 15u) - 8) * sc[r];
#pragma unroll
            for (int tt = 0; tt < kTokensPerPass; ++tt) {
              if (tt < tt_n) {
                const uint4 raw = xs[tt][c + q];
                const bf16* xv = reinterpret_cast<const bf16*>(&raw);
                float a = acc[r][tt];
#pragma unroll
                for (int j = 0; j < 8; ++j) a += w[j] * to_f32(xv[j]);
                acc[r][tt] = a;
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int tt = 0; tt < kTokensPerPass; ++tt) {
        const float v = warp_sum(acc[r][tt]);
        if (lane == 0 && tt < tt_n && row0 + r < N) out[int64_t(t0 + tt) * N + row0 + r] = to_bf16(v);
      }
  }
}

// One thread per packed word: 8 bf16 weights.
__global__ void w4a16_dequant_kernel(const uint32_t* packed, const float* scales, bf16* w, int64_t n_words, int K,
                                     int group) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n_words; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / (K / 8), c = i % (K / 8);
    const uint32_t word = packed[i];
    const float s = scales[row * (K / group) + (c * 8) / group];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      w[row * K + c * 8 + j] = to_bf16(static_cast<float>(static_cast<int>((word >> (4 * j)) & 15u) - 8) * s);
  }
}

__global__ void fill_random_bits_kernel(uint32_t* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(i) + 0x632BE59BD9B4E5ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    x[i] = static_cast<uint32_t>(z ^ (z >> 31));
  }
}

}  // namespace

void launch_w4a16_gemv(const bf16* x, const uint32_t* packed, const float* scales, bf16* out, int T, int N, int K,
                       int group, cudaStream_t s) {
  if (T == 0) return;
  DS_ASSERT(K % 32 == 0 && group % 32 == 0 && K % group == 0, "W4A16 GEMV needs K and group multiples of 32 and whole "
            "groups (K %d, group %d)", K, group);
  const int rows_per_block = kWarps * kRowsPerWarp;
  w4a16_gemv_kernel<<<(N + rows_per_block - 1) / rows_per_block, 32 * kWarps, 0, s>>>(x, packed, scales, out, T, N, K,
                                                                                     group);
  cuda_check_launch("w4a16_gemv", s);
}

void launch_w4a16_dequant(const uint32_t* packed, const float* scales, bf16* w, int N, int K, int group,
                          cudaStream_t s) {
  const int64_t n_words = int64_t(N) * (K / 8);
  const int blocks = static_cast<int>(std::min<int64_t>((n_words + 255) / 256, 65535 * 8));
  w4a16_dequant_kernel<<<blocks, 256, 0, s>>>(packed, scales, w, n_words, K, group);
  cuda_check_launch("w4a16_dequant", s);
}

void launch_fill_random_bits(uint32_t* x, int64_t n, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535 * 8));
  fill_random_bits_kernel<<<blocks, 256, 0, s>>>(x, n, seed);
  cuda_check_launch("fill_random_bits", s);
}

}  // namespace ds::cuda
