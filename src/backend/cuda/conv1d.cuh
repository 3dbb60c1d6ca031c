// The causal depthwise conv1d + SiLU of one (sequence, channel) at decode and verify, conv1d.cu's
// one-thread walk: the window [conv state; the sequence's tokens] in registers, the products
// summed in order j = 0 .. K - 1, then the last K - 1 rows stored as the new state.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

constexpr int kMaxShortK = kConvMaxShortK;

// Sequence s of a step: its new tokens [t0, t0 + T) and its conv state, R = K - 1 rows in slot
// slots[s] (read as zeros for a fresh sequence, n_past 0).
struct ConvSeq {
  int t0, T, R;
  bf16* state;
  bool fresh;
};
__device__ __forceinline__ ConvSeq conv_seq(int s, bf16* state, const int32_t* cu_seqlens, const int32_t* n_past,
                                            const int32_t* slots, int C, int K) {
  const int t0 = cu_seqlens[s], R = K - 1;
  return {t0, cu_seqlens[s + 1] - t0, R, state + int64_t(slots[s]) * R * C, n_past[s] == 0};
}

// Channel c of sequence q: load() takes the weights (f32 [C, K]) and the state rows, which no
// kernel of the step before writes; walk() the tokens' rows of mixed (bf16 [*, C]) in order into
// out (silu of the sum), then the new state.
struct ConvWalk {
  float wk[kMaxShortK], win[kMaxShortK];

  __device__ __forceinline__ void load(const float* w, const ConvSeq& q, int c, int C, int K) {
#pragma unroll
    for (int j = 0; j < kMaxShortK; ++j) {
      wk[j] = j < K ? w[int64_t(c) * K + j] : 0.f;
      win[j] = j < q.R && !q.fresh ? to_f32(q.state[int64_t(j) * C + c]) : 0.f;
    }
  }
  __device__ __forceinline__ void walk(const bf16* mixed, bf16* out, const ConvSeq& q, int c, int C, int K) {
    for (int t = q.t0; t < q.t0 + q.T; ++t) {
#pragma unroll
      for (int j = 0; j < kMaxShortK; ++j)
        if (j == q.R) win[j] = to_f32(mixed[int64_t(t) * C + c]);
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < kMaxShortK; ++j)
        if (j < K) acc += wk[j] * win[j];
      out[int64_t(t) * C + c] = to_bf16(silu_f(acc));
#pragma unroll
      for (int j = 0; j + 1 < kMaxShortK; ++j)
        if (j < q.R) win[j] = win[j + 1];
    }
#pragma unroll
    for (int j = 0; j < kMaxShortK; ++j)
      if (j < q.R) q.state[int64_t(j) * C + c] = to_bf16(win[j]);
  }
};

}  // namespace ds::cuda
