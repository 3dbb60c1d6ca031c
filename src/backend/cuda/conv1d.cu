// Varlen causal depthwise conv1d + SiLU continuing from each sequence's conv state (the last
// K-1 pre-conv rows), then the state update. Short chunks take one kernel: at a token a sequence
// (decode) a thread walks its (sequence, channel) with the window in registers, at up to
// kConvShortChunk (verify) a block of a sequence's tokens for 32 channels stores the new state
// after a barrier; longer ones take a kernel per (token, channel) and a second for the state, so
// no thread reads a state row another thread has already overwritten. All sum the same products
// in the same order.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/conv_walk.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda {

namespace {

// Row j of sequence s's window [state; mixed rows of s], channel c (state rows are zero for a
// fresh sequence).
__device__ __forceinline__ float window_at(const bf16* mixed, const bf16* state_s, bool fresh, int t0, int R, int j,
                                          int c, int C) {
  if (j < R) return fresh ? 0.f : to_f32(state_s[int64_t(j) * C + c]);
  return to_f32(mixed[int64_t(t0 + j - R) * C + c]);
}

// grid (T, ceil(C / blockDim)): one thread per (token, channel)
__global__ void conv1d_silu_kernel(const bf16* mixed, const float* w, const bf16* state, bf16* out,
                                   const int32_t* seq_of_token, const int32_t* cu_seqlens, const int32_t* n_past,
                                   const int32_t* slots, int C, int K) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int t = blockIdx.x;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int s = seq_of_token[t];
  const int t0 = cu_seqlens[s], R = K - 1;
  const bf16* state_s = state + int64_t(slots[s]) * R * C;
  const bool fresh = n_past[s] == 0;
  float acc = 0.f;
  for (int j = 0; j < K; ++j) acc += w[int64_t(c) * K + j] * window_at(mixed, state_s, fresh, t0, R, (t - t0) + j, c, C);
  out[int64_t(t) * C + c] = to_bf16(silu_f(acc));
}

// grid (n_seqs, ceil(C / blockDim)): the new state is the last R rows of the window. Rows are
// written in ascending order and each reads a row at least as far along, so in-place is safe.
__global__ void conv1d_state_kernel(const bf16* mixed, bf16* state, const int32_t* cu_seqlens, const int32_t* n_past,
                                    const int32_t* slots, int C, int K) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const ConvSeq q = conv_seq(blockIdx.x, state, cu_seqlens, n_past, slots, C, K);
  if (c >= C || q.T == 0) return;
  for (int j = 0; j < q.R; ++j)
    q.state[int64_t(j) * C + c] = to_bf16(window_at(mixed, q.state, q.fresh, q.t0, q.R, q.T + j, c, C));
}

// grid (n_seqs, ceil(C / blockDim)): thread (s, c) convolves the sequence's tokens in order with
// the window [state; tokens] in registers, then stores the last K - 1 rows as the new state.
// The weights and the conv state load before pdl_wait: no kernel writes weights, and no kernel of
// the step but this one writes the layer's conv state (the step plan is written before the step).
// Decode steps (a token a sequence) take it.
__global__ void conv1d_short_kernel(const bf16* mixed, const float* w, bf16* state, bf16* out,
                                    const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int C,
                                    int K) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  const ConvSeq q = conv_seq(blockIdx.x, state, cu_seqlens, n_past, slots, C, K);
  if (c >= C || q.T == 0) return;
  ConvWalk<kConvMaxShortK> walk;
  walk.load(w, q, c, C, K);
  pdl_wait();  // launch.cuh: mixed comes from the kernels before
  pdl_trigger();
  walk.walk(mixed, out, q, c, C, K);
}

