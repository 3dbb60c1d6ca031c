// W4A16 linear on the compressed-tensors layout as published (packed i32 [N, K/8], nibble j of
// word c = column 8c+j stored as q+8; f32 scales [N, K/group]). Small T (decode, verify): one
// warp per output row streams the row's words once per 8 tokens and dequantises in registers
// with fp32 accumulation. Large T (prefill): the weight is dequantised to a bf16 scratch
// matrix and multiplied with cuBLAS (a tensor-core W4A16 GEMM is future work).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

namespace {

constexpr int kTokensPerPass = 8;

__global__ void w4a16_gemv_kernel(const bf16* x, const uint32_t* packed, const float* scales, bf16* out, int T, int N,
                                  int K, int group) {
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (n >= N) return;
  const int words = K / 8, groups = K / group;
  const uint32_t* row = packed + int64_t(n) * words;
  const float* srow = scales + int64_t(n) * groups;
  for (int t0 = 0; t0 < T; t0 += kTokensPerPass) {
    const int tt_n = min(kTokensPerPass, T - t0);
    float acc[kTokensPerPass];
#pragma unroll
    for (int tt = 0; tt < kTokensPerPass; ++tt) acc[tt] = 0.f;
    for (int c = lane; c < words; c += 32) {
      const uint32_t word = __ldg(row + c);
      const float s = __ldg(srow + (c * 8) / group);
      float w[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j] = static_cast<float>(static_cast<int>((word >> (4 * j)) & 15u) - 8) * s;
#pragma unroll
      for (int tt = 0; tt < kTokensPerPass; ++tt) {
        if (tt < tt_n) {
          const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x + int64_t(t0 + tt) * K + c * 8));
          const bf16* xv = reinterpret_cast<const bf16*>(&raw);
          float a = acc[tt];
#pragma unroll
          for (int j = 0; j < 8; ++j) a += w[j] * to_f32(xv[j]);
          acc[tt] = a;
        }
      }
    }
#pragma unroll
    for (int tt = 0; tt < kTokensPerPass; ++tt) {
      const float v = warp_sum(acc[tt]);
      if (lane == 0 && tt < tt_n) out[int64_t(t0 + tt) * N + n] = to_bf16(v);
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
  DS_ASSERT(K % 8 == 0 && group % 8 == 0 && K % group == 0, "W4A16 needs K %% 8 == 0 and whole groups (K %d, group %d)",
            K, group);
  const int warps_per_block = 8;
  w4a16_gemv_kernel<<<(N + warps_per_block - 1) / warps_per_block, 32 * warps_per_block, 0, s>>>(x, packed, scales,
                                                                                                  out, T, N, K, group);
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
