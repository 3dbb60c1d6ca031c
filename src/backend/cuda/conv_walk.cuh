// The causal conv1d + SiLU of one (sequence, channel) at decode and verify, shared by the conv
// kernels (conv1d.cu) and the one-token GDN decode kernel that convolves its own inputs
// (gdn_recurrent.cu, GdnConv): the window [conv state; the sequence's tokens] in registers, the
// products summed in order j = 0 .. K - 1, then the last K - 1 rows stored as the new state. The
// same arithmetic in both, so their outputs and states are the same bits.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

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

// Channel c of sequence q, conv widths K <= MaxK: load() takes the weights (f32 [C, K]) and the
// state rows, which no kernel of the step before writes; step() takes a token's pre-conv value
// and gives silu of the sum (bf16); walk() runs the tokens' rows of mixed (bf16 [*, C]) in order
// into out, then stores the new state (store_state).
template <int MaxK>
struct ConvWalk {
  float wk[MaxK], win[MaxK];

  __device__ __forceinline__ void load(const float* w, const ConvSeq& q, int c, int C, int K) {
#pragma unroll
    for (int j = 0; j < MaxK; ++j) {
      wk[j] = j < K ? w[int64_t(c) * K + j] : 0.f;
      win[j] = j < q.R && !q.fresh ? to_f32(q.state[int64_t(j) * C + c]) : 0.f;
    }
  }
  __device__ __forceinline__ bf16 step(float x, int R, int K) {
#pragma unroll
    for (int j = 0; j < MaxK; ++j)
      if (j == R) win[j] = x;
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < MaxK; ++j)
      if (j < K) acc += wk[j] * win[j];
#pragma unroll
    for (int j = 0; j + 1 < MaxK; ++j)
      if (j < R) win[j] = win[j + 1];
    return to_bf16(silu_f(acc));
  }
  // Row j < R of the new state (after the step's tokens).
  __device__ __forceinline__ bf16 state_row(int j) const { return to_bf16(win[j]); }
  __device__ __forceinline__ void store_state(const ConvSeq& q, int c, int C) const {
#pragma unroll
    for (int j = 0; j < MaxK; ++j)
      if (j < q.R) q.state[int64_t(j) * C + c] = state_row(j);
  }
  __device__ __forceinline__ void walk(const bf16* mixed, bf16* out, const ConvSeq& q, int c, int C, int K) {
    for (int t = q.t0; t < q.t0 + q.T; ++t) out[int64_t(t) * C + c] = step(to_f32(mixed[int64_t(t) * C + c]), q.R, K);
    store_state(q, c, C);
  }
};

}  // namespace ds::cuda