// Steps of 2..kConvShortChunk tokens a sequence (verify): grid (n_seqs, ceil(C / 32)), block
// (32 channels, max(max_chunk, K - 1) tokens); thread (c, t) convolves token t alone from its
// window, rows t .. t + K - 1 of [state; tokens], and threads t < K - 1 then store new state row t
// (window row T + t), read before the block's barrier, so no thread reads a row another has
// overwritten. (A thread walking a channel's tokens in order left verify 8 5.5 us a launch
// against 3.1 at one token: a few warps an SM, each a chain of 8 SiLUs.) The products are summed
// in the same order as conv1d_short_kernel's.
constexpr int kConvChannelsPerBlock = 32;
__global__ void conv1d_tokens_kernel(const bf16* mixed, const float* w, bf16* state, bf16* out,
                                     const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int C,
                                     int K) {
  const int c = blockIdx.y * kConvChannelsPerBlock + threadIdx.x, t = threadIdx.y;
  const ConvSeq q = conv_seq(blockIdx.x, state, cu_seqlens, n_past, slots, C, K);
  const bool active = c < C && t < q.T, writes_state = c < C && q.T > 0 && t < q.R;
  float wk[kConvMaxShortK], win[kConvMaxShortK];
  float next = 0.f;  // new state row t
#pragma unroll
  for (int j = 0; j < kConvMaxShortK; ++j) {
    wk[j] = active && j < K ? w[int64_t(c) * K + j] : 0.f;
    win[j] = active && j < K && t + j < q.R && !q.fresh ? to_f32(q.state[int64_t(t + j) * C + c]) : 0.f;
  }
  if (writes_state && q.T + t < q.R && !q.fresh) next = to_f32(q.state[int64_t(q.T + t) * C + c]);
  pdl_wait();  // launch.cuh: mixed comes from the kernels before
  pdl_trigger();
#pragma unroll
  for (int j = 0; j < kConvMaxShortK; ++j)
    if (active && j < K && t + j >= q.R) win[j] = to_f32(mixed[int64_t(q.t0 + t + j - q.R) * C + c]);
  if (writes_state && q.T + t >= q.R) next = to_f32(mixed[int64_t(q.t0 + q.T + t - q.R) * C + c]);
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < kConvMaxShortK; ++j)
    if (j < K) acc += wk[j] * win[j];
  if (active) out[int64_t(q.t0 + t) * C + c] = to_bf16(silu_f(acc));
  __syncthreads();  // every read of the old state is done
  if (writes_state) q.state[int64_t(t) * C + c] = to_bf16(next);
}

}  // namespace

void launch_conv1d_silu(const bf16* mixed, const float* w, bf16* state, bf16* out, const int32_t* seq_of_token,
                        const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int T, int n_seqs,
                        int C, int K, int max_chunk, cudaStream_t s) {
  if (T == 0) return;
  const int threads = 128;
  const int cblocks = (C + threads - 1) / threads;
  if (max_chunk <= kConvShortChunk && K <= kConvMaxShortK) {
    if (max_chunk == 1) {
      launch_kernel("conv1d_short", conv1d_short_kernel, dim3(n_seqs, cblocks), threads, 0, s, mixed, w, state, out,
                    cu_seqlens, n_past, slots, C, K);
    } else {
      launch_kernel("conv1d_tokens", conv1d_tokens_kernel,
                    dim3(n_seqs, (C + kConvChannelsPerBlock - 1) / kConvChannelsPerBlock),
                    dim3(kConvChannelsPerBlock, std::max(max_chunk, K - 1)), 0, s, mixed, w, state, out, cu_seqlens,
                    n_past, slots, C, K);
    }
    return;
  }
  launch_kernel("conv1d_silu", conv1d_silu_kernel, dim3(T, cblocks), threads, 0, s, mixed, w, state, out, seq_of_token,
                cu_seqlens, n_past, slots, C, K);
  launch_kernel("conv1d_state", conv1d_state_kernel, dim3(n_seqs, cblocks), threads, 0, s, mixed, state, cu_seqlens,
                n_past, slots, C, K);
}

}  // namespace ds::cuda
