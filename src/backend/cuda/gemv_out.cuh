// OutParts: the kernels' view of a GEMV's GemvOut (launchers.h), the output rows of a weight cut
// into parts (a fused weight, Ops::linear_parts), and the conv1d a split-K epilogue may apply to
// the first part. Used by the quantized GEMV (qgemv_kernel.cuh) and the small dense GEMV
// (small_gemv.cu).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/conv1d.cuh"
#include "backend/cuda/launchers.h"
#include "core/check.h"

namespace ds::cuda {

// Where output row n of token t is stored: part p holds rows [end[p - 1], end[p]) (end[-1] = 0)
// as bf16 [T, end[p] - end[p - 1]]; n_parts 1 is a plain [T, N] output. swiglu (GemvOut::swiglu,
// a paired weight): only silu(gate) * up of each pair of rows, bf16 [T, N / 2] (store_swiglu).
struct OutParts {
  __nv_bfloat16* ptr[kGemvMaxParts];
  int end[kGemvMaxParts];
  int n_parts;
  __nv_bfloat16* swiglu;
  GemvConv conv;  // conv.out null: none

  __device__ __forceinline__ void store(int t, int n, float v) const {
    __nv_bfloat16* base = ptr[0];
    int begin = 0, width = end[0];
#pragma unroll
    for (int p = 1; p < kGemvMaxParts; ++p)
      if (p < n_parts && n >= end[p - 1]) {
        base = ptr[p];
        begin = end[p - 1];
        width = end[p] - end[p - 1];
      }
    base[int64_t(t) * width + (n - begin)] = to_bf16(v);
  }
  // swiglu[t, col] = silu(gate) * up of the pair's fp32 sums, each rounded to bf16 first (as the
  // GEMV's parts and then launch_silu_mul would give).
  __device__ __forceinline__ void store_swiglu(int t, int col, float gate, float up) const {
    swiglu[int64_t(t) * (end[0] / 2) + col] = swiglu_bf16(to_f32(to_bf16(gate)), to_f32(to_bf16(up)));
  }
  // GemvOut::conv of rows [n0, n1) of the weight, those below conv.C, by every thread of the
  // block (a channel and sequence each), once the rows are stored in part 0 (mixed, bf16 [T, C])
  // and visible to the block.
  __device__ __forceinline__ void conv_rows(int n0, int n1) const {
    const int n = min(n1, conv.C) - n0;
    for (int i = threadIdx.x; i < n * conv.n_seqs; i += blockDim.x) {
      const int c = n0 + i % n;
      const ConvSeq q = conv_seq(i / n, conv.state, conv.cu_seqlens, conv.n_past, conv.slots, conv.C, conv.K);
      if (q.T == 0) continue;
      ConvWalk walk;
      walk.load(conv.w, q, c, conv.C, conv.K);
      walk.walk(ptr[0], conv.out, q, c, conv.C, conv.K);
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
  p.conv = o.conv;
  DS_ASSERT(!o.conv.out || (!o.swiglu && o.conv.C == o.rows[0] && o.conv.K <= kMaxShortK),
            "a GEMV's conv output: %d channels of a first part of %d rows, width %d", o.conv.C, o.rows[0], o.conv.K);
  DS_ASSERT(!o.swiglu || (o.n_parts == 1 && N % 16 == 0), "a GEMV's swiglu output: %d parts, N %d", o.n_parts, N);
  return p;
}

}  // namespace ds::cuda
