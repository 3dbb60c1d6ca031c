// Dense bf16 linear for few output rows and few tokens (the GDN in_proj_b + in_proj_a, N = 2 Hv):
// a block per output row and pass of up to 8 tokens reads the row once and reduces the pass's dot
// products, one launch where cuBLAS takes a split-K GEMM plus its reduction kernel. The rows may
// be the parts of a fused weight (GemvOut).
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv_out.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda {

namespace {

constexpr int kThreads = 256;

constexpr int kPreloaded = 4;   // weight vectors a thread loads before pdl_wait (all of K <= 8,192)
constexpr int kPassTokens = 8;  // the most tokens a block takes

// Block (n, p): out[t, n] = sum_k x[t, k] w[n, k] for the pass's tokens t = p MaxT .. min(T, (p +
// 1) MaxT) - 1 (T <= kSmallGemvMaxTokens; MaxT 1 where T is 1, else kPassTokens), 16-byte vectors
// (K % 8 == 0), fp32 accumulation. The row's first vectors load before pdl_wait (no kernel writes
// weights). sm_90a registers: 36-39 at one token, 85-99 at eight, against 64 / 121 / 193 (1 / 8 /
// 16 tokens) when a block took a row and looped over every pass, keeping the preloaded vectors and
// more across passes; 85 x 256 fit an SM beside two 256-thread blocks of 80 (the split GEMV
// launches that the independent form runs beside). Against that form on an H100: in_proj_b/a 4.60
// us a launch at C32 (7.65 in s67), C2 at 1k 6.21-6.25 ms against 6.25-6.30, C16 9.75-9.78 against
// 9.85-9.86, verify 4 at 4k 6.50-6.54 against 6.55-6.56, the rest even or within the spread
// (docs/perf/2026-12-06-s68-cuda-27b.md).
//
// Independent (launch_small_gemv): no wait before the work, one at the end, and x read from L2; it
// also lets the next kernel launch at once (pdl_trigger first), so that kernel's blocks are
// resident, and have loaded what they may before their pdl_wait, when the kernel before this one
// ends (their pdl_wait still returns only once this one has ended). The GDN layer's conv1d after
// in_proj_b/a: C1 5.60-5.65 against 5.70-5.73 ms, verify 1 at 4k 5.65-5.66 against 5.77, verify 8
// 6.59-6.62 against 6.64-6.69, C8 6.92-6.98 against 7.03-7.06 on the H200
// (docs/perf/2026-12-03-s29-cuda-27b.md). The conv1d triggering first as well lost that again.
template <bool Independent, int MaxT>
__global__ void __launch_bounds__(kThreads) small_gemv_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                              OutParts out, int T, int K) {
  __shared__ float red[kThreads / 32][MaxT];
  const int n = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t0 = blockIdx.y * MaxT, nt = min(MaxT, T - t0);  // the pass's tokens t0 .. t0 + nt - 1
  const uint4* wr = reinterpret_cast<const uint4*>(w + int64_t(n) * K);
  if constexpr (Independent) pdl_trigger();
  uint4 pre[kPreloaded];
#pragma unroll
  for (int i = 0; i < kPreloaded; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c < K / 8) pre[i] = __ldg(wr + c);
  }
  if constexpr (!Independent) {
    pdl_wait();  // launch.cuh
    pdl_trigger();
  }
  // A deferred norm of x (out.norm): warp 0 asks for the pass's sums now and takes the factors
  // at the end.
  static_assert(MaxT <= 8, "row_parts8 takes the factors of 8 tokens");
  float parts[8];
  const bool scaled = out.scales() && warp == 0;
  if (scaled) out.row_parts8(t0, T, parts);
  float acc[MaxT];
#pragma unroll
  for (int t = 0; t < MaxT; ++t) acc[t] = 0.f;
  // acc[t] += the dot product of weight vector c (wv) with x[t0 + t]'s. Every token's vector is
  // loaded before the first is used (tokens past the pass's load its last one's and are not
  // added), so a weight vector costs one L2 round trip, not one a token. With each token's load
  // and sum behind a branch of its own, this kernel ended 2.9 us after the GEMV it runs beside at
  // 8 tokens (0.4 us now, 0.3 at one token): verify 8 7.34 against 7.23 ms, C8 7.80 against 7.67
  // on the H200 (docs/perf/2026-12-01-s16-cuda-27b.md).
  auto accumulate = [&](int c, const uint4& wv) {
    const bf16* wb = reinterpret_cast<const bf16*>(&wv);
    uint4 xv[MaxT];
#pragma unroll
    for (int t = 0; t < MaxT; ++t) {
      const uint4* xp = reinterpret_cast<const uint4*>(x + int64_t(t0 + min(t, nt - 1)) * K) + c;
      xv[t] = Independent ? __ldcg(xp) : __ldg(xp);
    }
#pragma unroll
    for (int t = 0; t < MaxT; ++t) {
      if (t < nt) {
        const bf16* xb = reinterpret_cast<const bf16*>(&xv[t]);
        float a = acc[t];
#pragma unroll
        for (int e = 0; e < 8; ++e) a += to_f32(wb[e]) * to_f32(xb[e]);
        acc[t] = a;
      }
    }
  };
#pragma unroll
  for (int i = 0; i < kPreloaded; ++i) {
    const int c = threadIdx.x + i * kThreads;
    if (c < K / 8) accumulate(c, pre[i]);
  }
  for (int c = threadIdx.x + kPreloaded * kThreads; c < K / 8; c += kThreads) accumulate(c, __ldg(wr + c));
#pragma unroll
  for (int t = 0; t < MaxT; ++t) {
    const float v = warp_sum(acc[t]);
    if (lane == 0) red[warp][t] = v;
  }
  __syncthreads();
  if (warp == 0) {
    float r = 1.f;  // lane t's factor, of token t0 + t
    if (scaled)
      out.row_factors8(t0, T, parts, [&](int i, float f) {
        if (lane == i) r = f;
      });
    if (lane < nt) {
      float v = 0.f;
#pragma unroll
      for (int i = 0; i < kThreads / 32; ++i) v += red[i][lane];
      out.store(t0 + lane, n, v * r);
    }
  }
  // The grid must not end before the previous kernel: the kernel after waits for this one only.
  if constexpr (Independent) pdl_wait();
}

}  // namespace

bool small_gemv_supported(const void* x, const void* w, int T, int N, int K) {
  const bool aligned = aligned16(x) && aligned16(w);
  return aligned && T >= 1 && T <= kSmallGemvMaxTokens && N <= kSmallGemvMaxRows && K % 8 == 0;
}

void launch_small_gemv(const bf16* x, const bf16* w, const GemvOut& out, int T, int N, int K, cudaStream_t s,
                       bool independent) {
  DS_ASSERT(small_gemv_supported(x, w, T, N, K), "small GEMV: T %d, N %d, K %d", T, N, K);
  // Kernels by the most tokens they load a weight vector for (accumulate loads them all); a block
  // a row and pass of up to kPassTokens.
  auto* kernel = T == 1 ? (independent ? small_gemv_kernel<true, 1> : small_gemv_kernel<false, 1>)
                        : (independent ? small_gemv_kernel<true, kPassTokens> : small_gemv_kernel<false, kPassTokens>);
  const int passes = (T + kPassTokens - 1) / kPassTokens;
  launch_kernel("small_gemv", kernel, dim3(N, passes), kThreads, 0, s, x, w, out_parts(out, N), T, K);
}

}  // namespace ds::cuda
