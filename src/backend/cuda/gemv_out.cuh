// OutParts: the kernels' view of a GEMV's GemvOut (launchers.h), the output rows of a weight cut
// into parts (a fused weight, Ops::linear_parts), and the deferred norm an epilogue makes or
// applies (GemvNorm). Used by the quantized GEMV (qgemv_kernel.cuh) and the small dense GEMV
// (small_gemv.cu).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launchers.h"
#include "core/check.h"

namespace ds::cuda {

// Where output row n of token t is stored: part p holds rows [end[p - 1], end[p]) (end[-1] = 0)
// as bf16 [T, end[p] - end[p - 1]]; n_parts 1 is a plain [T, N] output. swiglu (GemvOut::swiglu,
// a paired weight): only silu(gate) * up of each pair of rows, bf16 [T, N / 2] (store_swiglu).
// f16: GemvOut::f16.
struct OutParts {
  __nv_bfloat16* ptr[kGemvMaxParts];
  int end[kGemvMaxParts];
  int n_parts;
  __nv_bfloat16* swiglu;
  GemvNorm norm;  // norm.ss null: none; norm.x set: the producer's epilogue, else a consumer's scale
  __half* f16;

  // A consumer's factor of the outputs of token t (GemvNorm; norm.parts <= kGemvNormMaxParts), the
  // same t in every lane and the whole warp calling: lane l loads parts l and l + 32, then the
  // warp's sum (in this order wherever a factor is taken).
  __device__ __forceinline__ float row_scale(int t, int T) const { return row_factor(row_part(t, T)); }
  // row_scale in two steps: the lane's parts (its loads; 0 unless `on`), then the warp's sum.
  __device__ __forceinline__ float row_part(int t, int T, bool on = true) const {
    const int lane = threadIdx.x % 32;
    const float a = on && lane < norm.parts ? norm.ss[lane * T + t] : 0.f;
    const float b = on && lane + 32 < norm.parts ? norm.ss[(lane + 32) * T + t] : 0.f;
    return a + b;
  }
  __device__ __forceinline__ float row_factor(float part) const {
    return rsqrtf(warp_sum(part) * norm.inv_d + norm.eps);
  }
  // row_scale of tokens t0 .. t0 + 7 (those below T) in two steps: the lane's loads of them all
  // (row_parts8, in flight at once), then each factor handed to take(i, factor) of token t0 + i
  // (no array of factors: the kernels kept one in local memory); the whole warp calls both.
  __device__ __forceinline__ void row_parts8(int t0, int T, float (&v)[8]) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = row_part(t0 + i, T, t0 + i < T);
  }
  template <class Take>
  __device__ __forceinline__ void row_factors8(int t0, int T, const float (&v)[8], Take&& take) const {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (t0 + i < T) take(i, row_factor(v[i]));
  }
  template <class Take>
  __device__ __forceinline__ void row_scales8(int t0, int T, Take&& take) const {
    float v[8];
    row_parts8(t0, T, v);
    row_factors8(t0, T, v, take);
  }
  __device__ __forceinline__ bool scales() const { return norm.ss && !norm.x; }

  // Where row n's outputs lie: its place in its part for token 0, and the part's width (the row
  // stride of its tokens). An epilogue storing many tokens of a row looks it up once.
  struct Row {
    __nv_bfloat16* at;
    int ld;
    // (A 32-bit offset: a GEMV's outputs, T <= 128 tokens of a part, are far below 2^31 bytes.)
    __device__ __forceinline__ void store(int t, float v) const {
      *reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<char*>(at) + uint32_t(t) * uint32_t(2 * ld)) = to_bf16(v);
    }
  };
  __device__ __forceinline__ Row row(int n) const {
    __nv_bfloat16* base = ptr[0];
    int begin = 0, width = end[0];
#pragma unroll
    for (int p = 1; p < kGemvMaxParts; ++p)
      if (p < n_parts && n >= end[p - 1]) {
        base = ptr[p];
        begin = end[p - 1];
        width = end[p] - end[p - 1];
      }
    return {base + (n - begin), width};
  }
  __device__ __forceinline__ void store(int t, int n, float v) const { row(n).store(t, v); }
  // swiglu[t, col] = silu(gate) * up of the pair's fp32 sums, each rounded to bf16 first (as the
  // GEMV's parts and then launch_silu_mul would give).
  __device__ __forceinline__ void store_swiglu(int t, int col, float gate, float up) const {
    const int64_t at = int64_t(t) * (end[0] / 2) + col;
    const __nv_bfloat16 v = swiglu_bf16(to_f32(to_bf16(gate)), to_f32(to_bf16(up)));
    swiglu[at] = v;
    if (f16) {
      const uint32_t h = bf16x2_to_f16x2_16th(__bfloat16_as_ushort(v));  // the low half: v's
      f16[at] = __ushort_as_half(static_cast<unsigned short>(h));
    }
  }
};

// GemvOut's row counts as row ends, checked against the weight's N rows.
inline OutParts out_parts(const GemvOut& o, int N) {
  DS_ASSERT(o.n_parts >= 1 && o.n_parts <= kGemvMaxParts, "GEMV output parts: %d", o.n_parts);
  OutParts p{};
  int end = 0;
  for (int i = 0; i < o.n_parts; ++i) {
    p.ptr[i] = o.ptr[i];
    end += o.rows[i];
    p.end[i] = end;
  }
  p.n_parts = o.n_parts;
  DS_ASSERT(end == N, "GEMV output parts hold %d rows, the weight %d", end, N);
  p.swiglu = o.swiglu;
  p.norm = o.norm;
  p.f16 = o.f16;
  DS_ASSERT(!o.norm.x || (o.n_parts == 1 && !o.swiglu && N % 4 == 0 && o.norm.w && o.norm.ss),
            "a GEMV's norm output: %d parts, N %d", o.n_parts, N);
  DS_ASSERT(!o.norm.ss || o.norm.x || o.norm.parts > 0, "a GEMV's norm scale from %d parts", o.norm.parts);
  DS_ASSERT(!o.norm.q8 || (o.norm.x && o.norm.q8_scale && N % 64 == 0), "a GEMV's int8 twin: N %d", N);
  DS_ASSERT(!o.swiglu || (o.n_parts == 1 && N % 16 == 0), "a GEMV's swiglu output: %d parts, N %d", o.n_parts, N);
  DS_ASSERT(!o.f16 || o.swiglu || o.norm.x, "a GEMV's fp16 copy of an output other than a norm's or a swiglu");
  return p;
}

}  // namespace ds::cuda
