// Int8 group-128 vocabulary tables (embedding and lm_head), quantised at load from bf16:
// q i8 [V, H] row-major and f32 scales [V, H/128], exactly as ops/int8_rows.h defines them.
// The lm_head runs the tensor-core GEMV of qgemv_kernel.cuh for up to 64 rows, and larger
// batches dequantise blocks of rows to bf16 for cuBLAS; the embedding dequantises on gather.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/qgemv_kernel.cuh"

namespace ds::cuda {

namespace {

using qgemv::Int8Rows;
constexpr int kChunksInFlight = 2;  // 2 KB of weights per warp in flight

// One warp per (row, group of 128): lane l quantises columns 4l .. 4l + 3.
__global__ void int8_quantize_rows_kernel(const bf16* w, int8_t* q, float* scales, int64_t n_groups_total) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; i < n_groups_total; i += warps) {
    const int64_t base = i * 128 + 4 * lane;  // groups tile each row, so group i starts at 128 i
    float v[4], m = 0.f;
    for (int e = 0; e < 4; ++e) {
      v[e] = to_f32(w[base + e]);
      m = fmaxf(m, fabsf(v[e]));
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float scale = m / 127.f;
    uint32_t packed = 0;
    for (int e = 0; e < 4; ++e) {
      const float r = m > 0.f ? fminf(fmaxf(rintf(v[e] / scale), -127.f), 127.f) : 0.f;
      packed |= (static_cast<uint32_t>(static_cast<int>(r)) & 0xFFu) << (8 * e);
    }
    reinterpret_cast<uint32_t*>(q)[base / 4] = packed;
    if (lane == 0) scales[i] = scale;
  }
}

// Rows [row0, row0 + rows) of the table -> bf16 [rows, H]; one thread per 4 columns.
__global__ void int8_dequant_rows_kernel(const int8_t* q, const float* scales, bf16* w, int64_t row0, int64_t n4, int H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = 4 * i, r = e / H, k = e % H;
    const uint32_t v = reinterpret_cast<const uint32_t*>(q + (row0 + r) * H)[k / 4];
    const float s = scales[(row0 + r) * (H / 128) + k / 128];
    for (int m = 0; m < 4; ++m) w[e + m] = to_bf16(static_cast<float>(static_cast<int8_t>(v >> (8 * m))) * s);
  }
}

// One block per token: out[t, :] = q[ids[t], :] * scale, 4 columns per thread and step.
__global__ void int8_embedding_kernel(const int8_t* q, const float* scales, const int32_t* ids, bf16* out, int H) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int t = blockIdx.x;
  const int64_t row = ids[t];
  const uint32_t* src = reinterpret_cast<const uint32_t*>(q + row * H);
  for (int k4 = threadIdx.x; k4 < H / 4; k4 += blockDim.x) {
    const uint32_t v = src[k4];
    const float s = scales[row * (H / 128) + (4 * k4) / 128];
    __nv_bfloat162 lo = __floats2bfloat162_rn(static_cast<float>(static_cast<int8_t>(v)) * s,
                                              static_cast<float>(static_cast<int8_t>(v >> 8)) * s);
    __nv_bfloat162 hi = __floats2bfloat162_rn(static_cast<float>(static_cast<int8_t>(v >> 16)) * s,
                                              static_cast<float>(static_cast<int8_t>(v >> 24)) * s);
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(out + int64_t(t) * H + 4 * k4);
    dst[0] = lo;
    dst[1] = hi;
  }
}

int grid_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + 255) / 256, 65535 * 8)); }

template <int NT>
void launch_nt(const Int8Rows& w, const bf16* x, const OutParts& o, float* partial, int* counters, int splits, int T,
               int N, int K, cudaStream_t s) {
  qgemv::launch<Int8Rows, NT, kChunksInFlight>(w, x, o, partial, counters, splits, T, N, K, s);
}

template <int NT>
int resident() {
  return qgemv::resident_blocks<Int8Rows, NT, kChunksInFlight>();
}

}  // namespace

void launch_int8_quantize_rows(const bf16* w, int8_t* q, float* scales, int64_t rows, int H, cudaStream_t s) {
  DS_ASSERT(H % 128 == 0, "int8 rows need whole groups of 128 (H %d)", H);
  const int64_t n_groups_total = rows * (H / 128);
  const int blocks = static_cast<int>(std::min<int64_t>((n_groups_total + 7) / 8, 65535 * 8));
  int8_quantize_rows_kernel<<<blocks, 256, 0, s>>>(w, q, scales, n_groups_total);
  cuda_check_launch("int8_quantize_rows", s);
}

int int8_gemv_splits(int T, int N, int K) {
  const int r = T <= 8 ? resident<1>() : T <= 16 ? resident<2>() : T <= 32 ? resident<4>() : resident<8>();
  return qgemv::choose_splits(r, T, N, K, kGemvMaxSplitTiles);
}

void launch_int8_gemv(const bf16* x, const int8_t* q, const float* scales, bf16* out, float* partial, int* counters,
                      int splits, int T, int N, int K, cudaStream_t s) {
  if (T == 0) return;
  DS_ASSERT(T <= kInt8GemvMaxTokens && K % 128 == 0, "int8 GEMV: T %d, K %d", T, K);
  DS_ASSERT(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(partial) % 16 == 0,
            "int8 GEMV: x and the partials must be 16-byte aligned");
  const Int8Rows w{q, scales, K, K / 128};
  const OutParts o = out_parts(GemvOut::whole(out, N), N);
  if (T <= 8) launch_nt<1>(w, x, o, partial, counters, splits, T, N, K, s);
  else if (T <= 16) launch_nt<2>(w, x, o, partial, counters, splits, T, N, K, s);
  else if (T <= 32) launch_nt<4>(w, x, o, partial, counters, splits, T, N, K, s);
  else launch_nt<8>(w, x, o, partial, counters, splits, T, N, K, s);
}

void launch_int8_dequant_rows(const int8_t* q, const float* scales, bf16* w, int64_t row0, int rows, int H,
                              cudaStream_t s) {
  const int64_t n4 = int64_t(rows) * H / 4;
  if (n4 == 0) return;
  int8_dequant_rows_kernel<<<grid_for(n4), 256, 0, s>>>(q, scales, w, row0, n4, H);
  cuda_check_launch("int8_dequant_rows", s);
}

void launch_int8_embedding(const int8_t* q, const float* scales, const int32_t* ids, bf16* out, int T, int H,
                           cudaStream_t s) {
  if (T == 0) return;
  launch_kernel("int8_embedding", int8_embedding_kernel, T, 256, 0, s, q, scales, ids, out, H);
}

}  // namespace ds::cuda
