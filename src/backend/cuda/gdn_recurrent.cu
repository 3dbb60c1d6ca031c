// Gated delta rule, token by token (the columns of S are independent given k, q, g and beta).
// Decode steps with the gates' a and b (the model's): a CTA a head, the state in registers and no
// barrier a token (gdn_decode_token_kernel). Verify steps of the model's heads (128 x 128, an
// fp16 state): a CTA a head takes the step's tokens at once, in closed form on tensor cores
// (gdn_verify_mma_kernel). Other decode-sized chunks: the state lives in
// registers across 8 warps (gdn_decode_kernel; a warp per 4 columns summing with shuffles, no
// block barrier a token, measured slower on the H200: docs/perf/2026-11-29-s6-cuda-27b.md), or
// at 8 or more sequences across the two halves of a CTA per head, the head's state moved by bulk
// copies (gdn_decode_head_kernel, which can also apply the gated RMSNorm that follows the rule:
// GdnNorm). Long chunks: one block per (sequence, v-head) holds S [dk, dv] in fp32 shared memory
// for the whole chunk, thread j owning column j; CudaOps uses it only where the chunked
// tensor-core kernel (gdn_chunked.cu) lacks the shape.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/conv_walk.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda {

namespace {

__global__ void gdn_recurrent_kernel(const bf16* qkv, const float* g, const float* beta, void* state, int state_dtype,
                                     bf16* out, const int32_t* cu_seqlens, const int32_t* n_past,
                                     const int32_t* slots, int Hk, int Hv, int dk, int dv, int cols_per_block) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  extern __shared__ float smem[];
  const int s = blockIdx.x, h = blockIdx.y, kh = h / (Hv / Hk);
  const int col0 = blockIdx.z * cols_per_block, cols = min(cols_per_block, dv - col0);
  float* S = smem;             // [dk, cols]: columns col0 .. col0 + cols of the head's state
  float* qs = S + dk * cols;   // [dk] normalised, scaled query
  float* ks = qs + dk;         // [dk] normalised key
  const int t0 = cu_seqlens[s], t1 = cu_seqlens[s + 1];
  if (t1 == t0) return;
  const int C = 2 * Hk * dk + Hv * dv;
  const int64_t state_off = (int64_t(slots[s]) * Hv + h) * dk * dv;
  const bool fresh = n_past[s] == 0;
  const int j = threadIdx.x;  // tile column; state column col0 + j
  for (int i = 0; i < dk; ++i)
    if (j < cols) S[i * cols + j] = fresh ? 0.f : load_state(state, state_off + int64_t(i) * dv + col0 + j, state_dtype);
  const float q_scale = rsqrtf(static_cast<float>(dk));
  for (int t = t0; t < t1; ++t) {
    const bf16* row = qkv + int64_t(t) * C;
    float qv = 0.f, kv = 0.f;
    if (j < dk) {
      qv = to_f32(row[kh * dk + j]);
      kv = to_f32(row[Hk * dk + kh * dk + j]);
    }
    const float qss = block_sum(qv * qv);
    const float kss = block_sum(kv * kv);
    if (j < dk) {
      qs[j] = qv * rsqrtf(qss + 1e-6f) * q_scale;
      ks[j] = kv * rsqrtf(kss + 1e-6f);
    }
    __syncthreads();
    if (j < cols) {
      const float alpha = expf(g[int64_t(t) * Hv + h]);
      const float b = beta[int64_t(t) * Hv + h];
      const float v = to_f32(row[2 * Hk * dk + h * dv + col0 + j]);
      float m = 0.f;
      for (int i = 0; i < dk; ++i) {
        const float x = S[i * cols + j] * alpha;  // decay first
        S[i * cols + j] = x;
        m += x * ks[i];
      }
      const float delta = b * (v - m);
      float o = 0.f;
      for (int i = 0; i < dk; ++i) {
        const float x = S[i * cols + j] + ks[i] * delta;
        S[i * cols + j] = x;
        o += x * qs[i];  // read after the update
      }
      out[(int64_t(t) * Hv + h) * dv + col0 + j] = to_bf16(o);
    }
    __syncthreads();  // qs/ks are rewritten by the next token
  }
  for (int i = 0; i < dk; ++i)
    if (j < cols) store_state(state, state_off + int64_t(i) * dv + col0 + j, S[i * cols + j], state_dtype);
}

// Decode-sized chunks (<= kGdnDecodeMaxTokens tokens per sequence, dk <= 128): one CTA of 8
// warps per (sequence, v-head, 32 state columns); lane = column, warp w holds rows [16w, 16w + 16)
// of those columns in registers, so the state is read and written once per step with no
// shared-memory copy. At a token or a few the kernel is a chain of dependent latencies, so it is
// written for few instructions a warp: the state's element type is a template parameter, the
// rows are unrolled with no per-row branch (rows past dk hold zeros and meet zero keys and
// queries), and 8 warps of 16 rows share the work (4 warps of 32 rows with the element type
// chosen per element ran 1,800 instructions a warp and took 8.4 us in Nsight Compute: docs/perf/
// 2026-11-30-s7-cuda-27b.md). The state loads are issued first, before pdl_wait (launch.cuh: only
// the kernel just before may still run, and no kernel but this one writes the layer's state); a
// prologue then loads every token's q, k (L2-normalised, a warp per token), v and gates into
// shared memory at once; the token loop then only sums columns over the 8 warps, through two
// shared buffers (two barriers a token).
constexpr int kDecodeWarps = 8;
constexpr int kDecodeRows = 16;  // rows per warp
constexpr int kDecodeMaxK = kDecodeWarps * kDecodeRows;
// Each token's sums over a warp's 16 rows run as kDecodeChains interleaved chains, and those over
// the 8 warps pairwise, so a token waits on shorter chains of dependent adds (one chain of 16 and
// one of 8: 7.03 against 6.91 us a launch in place at 8 tokens, 4.67 against 4.53 at one, H200
// traces in docs/perf/2026-12-01-s16-cuda-27b.md).
constexpr int kDecodeChains = 4;
template <int N>
__device__ __forceinline__ float pairwise_sum(const float (&v)[N]) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two");
  float a[N];
#pragma unroll
  for (int i = 0; i < N; ++i) a[i] = v[i];
#pragma unroll
  for (int w = N / 2; w > 0; w /= 2)
#pragma unroll
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}
// Steps of kDecodeHeadSeqs or more sequences take gdn_decode_head_kernel (below), and so do
// steps that normalise the output in the kernel (GdnNorm).
constexpr int kDecodeHeadSeqs = 8;

// StateT: float, __half or __nv_bfloat16 (state_dtype 0, 1, 2); elements through state_to_f32 and
// state_from_f32 (common.cuh), as load_state and store_state convert them.
template <class StateT>
__global__ void __launch_bounds__(kDecodeWarps * 32) gdn_decode_kernel(
    const bf16* qkv, GdnGates gates, StateT* state, bf16* out, const int32_t* cu_seqlens, const int32_t* n_past,
    const int32_t* slots, int Hk, int Hv, int dk, int dv) {
  __shared__ __align__(16) float qs[kGdnDecodeMaxTokens][kDecodeMaxK];  // normalised, scaled queries [T, dk], 0 past dk
  __shared__ __align__(16) float ks[kGdnDecodeMaxTokens][kDecodeMaxK];  // normalised keys [T, dk], 0 past dk
  __shared__ float vs[kGdnDecodeMaxTokens][32];                         // values of the CTA's columns [T, 32]
  __shared__ float alpha_s[kGdnDecodeMaxTokens], beta_s[kGdnDecodeMaxTokens];
  __shared__ float red[2][kDecodeWarps][32];  // per-warp column sums: k^T S, then q^T S
  const int s = blockIdx.x, h = blockIdx.y, kh = h / (Hv / Hk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col = blockIdx.z * 32 + lane;
  const bool has_col = col < dv;
  const int t0 = cu_seqlens[s], T = cu_seqlens[s + 1] - t0;
  if (T == 0) return;
  const int i0 = warp * kDecodeRows, rows = min(kDecodeRows, dk - i0);  // this warp's rows of the state
  const int C = 2 * Hk * dk + Hv * dv;
  // Element (i0 + r, col) is st[r * dv].
  StateT* st = state + (int64_t(slots[s]) * Hv + h) * dk * dv + int64_t(i0) * dv + col;
  const bool load = has_col && n_past[s] != 0;  // a fresh sequence starts from zeros

  // The state first (the step plan and the state are not written by the kernel before this one):
  // its loads are in flight while the previous kernel ends and the prologue reads q, k, v and gates.
  float S[kDecodeRows];
#pragma unroll
  for (int r = 0; r < kDecodeRows; ++r) S[r] = load && r < rows ? state_to_f32(st[r * dv]) : 0.f;
  pdl_wait();  // qkv and the gates come from the kernels before
  pdl_trigger();

  const float q_scale = rsqrtf(static_cast<float>(dk));
  for (int t = warp; t < T; t += kDecodeWarps) {
    const bf16* row = qkv + int64_t(t0 + t) * C;
    float qv[kDecodeMaxK / 32], kv[kDecodeMaxK / 32], qss = 0.f, kss = 0.f;
#pragma unroll
    for (int e = 0; e < kDecodeMaxK / 32; ++e) {
      const int j = lane + 32 * e;
      qv[e] = j < dk ? to_f32(row[kh * dk + j]) : 0.f;
      kv[e] = j < dk ? to_f32(row[Hk * dk + kh * dk + j]) : 0.f;
      qss += qv[e] * qv[e];
      kss += kv[e] * kv[e];
    }
    const float qn = rsqrtf(warp_sum(qss) + 1e-6f) * q_scale, kn = rsqrtf(warp_sum(kss) + 1e-6f);
#pragma unroll
    for (int e = 0; e < kDecodeMaxK / 32; ++e) {
      qs[t][lane + 32 * e] = qv[e] * qn;
      ks[t][lane + 32 * e] = kv[e] * kn;
    }
    vs[t][lane] = has_col ? to_f32(row[2 * Hk * dk + h * dv + col]) : 0.f;
    if (lane == 0) {
      const int64_t i = int64_t(t0 + t) * Hv + h;
      float g, beta;
      if (gates.a) gdn_gate(to_f32(gates.a[i]), to_f32(gates.b[i]), gates.a_log[h], gates.dt_bias[h], g, beta);
      else g = gates.g[i], beta = gates.beta[i];
      alpha_s[t] = expf(g);
      beta_s[t] = beta;
    }
  }
  __syncthreads();

  for (int t = 0; t < T; ++t) {
    float kr[kDecodeRows], qr[kDecodeRows];  // this warp's rows of the token's key and query
#pragma unroll
    for (int r = 0; r < kDecodeRows; r += 4) {
      *reinterpret_cast<float4*>(&kr[r]) = *reinterpret_cast<const float4*>(&ks[t][i0 + r]);
      *reinterpret_cast<float4*>(&qr[r]) = *reinterpret_cast<const float4*>(&qs[t][i0 + r]);
    }
    const float alpha = alpha_s[t];
    float part[kDecodeChains] = {};  // this warp's rows of (alpha S)^T k for the lane's column
#pragma unroll
    for (int r = 0; r < kDecodeRows; ++r) {
      S[r] *= alpha;  // decay first
      part[r % kDecodeChains] += S[r] * kr[r];
    }
    red[0][warp][lane] = pairwise_sum(part);
    __syncthreads();  // (also: every warp has read red[1] of the previous token)
    float m[kDecodeWarps];
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) m[w] = red[0][w][lane];
    const float delta = beta_s[t] * (vs[t][lane] - pairwise_sum(m));
    float o[kDecodeChains] = {};
#pragma unroll
    for (int r = 0; r < kDecodeRows; ++r) {
      S[r] += kr[r] * delta;
      o[r % kDecodeChains] += S[r] * qr[r];  // read after the update
    }
    red[1][warp][lane] = pairwise_sum(o);
    __syncthreads();  // every warp has read red[0] (the next token may write it); red[1] complete
    if (warp == 0 && has_col) {
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) m[w] = red[1][w][lane];
      out[(int64_t(t0 + t) * Hv + h) * dv + col] = to_bf16(pairwise_sum(m));
    }
  }
  if (has_col) {
#pragma unroll
    for (int r = 0; r < kDecodeRows; ++r)
      if (r < rows) st[r * dv] = state_from_f32<StateT>(S[r]);
  }
}

// Steps of kDecodeHeadSeqs or more sequences, and those with the norm: one CTA of 256 (or 512)
// threads per (sequence, v-head). At many sequences gdn_decode_kernel was bound by the bytes its
// CTAs keep in flight: a thread's 16 state elements are 16 loads into registers, so an SM held at
// most 32 KB of state loads and then computed (C64: 8.95 ms a step for 9.7 GB of state read and
// written, 1.1 TB/s). Here the head's whole state (contiguous, 32 KB in fp16) comes in one bulk
// copy into shared memory, issued first (before pdl_wait, as there), while the prologue reads the
// tokens' q, k, v and gates; each thread then takes one column and a part of the rows into
// registers (Parts parts: thread j takes column j % 128, rows [R (j / 128), + R), R = 128 /
// Parts), the token loop sums the parts through shared memory, and the updated state goes back by
// one bulk store from shared memory. Norm (a GdnNorm): the CTA keeps the head's outputs in shared
// memory, then writes them normalised and gated (no gated-norm launch after it). Parts 2 (256
// threads, 64 rows a thread) by default; 4 (512 threads, 32 rows a thread, a token's chains of
// dependent sums half as long) where launch_gdn_recurrent is given head_parts 4 (CudaOps: steps
// of up to 2 sequences, whose CTAs have an SM each either way). kGdnHeadPair: a cluster of two
// CTAs a head (gdn_decode_pair_kernel), each with the whole state in shared memory but 64 of its
// columns in 8 parts of 16 rows, writing its columns back from registers; with the norm, the two
// CTAs' sums of squares of each token meet through distributed shared memory. It halves each SM's
// share of the token loop, the bulk of a verify step's GDN time (CudaOps: verify steps of 4 or
// more tokens whose pairs fit one wave).
// A thread's sums over its rows a token run as kHeadChains (1, 2 or 4) interleaved chains of
// dependent adds, summed pairwise: with 2 rather than one chain of 64, C1 -0.02 ms, verify 8 at 4k
// -0.02, C64 -0.09 on the H200 (three rounds, about the runs' spread; docs/perf/
// 2026-12-02-s21-cuda-27b.md); 4 took the kernel past its 128 registers into spills.
constexpr int kHeadChains = 2;
// Tokens a thread normalises (Norm): t = part, part + Parts, ... (their z loaded after pdl_wait).
template <int Parts>
constexpr int kNormTokens = kGdnDecodeMaxTokens / Parts;

// The GdnNorm of output v of a row (rounded to bf16 first, as the separate kernel reads it) with
// 1 / rms inv: w * (v * inv) * act(z), in elementwise.cu's order.
__device__ __forceinline__ bf16 gdn_norm_out(float v, float inv, float w, float z, bool sigmoid_gate) {
  return to_bf16(v * inv * w * (sigmoid_gate ? sigmoid_f(z) : silu_f(z)));
}

// The normed outputs' fp16 copy (GdnNorm::f16) of the bf16 pair at element `at` of out (even), by
// the kernels that make one (gdn_norm_copies).
__device__ __forceinline__ void store_norm_copy(const GdnNorm& norm, int64_t at, __nv_bfloat162 pair) {
  if (norm.f16)
    *reinterpret_cast<uint32_t*>(norm.f16 + at) = bf16x2_to_f16x2_16th(*reinterpret_cast<const uint32_t*>(&pair));
}

// A column's sums over the Parts parts of its rows: in part order (2 parts: r0 + r1), or pairwise.
template <int Parts>
__device__ __forceinline__ float parts_sum(const float (&red)[Parts][kDecodeMaxK], int col) {
  static_assert(Parts == 2 || Parts == 4 || Parts == 8, "2, 4 or 8 parts");
  if constexpr (Parts == 2) return red[0][col] + red[1][col];
  else if constexpr (Parts == 4) return (red[0][col] + red[1][col]) + (red[2][col] + red[3][col]);
  else
    return ((red[0][col] + red[1][col]) + (red[2][col] + red[3][col])) +
           ((red[4][col] + red[5][col]) + (red[6][col] + red[7][col]));
}

bool gdn_decode_head_supported(int dk, int dv, int state_bytes) {
  return dk <= kDecodeMaxK && dv <= kDecodeMaxK && (dk * dv * state_bytes) % 16 == 0;
}

// The kernel of a CTA a head (Split 1), or one CTA of a pair (Split 2: a cluster along z, this
// CTA's columns [64 rank, + 64)).
template <class StateT, bool Norm, int Parts, int Split>
__device__ __forceinline__ void gdn_head_body(const bf16* qkv, GdnGates gates, StateT* state, bf16* out,
                                              const int32_t* cu_seqlens, const int32_t* n_past,
                                              const int32_t* slots, int Hk, int Hv, int dk, int dv, GdnNorm norm) {
  extern __shared__ __align__(128) unsigned char head_smem[];  // StateT [dk, dv]: the head's state
  StateT* Ss = reinterpret_cast<StateT*>(head_smem);
  __shared__ __align__(16) float qs[kGdnDecodeMaxTokens][kDecodeMaxK];  // normalised, scaled queries [T, dk], 0 past dk
  __shared__ __align__(16) float ks[kGdnDecodeMaxTokens][kDecodeMaxK];  // normalised keys [T, dk], 0 past dk
  __shared__ float vs[kGdnDecodeMaxTokens][kDecodeMaxK];                // values [T, dv]
  __shared__ float alpha_s[kGdnDecodeMaxTokens], beta_s[kGdnDecodeMaxTokens];
  constexpr int kCols = kDecodeMaxK / Split;
  constexpr int kRows = kDecodeMaxK / Parts, kThreads = kCols * Parts, kNorm = kNormTokens<Parts>;
  __shared__ float ss_s[Split == 2 ? kGdnDecodeMaxTokens : 1];  // Split 2: this CTA's sums of squares
  __shared__ float red[2][Parts][kDecodeMaxK];  // per-part column sums: k^T S, then q^T S
  __shared__ uint64_t landed;               // the state's copy
  __shared__ float os[Norm ? kGdnDecodeMaxTokens : 1][kDecodeMaxK];  // Norm: outputs as bf16 values, 0 past dv
  __shared__ float inv_s[kGdnDecodeMaxTokens];                       // Norm: 1 / rms of each token's row
  const int s = blockIdx.x, h = blockIdx.y, kh = h / (Hv / Hk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c0 = Split == 2 ? static_cast<int>(cluster_rank()) * kCols : 0;
  const int col = c0 + threadIdx.x % kCols, part = threadIdx.x / kCols, i0 = part * kRows;
  const bool has_col = col < dv;
  const int t0 = cu_seqlens[s], T = cu_seqlens[s + 1] - t0;
  if (T == 0) return;
  const int C = 2 * Hk * dk + Hv * dv;
  StateT* st = state + (int64_t(slots[s]) * Hv + h) * dk * dv;
  const uint32_t bytes = dk * dv * sizeof(StateT);
  const bool load = n_past[s] != 0;  // a fresh sequence starts from zeros

  if (threadIdx.x == 0) {
    mbar_init(&landed, 1);
    mbar_init_fence();
    // The state first (the step plan and the state are not written by the kernel before this one).
    if (load) {
      mbar_arrive_expect_tx(&landed, bytes);
      bulk_copy_g2s(Ss, st, bytes, &landed);
    }
  }
  const float norm_w = Norm && has_col ? norm.w[col] : 0.f;
  pdl_wait();  // qkv and the gates come from the kernels before
  pdl_trigger();
  float zr[Norm ? kNorm : 1];  // Norm: z of the tokens this thread normalises
#pragma unroll
  for (int i = 0; i < (Norm ? kNorm : 0); ++i) {
    const int t = part + Parts * i;
    zr[i] = t < T && has_col ? to_f32(norm.z[(int64_t(t0 + t) * Hv + h) * dv + col]) : 0.f;
  }

  const float q_scale = rsqrtf(static_cast<float>(dk));
  for (int t = warp; t < T; t += kThreads / 32) {
    const bf16* row = qkv + int64_t(t0 + t) * C;
    float qv[kDecodeMaxK / 32], kv[kDecodeMaxK / 32], qss = 0.f, kss = 0.f;
#pragma unroll
    for (int e = 0; e < kDecodeMaxK / 32; ++e) {
      const int j = lane + 32 * e;
      qv[e] = j < dk ? to_f32(row[kh * dk + j]) : 0.f;
      kv[e] = j < dk ? to_f32(row[Hk * dk + kh * dk + j]) : 0.f;
      qss += qv[e] * qv[e];
      kss += kv[e] * kv[e];
      vs[t][j] = j < dv ? to_f32(row[2 * Hk * dk + h * dv + j]) : 0.f;
    }
    const float qn = rsqrtf(warp_sum(qss) + 1e-6f) * q_scale, kn = rsqrtf(warp_sum(kss) + 1e-6f);
#pragma unroll
    for (int e = 0; e < kDecodeMaxK / 32; ++e) {
      qs[t][lane + 32 * e] = qv[e] * qn;
      ks[t][lane + 32 * e] = kv[e] * kn;
    }
    if (lane == 0) {
      const int64_t i = int64_t(t0 + t) * Hv + h;
      float g, beta;
      if (gates.a) gdn_gate(to_f32(gates.a[i]), to_f32(gates.b[i]), gates.a_log[h], gates.dt_bias[h], g, beta);
      else g = gates.g[i], beta = gates.beta[i];
      alpha_s[t] = expf(g);
      beta_s[t] = beta;
    }
  }
  __syncthreads();  // (also: the barrier's init is visible to every thread)
  if (load) mbar_wait(&landed, 0);

  // Element (i0 + r, col) of the state; rows past dk hold zeros and meet zero keys and queries.
  float S[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    S[r] = load && has_col && i0 + r < dk ? state_to_f32(Ss[(i0 + r) * dv + col]) : 0.f;

  for (int t = 0; t < T; ++t) {
    const float alpha = alpha_s[t];
    float sums[kHeadChains] = {};  // this part's rows of (alpha S)^T k for the thread's column
#pragma unroll
    for (int r = 0; r < kRows; r += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(&ks[t][i0 + r]);
      S[r] *= alpha;  // decay first
      S[r + 1] *= alpha;
      S[r + 2] *= alpha;
      S[r + 3] *= alpha;
      sums[0] += S[r] * k4.x;
      sums[1 % kHeadChains] += S[r + 1] * k4.y;
      sums[2 % kHeadChains] += S[r + 2] * k4.z;
      sums[3 % kHeadChains] += S[r + 3] * k4.w;
    }
    red[0][part][col] = pairwise_sum(sums);
    __syncthreads();  // (also: every thread has read red[1] of the previous token)
    const float delta = beta_s[t] * (vs[t][col] - parts_sum<Parts>(red[0], col));
    float o[kHeadChains] = {};
#pragma unroll
    for (int r = 0; r < kRows; r += 4) {
      const float4 k4 = *reinterpret_cast<const float4*>(&ks[t][i0 + r]);
      const float4 q4 = *reinterpret_cast<const float4*>(&qs[t][i0 + r]);
      S[r] += k4.x * delta;
      S[r + 1] += k4.y * delta;
      S[r + 2] += k4.z * delta;
      S[r + 3] += k4.w * delta;
      o[0] += S[r] * q4.x;  // read after the update
      o[1 % kHeadChains] += S[r + 1] * q4.y;
      o[2 % kHeadChains] += S[r + 2] * q4.z;
      o[3 % kHeadChains] += S[r + 3] * q4.w;
    }
    red[1][part][col] = pairwise_sum(o);
    __syncthreads();  // every thread has read red[0] (the next token may write it); red[1] complete
    if constexpr (Norm) {
      if (part == 0) os[t][col] = has_col ? to_f32(to_bf16(parts_sum<Parts>(red[1], col))) : 0.f;
    } else if (part == 0 && has_col) {
      out[(int64_t(t0 + t) * Hv + h) * dv + col] = to_bf16(parts_sum<Parts>(red[1], col));
    }
  }
  if constexpr (Split == 1) {
    // The new state into shared memory (every element of [dk, dv]), then one bulk store.
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (has_col && i0 + r < dk) Ss[(i0 + r) * dv + col] = state_from_f32<StateT>(S[r]);
    fence_proxy_async_shared();
    __syncthreads();
    if (threadIdx.x == 0) {
      bulk_copy_s2g(st, Ss, bytes);
      bulk_commit();
    }
  } else {  // this CTA's columns, straight from the registers
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (has_col && i0 + r < dk) st[(i0 + r) * dv + col] = state_from_f32<StateT>(S[r]);
    __syncthreads();
  }
  if constexpr (Norm) {  // os is complete (the barrier above)
    const int c_end = min(c0 + kCols, dv);
    for (int t = warp; t < T; t += kThreads / 32) {
      float ss = 0.f;
      for (int c = c0 + lane; c < c_end; c += 32) ss += os[t][c] * os[t][c];
      ss = warp_sum(ss);
      if (lane == 0) {
        if constexpr (Split == 1) inv_s[t] = rsqrtf(ss / dv + norm.eps);
        else ss_s[t] = ss;
      }
    }
    if constexpr (Split == 2) {
      cluster_sync();  // both CTAs' sums are written
      for (int t = threadIdx.x; t < T; t += kThreads)
        inv_s[t] = rsqrtf((cluster_ld_f32(&ss_s[t], 0) + cluster_ld_f32(&ss_s[t], 1)) / dv + norm.eps);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kNorm; ++i) {
      const int t = part + Parts * i;
      if (t >= T) break;
      if (has_col)
        out[(int64_t(t0 + t) * Hv + h) * dv + col] =
            gdn_norm_out(os[t][col], inv_s[t], norm_w, zr[i], norm.sigmoid_gate);
    }
  }
  if constexpr (Split == 1) {
    if (threadIdx.x == 0) bulk_wait_read();  // the shared memory is released when the CTA exits
  } else if constexpr (Norm) {
    cluster_sync();  // the other CTA has read ss_s
  }
}

template <class StateT, bool Norm, int Parts>
__global__ void __launch_bounds__(kDecodeMaxK * Parts, Parts == kGdnHeadParts ? 2 : 1) gdn_decode_head_kernel(
    const bf16* qkv, GdnGates gates, StateT* state, bf16* out, const int32_t* cu_seqlens, const int32_t* n_past,
    const int32_t* slots, int Hk, int Hv, int dk, int dv, GdnNorm norm) {
  gdn_head_body<StateT, Norm, Parts, 1>(qkv, gates, state, out, cu_seqlens, n_past, slots, Hk, Hv, dk, dv, norm);
}
constexpr int kPairParts = 8;
template <class StateT, bool Norm>
__global__ void __cluster_dims__(1, 1, 2) __launch_bounds__(kDecodeMaxK / 2 * kPairParts, 1) gdn_decode_pair_kernel(
    const bf16* qkv, GdnGates gates, StateT* state, bf16* out, const int32_t* cu_seqlens, const int32_t* n_past,
    const int32_t* slots, int Hk, int Hv, int dk, int dv, GdnNorm norm) {
  gdn_head_body<StateT, Norm, kPairParts, 2>(qkv, gates, state, out, cu_seqlens, n_past, slots, Hk, Hv, dk, dv,
                                             norm);
}

// Decode steps (one token a sequence), with or without the gated norm: a CTA of kTokWarps warps a
// (sequence, v-head), the head's state in registers. Warp w owns columns [16 w, 16 w + 16); lane l
// holds the column pair 16 w + 2 (l % 8), + 1 and rows [32 (l / 8), + 32) of both, so a column's
// sums over its rows meet by two shuffles and a warp's loads of a state row are whole 32-byte
// sectors. The state and the weights of the gates and the norm are loaded before pdl_wait; after
// it every lane asks at once for its rows of q and k (L2-normalised by shuffles), the gates' a and
// b, v and z: one round trip, no prologue barrier. One pass makes both of a column's sums, m =
// S^T k and b = S^T q, since the output after the update is (alpha S + k delta^T)^T q = alpha b +
// (k . q) delta; so the token takes no barrier, and the norm one (the sum of squares over the
// head). Full: dk = dv = 128 at compile time, so a row's loads and stores are one instruction each
// (an immediate offset, no bound check). On the H200 at C1 (27B shape, docs/perf/
// 2026-12-04-s43-cuda-27b.md): 5.98 us a launch in place, 4.9 alone (Nsight Compute), against
// 6.49 for the kernel of a CTA a head in 4 parts. Lost there: the same with runtime head dims
// (1,589 instructions a warp against 742: 6.09 us), 16 warps of 16 rows a lane (7.12 us), and a
// cluster of 4 CTAs a head (5.78 us at C1 but C8 6.90 against 6.37 ms; at verify 8 10.9 us a
// launch against 8.8 for the CTA pair, its tokens a chain of about 250 instructions a warp).
// 2 CTAs an SM: 127 registers with an fp16 state (bf16 and fp32 states, and the forms of runtime
// head dims, spill a few words).
// Conv (GdnConv, with the norm): qkv is the pre-conv rows. Each thread convolves one or two of the
// CTA's 2 dk + dv channels (conv_walk.cuh, the conv kernels' arithmetic), their weights and old
// state rows loaded before pdl_wait, into shared memory (one more barrier), where the lanes then
// read their q, k and v. The conv kernel's launch and the kernel boundary after it go: on the
// H200 (27B shape, three rounds, docs/perf/2026-12-04-s46-cuda-27b.md) C1 at 1k 4.989-5.001
// against 5.017-5.031 ms, C4 5.614-5.617 against 5.685-5.713; at two waves of CTAs (C8: 384) it
// lost (6.41-6.45 against 6.32-6.35), as the second wave's loads before pdl_wait overlap nothing,
// so CudaOps takes it where they fit one (gdn_conv_fits).
constexpr int kTokWarps = 8;
constexpr int kTokCtasPerSm = 2;  // the launch bounds' (127 registers a thread with an fp16 state)
constexpr int kTokRows = kDecodeMaxK / 4;  // rows a lane: 4 row groups a column pair

// Two adjacent state elements: raw (as loaded, before pdl_wait) and as floats.
__device__ __forceinline__ float2 state_pair_raw(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ uint32_t state_pair_raw(const __half* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t state_pair_raw(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
template <class StateT, class Raw>
__device__ __forceinline__ float2 state_pair_f32(Raw r) {
  if constexpr (std::is_same_v<StateT, float>) return r;
  else if constexpr (std::is_same_v<StateT, __half>) return __half22float2(*reinterpret_cast<const __half2*>(&r));
  else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
}
__device__ __forceinline__ void store_state_pair(float* p, float x, float y) {
  *reinterpret_cast<float2*>(p) = make_float2(x, y);
}
__device__ __forceinline__ void store_state_pair(__half* p, float x, float y) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}
__device__ __forceinline__ void store_state_pair(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ float2 bf16_pair(uint32_t w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

template <class StateT, bool Norm, bool Full, bool Conv>
__global__ void __launch_bounds__(kTokWarps * 32, kTokCtasPerSm) gdn_decode_token_kernel(
    const bf16* qkv, GdnGates gates, StateT* state, bf16* out, const int32_t* cu_seqlens, const int32_t* n_past,
    const int32_t* slots, int Hk, int Hv, int dk_, int dv_, GdnNorm norm, GdnConv conv) {
  static_assert(!Conv || Norm, "the conv is taken by the kernel that normalises");
  static_assert(2 * kTokWarps * 32 >= 3 * kDecodeMaxK, "two conv channels a thread");
  using Raw = std::conditional_t<std::is_same_v<StateT, float>, float2, uint32_t>;
  __shared__ float ss_w[kTokWarps];  // Norm: each warp's sum of squares of its columns' outputs
  // Conv: the CTA's channels after the conv (q and k of its k-head, then its v-head's v), and the
  // new conv state rows of q and k, which the last CTA of the k-head to arrive writes.
  __shared__ __align__(16) bf16 conv_out[Conv ? 3 * kDecodeMaxK : 1];
  __shared__ bf16 conv_rows[Conv ? kGdnConvMaxK - 1 : 1][Conv ? 2 * kDecodeMaxK : 1];
  __shared__ int conv_last;
  const int dk = Full ? kDecodeMaxK : dk_, dv = Full ? kDecodeMaxK : dv_;
  const int s = blockIdx.x, h = blockIdx.y, kh = h / (Hv / Hk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col = 16 * warp + 2 * (lane & 7), i0 = kTokRows * (lane >> 3);
  const bool has_col = Full || col < dv;  // dv is even: both columns
  const int t = cu_seqlens[s];  // the sequence's token (launch_gdn_recurrent: at most one)
  if (cu_seqlens[s + 1] == t) return;
  const int C = 2 * Hk * dk + Hv * dv;
  // Element (i0 + r, col + e) is st[r dv + e].
  StateT* st = state + (int64_t(slots[s]) * Hv + h) * dk * dv + int64_t(i0) * dv + col;
  const bool load = has_col && n_past[s] != 0;  // a fresh sequence starts from zeros

  // The state first (the step plan and the state are not written by the kernel before this one).
  Raw raw[kTokRows];  // rows i0 + r of the column pair, as stored
#pragma unroll
  for (int r = 0; r < kTokRows; ++r) raw[r] = load && (Full || i0 + r < dk) ? state_pair_raw(st + r * dv) : Raw{};
  const float2 w2 = Norm && has_col ? *reinterpret_cast<const float2*>(norm.w + col) : make_float2(0.f, 0.f);
  const float a_log = gates.a_log[h], dt_bias = gates.dt_bias[h];
  // Conv: the thread's channels lc = threadIdx.x + 256 i of the CTA's 2 dk + dv, their weights and
  // old state rows loaded before pdl_wait (no kernel of the step but this one writes the conv state).
  constexpr int kConvCh = 2;
  const int n_local = 2 * dk + dv;
  auto channel = [&](int lc) {
    return lc < dk ? kh * dk + lc : lc < 2 * dk ? (Hk + kh) * dk + lc - dk : 2 * Hk * dk + h * dv + lc - 2 * dk;
  };
  ConvWalk<kGdnConvMaxK> walk[Conv ? kConvCh : 1];
  ConvSeq cs{};
  if constexpr (Conv) {
    cs = conv_seq(s, conv.state, cu_seqlens, n_past, slots, C, conv.K);
#pragma unroll
    for (int i = 0; i < kConvCh; ++i) {
      const int lc = threadIdx.x + kTokWarps * 32 * i;
      if (lc < n_local) walk[i].load(conv.w, cs, channel(lc), C, conv.K);
    }
  }
  pdl_wait();  // qkv, the gates and z come from the kernels before
  pdl_trigger();

  const bf16* row = qkv + int64_t(t) * C;
  // The gates' a and b and z first: with Conv they are in flight with the channels' loads.
  const int64_t gi = int64_t(t) * Hv + h;
  const float ga = to_f32(gates.a[gi]), gb = to_f32(gates.b[gi]);
  const float2 z2 =
      Norm && has_col ? bf16_pair(*reinterpret_cast<const uint32_t*>(norm.z + gi * dv + col)) : make_float2(0.f, 0.f);
  int arrived = 0;  // Conv: thread 0's arrival (the CTAs of the k-head before it)
  if constexpr (Conv) {  // the channels' step; v channels' state rows now, q and k ones kept
#pragma unroll
    for (int i = 0; i < kConvCh; ++i) {
      const int lc = threadIdx.x + kTokWarps * 32 * i;
      if (lc >= n_local) continue;
      conv_out[lc] = walk[i].step(to_f32(row[channel(lc)]), cs.R, conv.K);
      if (lc >= 2 * dk) {
        walk[i].store_state(cs, channel(lc), C);
      } else {
#pragma unroll
        for (int j = 0; j < kGdnConvMaxK - 1; ++j)
          if (j < cs.R) conv_rows[j][lc] = walk[i].state_row(j);
      }
    }
    __syncthreads();  // conv_out; and every read of the old q and k rows is done
    if (threadIdx.x == 0) arrived = atomic_add_release_gpu(&conv.counters[s * Hk + kh], 1);
  }
  // This lane's rows of q and k as loaded (bf16 pairs; dk is even), their norms taken below.
  const bf16* qp = Conv ? conv_out + i0 : row + kh * dk + i0;
  const bf16* kp = Conv ? conv_out + dk + i0 : row + Hk * dk + kh * dk + i0;
  const bf16* vp = Conv ? conv_out + 2 * dk + col : row + 2 * Hk * dk + h * dv + col;
  uint32_t q2[kTokRows / 2], k2[kTokRows / 2];
  if constexpr (Full) {  // C and the rows' starts are multiples of 8 elements
#pragma unroll
    for (int i = 0; i < kTokRows / 8; ++i) {
      *reinterpret_cast<uint4*>(&q2[4 * i]) = *reinterpret_cast<const uint4*>(qp + 8 * i);
      *reinterpret_cast<uint4*>(&k2[4 * i]) = *reinterpret_cast<const uint4*>(kp + 8 * i);
    }
  } else {
#pragma unroll
    for (int r = 0; r < kTokRows; r += 2) {
      const bool in = i0 + r < dk;
      q2[r / 2] = in ? *reinterpret_cast<const uint32_t*>(qp + r) : 0u;
      k2[r / 2] = in ? *reinterpret_cast<const uint32_t*>(kp + r) : 0u;
    }
  }
  const float2 v2 = has_col ? bf16_pair(*reinterpret_cast<const uint32_t*>(vp)) : make_float2(0.f, 0.f);

  // Over this lane's rows: S^T k and S^T q for both columns, k . q, and the sums of squares of q
  // and k, two chains each (rows r and r + 1).
  float m0[2] = {}, m1[2] = {}, b0[2] = {}, b1[2] = {}, kq[2] = {}, qss[2] = {}, kss[2] = {};
#pragma unroll
  for (int r = 0; r < kTokRows; r += 2) {
    const float2 qv = bf16_pair(q2[r / 2]), kv = bf16_pair(k2[r / 2]);
    const float2 x = state_pair_f32<StateT>(raw[r]), y = state_pair_f32<StateT>(raw[r + 1]);
    m0[0] += x.x * kv.x, m0[1] += y.x * kv.y;
    m1[0] += x.y * kv.x, m1[1] += y.y * kv.y;
    b0[0] += x.x * qv.x, b0[1] += y.x * qv.y;
    b1[0] += x.y * qv.x, b1[1] += y.y * qv.y;
    kq[0] += kv.x * qv.x, kq[1] += kv.y * qv.y;
    qss[0] += qv.x * qv.x, qss[1] += qv.y * qv.y;
    kss[0] += kv.x * kv.x, kss[1] += kv.y * kv.y;
  }
  // The lanes of a column pair differ in bits 3 and 4.
  auto rows_sum = [](const float (&x)[2]) {
    float v = x[0] + x[1];
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    return v + __shfl_xor_sync(0xffffffffu, v, 16);
  };
  float g, beta;
  gdn_gate(ga, gb, a_log, dt_bias, g, beta);
  const float qn = rsqrtf(rows_sum(qss) + 1e-6f) * rsqrtf(static_cast<float>(dk)), kn = rsqrtf(rows_sum(kss) + 1e-6f);
  const float alpha = expf(g);
  const float d0 = beta * (v2.x - alpha * kn * rows_sum(m0)), d1 = beta * (v2.y - alpha * kn * rows_sum(m1));
  const float kqs = kn * qn * rows_sum(kq);
  const float o0 = alpha * qn * rows_sum(b0) + kqs * d0, o1 = alpha * qn * rows_sum(b1) + kqs * d1;
  // The new state: alpha S + k delta^T, k normalised.
  if (has_col) {
    const float e0 = kn * d0, e1 = kn * d1;
#pragma unroll
    for (int r = 0; r < kTokRows; r += 2) {
      if (!Full && i0 + r >= dk) break;
      const float2 kv = bf16_pair(k2[r / 2]);
      const float2 x = state_pair_f32<StateT>(raw[r]), y = state_pair_f32<StateT>(raw[r + 1]);
      store_state_pair(st + r * dv, fmaf(alpha, x.x, kv.x * e0), fmaf(alpha, x.y, kv.x * e1));
      store_state_pair(st + (r + 1) * dv, fmaf(alpha, y.x, kv.y * e0), fmaf(alpha, y.y, kv.y * e1));
    }
  }
  bf16* dst = out + gi * dv + col;
  if constexpr (Norm) {
    // The norm reads the output rounded to bf16, as the separate kernel does.
    const float r0 = to_f32(to_bf16(o0)), r1 = to_f32(to_bf16(o1));
    const float ss = warp_sum(lane < 8 && has_col ? r0 * r0 + r1 * r1 : 0.f);
    if (lane == 0) ss_w[warp] = ss;
    if (Conv && threadIdx.x == 0) {
      conv_last = arrived == Hv / Hk - 1;
      if (conv_last) fence_acq_rel_gpu();  // the other CTAs' reads of the rows before the writes below
    }
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int w = 0; w < kTokWarps; ++w) tot += ss_w[w];
    const float inv = rsqrtf(tot / dv + norm.eps);
    if (lane < 8 && has_col) {
      __nv_bfloat162 pair;
      pair.x = gdn_norm_out(r0, inv, w2.x, z2.x, norm.sigmoid_gate);
      pair.y = gdn_norm_out(r1, inv, w2.y, z2.y, norm.sigmoid_gate);
      *reinterpret_cast<__nv_bfloat162*>(dst) = pair;
      store_norm_copy(norm, dst - out, pair);
    }
    if (Conv && conv_last) {  // the last CTA of the k-head: its q and k conv state rows
      for (int i = threadIdx.x; i < cs.R * 2 * dk; i += kTokWarps * 32) {
        const int j = i / (2 * dk), lc = i % (2 * dk);
        cs.state[int64_t(j) * C + channel(lc)] = conv_rows[j][lc];
      }
      if (threadIdx.x == 0) conv.counters[s * Hk + kh] = 0;  // for the next launch
    }
  } else if (lane < 8 && has_col) {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(o0, o1);
  }
}

// Verify steps (2 to kGdnDecodeMaxTokens tokens a sequence) of heads of 128 x 128 with an fp16
// state, the gates as a and b: the rule over a sequence's T tokens in closed form from the state
// S0 before the step, on tensor cores, with no barrier a token. With G_t = g_0 + .. + g_t (the
// log-decays) and k, q normalised (q scaled by dk^-1/2):
//   delta_t = beta_t (v_t - e^G_t S0^T k_t - sum_{j<t} e^(G_t - G_j) (k_t . k_j) delta_j)
//   o_t     = e^G_t S0^T q_t + sum_{j<=t} e^(G_t - G_j) (q_t . k_j) delta_j
//   S_T     = e^G_{T-1} S0 + sum_j k_j (e^(G_{T-1} - G_j) delta_j)^T
// A CTA of 8 warps a (sequence, v-head). Warp w owns v-columns [16 w, + 16): it holds them over
// all 128 rows as S^T's mma accumulator tiles [16 columns, 8 rows], loaded from shared memory by
// ldmatrix.trans as fp16 pairs, which are also the B fragments of S. Then:
//   1. S0^T k_t and S0^T q_t of every token: [k; q] (tokens x 128, fp16) times S0, 16 mma a warp
//      (32 at more than 8 tokens), each column's sum over the rows inside its warp;
//   2. the Gram products k_t . k_j and q_t . k_j, a tile a warp (warps 0-3), into the coefficient
//      matrices above (shared memory; one barrier);
//   3. delta and o by forward substitution in each warp's accumulator layout (a token a row): one
//      round of shuffles a token, no barrier;
//   4. the gated norm (one barrier: each token's sum of squares over the head);
//   5. S_T = e^G S0^T + E^T K on tensor cores, E the scaled deltas turned into A fragments by
//      movmatrix; stored back through shared memory (stmatrix.trans) in 16-byte pieces.
// The pair and head kernels above take every other verify step.
constexpr int kVerD = 128;                     // the head dims this kernel takes
constexpr int kVerWarps = 8;
constexpr int kVerMaxT = kGdnDecodeMaxTokens;  // 16
constexpr int kVerPitch = kVerD + 8;  // halves a shared row: 272 bytes, so ldmatrix's 8 rows hit distinct banks
static_assert(kVerMaxT == 16, "the verify kernel's token tiles are 8 or 16 rows");

struct VerifySmem {
  uint16_t S[kVerD][kVerPitch];          // fp16 [dk, dv]: the head's state
  uint16_t kq[2 * kVerMaxT][kVerPitch];  // fp16 [2 MT, dk]: normalised keys (rows < MT), then scaled queries
  float g[kVerMaxT], beta[kVerMaxT];     // each token's log-decay and beta; 0 past T
  float amat[kVerMaxT][kVerMaxT + 1];    // [t][j]: beta_t e^(G_t - G_j) (k_t . k_j) for j < t, else 0
  float qmat[kVerMaxT][kVerMaxT + 1];    // [t][j]: e^(G_t - G_j) (q_t . k_j) for j <= t, else 0
  float ss[kVerWarps][kVerMaxT];         // Norm: each warp's sum of squares of a token's outputs
};

__device__ __forceinline__ uint32_t half2_bits(float x, float y) {
  const __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// One (sequence, head) of T <= MT tokens (MT 8 or 16). A lane holds the tokens g4 + 8 i (i <
// MT / 8) and the columns 16 warp + 8 nb + 2 t4, + 1 (nb 0, 1) of the accumulator layout.
template <bool Norm, int MT>
__device__ __forceinline__ void gdn_verify_body(VerifySmem& sm, const bf16* qkv, const GdnGates& gates, __half* st,
                                                bool load, bf16* out, int t0, int T, int Hk, int Hv, int h,
                                                const GdnNorm& norm) {
  constexpr int kTiles = MT / 8;  // token tiles of 8 rows; also the m-tiles of [k; q]
  constexpr unsigned kAll = 0xffffffffu;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g4 = lane >> 2, t4 = lane & 3;
  const int kh = h / (Hv / Hk), C = 2 * Hk * kVerD + Hv * kVerD;

  // The state into shared memory, 16 bytes a thread a time (piece c: row c / 16, columns 8 (c % 16)).
  // No kernel before this one writes it.
  uint4 piece[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    piece[i] = load ? reinterpret_cast<const uint4*>(st)[threadIdx.x + kVerWarps * 32 * i] : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = threadIdx.x + kVerWarps * 32 * i;
    *reinterpret_cast<uint4*>(&sm.S[c >> 4][8 * (c & 15)]) = piece[i];
  }
  float2 nw[2];
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
    nw[nb] = Norm ? *reinterpret_cast<const float2*>(norm.w + 16 * warp + 8 * nb + 2 * t4) : make_float2(0.f, 0.f);
  const float a_log = gates.a_log[h], dt_bias = gates.dt_bias[h];
  pdl_wait();  // qkv, the gates and z come from the kernels before
  pdl_trigger();

  // v and z of the lane's tokens and columns.
  float2 vv[kTiles][2], zz[kTiles][2];
#pragma unroll
  for (int i = 0; i < kTiles; ++i)
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      const int t = g4 + 8 * i, col = 16 * warp + 8 * nb + 2 * t4;
      const bool in = t < T;
      const int64_t tok = t0 + t;
      vv[i][nb] = in ? bf16_pair(*reinterpret_cast<const uint32_t*>(qkv + tok * C + 2 * Hk * kVerD + h * kVerD + col))
                     : make_float2(0.f, 0.f);
      zz[i][nb] = Norm && in ? bf16_pair(*reinterpret_cast<const uint32_t*>(norm.z + (tok * Hv + h) * kVerD + col))
                             : make_float2(0.f, 0.f);
    }
  // A warp a token: q and k L2-normalised into fp16 rows, and the gates.
  const float q_scale = rsqrtf(static_cast<float>(kVerD));
  for (int t = warp; t < MT; t += kVerWarps) {
    uint2 qr = make_uint2(0, 0), kr = make_uint2(0, 0);
    const bf16* row = qkv + int64_t(t0 + t) * C;
    if (t < T) {
      qr = *reinterpret_cast<const uint2*>(row + kh * kVerD + 4 * lane);
      kr = *reinterpret_cast<const uint2*>(row + Hk * kVerD + kh * kVerD + 4 * lane);
    }
    const float2 q0 = bf16_pair(qr.x), q1 = bf16_pair(qr.y), k0 = bf16_pair(kr.x), k1 = bf16_pair(kr.y);
    const float qn = rsqrtf(warp_sum(q0.x * q0.x + q0.y * q0.y + q1.x * q1.x + q1.y * q1.y) + 1e-6f) * q_scale;
    const float kn = rsqrtf(warp_sum(k0.x * k0.x + k0.y * k0.y + k1.x * k1.x + k1.y * k1.y) + 1e-6f);
    *reinterpret_cast<uint2*>(&sm.kq[t][4 * lane]) = make_uint2(half2_bits(k0.x * kn, k0.y * kn),
                                                                half2_bits(k1.x * kn, k1.y * kn));
    *reinterpret_cast<uint2*>(&sm.kq[MT + t][4 * lane]) = make_uint2(half2_bits(q0.x * qn, q0.y * qn),
                                                                     half2_bits(q1.x * qn, q1.y * qn));
    if (lane == 0) {
      float g = 0.f, beta = 0.f;
      if (t < T) {
        const int64_t gi = int64_t(t0 + t) * Hv + h;
        gdn_gate(to_f32(gates.a[gi]), to_f32(gates.b[gi]), a_log, dt_bias, g, beta);
      }
      sm.g[t] = g;
      sm.beta[t] = beta;
    }
  }
  __syncthreads();  // the state, [k; q] and the gates

  // G_t in lane t (every warp scans for itself).
  float cum = lane < MT ? sm.g[lane] : 0.f;
#pragma unroll
  for (int o = 1; o < MT; o *= 2) {
    const float n = __shfl_up_sync(kAll, cum, o);
    if (lane >= o) cum += n;
  }

  // sf[j2][m]: matrix m = 2 hi + nb of rows 16 j2 + 8 hi, columns 16 warp + 8 nb (fp16 pairs: rows
  // 2 t4, + 1 of column g4). As S^T's accumulator tile j = 2 j2 + hi: c0, c1 = m 2 hi; c2, c3 = m
  // 2 hi + 1. As S's B fragments of k-block j2: b0 = m nb, b1 = m 2 + nb.
  uint32_t sf[8][4];
  const int lm = lane >> 3;
  auto s_addr = [&](int j2) { return smem_u32(&sm.S[16 * j2 + 8 * (lm >> 1) + (lane & 7)][16 * warp + 8 * (lm & 1)]); };
#pragma unroll
  for (int j2 = 0; j2 < 8; ++j2) ldmatrix_x4_trans(sf[j2], s_addr(j2));

  // 1, 2: [k; q] S0 (acc[m-tile][nb]: rows 16 mt + g4, + 8 of [k; q]) and this warp's Gram tile.
  float acc[kTiles][2][4] = {};
  float gram[4] = {};
  const bool has_gram = warp < kTiles * kTiles;
  const int gmt = warp / kTiles, gnt = warp % kTiles;
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
    uint32_t a[kTiles][4];
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt) ldmatrix_x4(a[mt], &sm.kq[16 * mt + (lane & 15)][16 * kb + 8 * (lane >> 4)]);
#pragma unroll
    for (int mt = 0; mt < kTiles; ++mt) {
      mma_f16(acc[mt][0], a[mt], sf[kb][0], sf[kb][2]);
      mma_f16(acc[mt][1], a[mt], sf[kb][1], sf[kb][3]);
    }
    if (has_gram) {  // the keys 8 gnt + g4 as B: rows of m-tile 0
      uint32_t ga[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) ga[e] = gmt == 1 ? a[kTiles - 1][e] : a[0][e];
      mma_f16(gram, ga, gnt == 1 ? a[0][1] : a[0][0], gnt == 1 ? a[0][3] : a[0][2]);
    }
  }
  if (has_gram) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * gmt + g4 + 8 * (e >> 1), j = 8 * gnt + 2 * t4 + (e & 1);  // row of [k; q], key
      const bool key = r < MT;
      const int t = key ? r : r - MT;
      const float decay = expf(__shfl_sync(kAll, cum, t) - __shfl_sync(kAll, cum, j));
      if (key) sm.amat[t][j] = j < t ? sm.beta[t] * decay * gram[e] : 0.f;
      else sm.qmat[t][j] = j <= t ? decay * gram[e] : 0.f;
    }
  }
  __syncthreads();  // the coefficient matrices

  // 3: x starts as beta_t (v_t - e^G_t S0^T k_t) and ends as delta_t; o starts as e^G_t S0^T q_t.
  // At token j, the lanes holding row j have their delta final and share it.
  float x[kTiles][2][2], o[kTiles][2][2];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int t = g4 + 8 * i;
    const float decay = expf(__shfl_sync(kAll, cum, t)), beta = sm.beta[t];
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float av = kTiles == 1 ? acc[0][nb][e] : acc[0][nb][2 * i + e];
        const float bv = kTiles == 1 ? acc[0][nb][2 + e] : acc[kTiles - 1][nb][2 * i + e];
        x[i][nb][e] = beta * ((e ? vv[i][nb].y : vv[i][nb].x) - decay * av);
        o[i][nb][e] = decay * bv;
      }
  }
  for (int j = 0; j < T; ++j) {
    const int src = 4 * (j & 7) + t4;
    float d[2][2];
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) d[nb][e] = __shfl_sync(kAll, j >= 8 ? x[kTiles - 1][nb][e] : x[0][nb][e], src);
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      const float ca = sm.amat[g4 + 8 * i][j], cq = sm.qmat[g4 + 8 * i][j];
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          x[i][nb][e] = fmaf(-ca, d[nb][e], x[i][nb][e]);
          o[i][nb][e] = fmaf(cq, d[nb][e], o[i][nb][e]);
        }
    }
  }

  // 4: the outputs (the norm reads them rounded to bf16, as the separate kernel does).
  if constexpr (Norm) {
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      float ss = 0.f;
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          o[i][nb][e] = to_f32(to_bf16(o[i][nb][e]));
          ss += o[i][nb][e] * o[i][nb][e];
        }
      ss += __shfl_xor_sync(kAll, ss, 1);
      ss += __shfl_xor_sync(kAll, ss, 2);
      if (t4 == 0) sm.ss[warp][g4 + 8 * i] = ss;
    }
    __syncthreads();  // the sums of squares
  }
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const int t = g4 + 8 * i;
    if (t >= T) continue;
    float inv = 0.f;
    if constexpr (Norm) {
      float tot = 0.f;
#pragma unroll
      for (int w = 0; w < kVerWarps; ++w) tot += sm.ss[w][t];
      inv = rsqrtf(tot / kVerD + norm.eps);
    }
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      const int col = 16 * warp + 8 * nb + 2 * t4;
      __nv_bfloat162 pair;
      if constexpr (Norm) {
        pair.x = gdn_norm_out(o[i][nb][0], inv, nw[nb].x, zz[i][nb].x, norm.sigmoid_gate);
        pair.y = gdn_norm_out(o[i][nb][1], inv, nw[nb].y, zz[i][nb].y, norm.sigmoid_gate);
      } else {
        pair = __floats2bfloat162_rn(o[i][nb][0], o[i][nb][1]);
      }
      const int64_t at = (int64_t(t0 + t) * Hv + h) * kVerD + col;
      *reinterpret_cast<__nv_bfloat162*>(out + at) = pair;
      if constexpr (Norm) store_norm_copy(norm, at, pair);
    }
  }

  // 5: E^T's A fragments (rows: the warp's columns; k: tokens), E_t = e^(G_{T-1} - G_t) delta_t.
  const float g_end = __shfl_sync(kAll, cum, T - 1);
  uint32_t ea[kTiles][2];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) {
    const float sc = expf(g_end - __shfl_sync(kAll, cum, g4 + 8 * i));  // past T: delta is 0
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) ea[i][nb] = movmatrix_trans(half2_bits(sc * x[i][nb][0], sc * x[i][nb][1]));
  }
  const float decay_end = expf(g_end);
#pragma unroll
  for (int j2 = 0; j2 < 8; ++j2) {
    // The keys' B fragments of S^T tiles 2 j2 and 2 j2 + 1 (columns 16 j2 + 8 hi of [k]).
    uint32_t kb[2][kTiles];
    if constexpr (kTiles == 1) {
      uint32_t r[2];
      ldmatrix_x2_trans(r, smem_u32(&sm.kq[lane & 7][16 * j2 + 8 * ((lane >> 3) & 1)]));
      kb[0][0] = r[0], kb[1][0] = r[1];
    } else {
      uint32_t r[4];
      ldmatrix_x4_trans(r, smem_u32(&sm.kq[(lane & 7) + 8 * (lm & 1)][16 * j2 + 8 * (lm >> 1)]));
      kb[0][0] = r[0], kb[0][1] = r[1], kb[1][0] = r[2], kb[1][1] = r[3];
    }
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float2 lo = state_pair_f32<__half>(sf[j2][2 * hi]), up = state_pair_f32<__half>(sf[j2][2 * hi + 1]);
      float c[4] = {decay_end * lo.x, decay_end * lo.y, decay_end * up.x, decay_end * up.y};
      if constexpr (kTiles == 1) {
        mma_f16_k8(c, ea[0][0], ea[0][1], kb[hi][0]);
      } else {
        const uint32_t a[4] = {ea[0][0], ea[0][1], ea[kTiles - 1][0], ea[kTiles - 1][1]};
        mma_f16(c, a, kb[hi][0], kb[hi][kTiles - 1]);
      }
      sf[j2][2 * hi] = half2_bits(c[0], c[1]);
      sf[j2][2 * hi + 1] = half2_bits(c[2], c[3]);
    }
    stmatrix_x4_trans(s_addr(j2), sf[j2]);
  }
  __syncthreads();  // the new state in shared memory
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = threadIdx.x + kVerWarps * 32 * i;
    reinterpret_cast<uint4*>(st)[c] = *reinterpret_cast<const uint4*>(&sm.S[c >> 4][8 * (c & 15)]);
  }
}

template <bool Norm>
__global__ void __launch_bounds__(kVerWarps * 32, 2) gdn_verify_mma_kernel(
    const bf16* qkv, GdnGates gates, __half* state, bf16* out, const int32_t* cu_seqlens, const int32_t* n_past,
    const int32_t* slots, int Hk, int Hv, GdnNorm norm) {
  __shared__ __align__(16) VerifySmem sm;
  const int s = blockIdx.x, h = blockIdx.y;
  const int t0 = cu_seqlens[s], T = cu_seqlens[s + 1] - t0;
  if (T == 0) return;
  __half* st = state + (int64_t(slots[s]) * Hv + h) * kVerD * kVerD;
  const bool load = n_past[s] != 0;  // a fresh sequence starts from zeros
  if (T <= 8) gdn_verify_body<Norm, 8>(sm, qkv, gates, st, load, out, t0, T, Hk, Hv, h, norm);
  else gdn_verify_body<Norm, 16>(sm, qkv, gates, st, load, out, t0, T, Hk, Hv, h, norm);
}

}  // namespace

bool gdn_decode_supported(int dk) { return dk <= kDecodeMaxK; }

bool gdn_decode_token_supported(int dk, int dv) {
  return dk <= kDecodeMaxK && dv <= kDecodeMaxK && dk % 2 == 0 && dv % 2 == 0;
}

bool gdn_verify_mma_supported(int dk, int dv, int state_dtype) {
  return dk == kVerD && dv == kVerD && state_dtype == 1;
}

namespace {
bool g_gdn_pair = env_flag("DS_GDN_PAIR", true);
bool g_gdn_token = env_flag("DS_GDN_TOKEN", true);
bool g_gdn_mma = env_flag("DS_GDN_MMA", true);
bool g_gdn_conv = env_flag("DS_GDN_CONV", true);
}  // namespace

bool gdn_conv_fused() { return g_gdn_conv; }
bool gdn_conv_fits(int n_seqs, int Hv) { return int64_t(n_seqs) * Hv <= int64_t(kTokCtasPerSm) * sm_count(); }
void set_gdn_conv_fused(bool on) { g_gdn_conv = on; }

bool gdn_verify_mma() { return g_gdn_mma; }
void set_gdn_verify_mma(bool on) { g_gdn_mma = on; }

bool gdn_decode_token() { return g_gdn_token; }
void set_gdn_decode_token(bool on) { g_gdn_token = on; }

bool gdn_decode_pair_fits(int n_seqs, int Hv) { return g_gdn_pair && 2 * int64_t(n_seqs) * Hv <= sm_count(); }
bool gdn_decode_pair() { return g_gdn_pair; }
void set_gdn_decode_pair(bool on) { g_gdn_pair = on; }

bool gdn_decode_norm_supported(int dk, int dv, int state_dtype) {
  return gdn_decode_supported(dk) && gdn_decode_head_supported(dk, dv, state_dtype == 0 ? 4 : 2);
}

void launch_gdn_recurrent(const bf16* qkv, const GdnGates& gates, void* state, int state_dtype, bf16* out,
                          const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int n_seqs, int Hk,
                          int Hv, int dk, int dv, bool short_chunks, cudaStream_t s, const GdnNorm& norm,
                          int head_parts, const GdnConv& conv) {
  if (n_seqs == 0) return;
  DS_ASSERT(!conv.w || head_parts == kGdnOneToken, "GDN decode: the conv in the kernel needs the one-token kernel");
  DS_ASSERT(!norm.f16 || (norm.z && gdn_norm_copies(head_parts) && aligned16(norm.f16)),
            "GDN decode: the norm's fp16 copy by the one-token or verify kernel (%d row parts a head)", head_parts);
  DS_ASSERT(head_parts == kGdnHeadParts || head_parts == kGdnHeadFewSeqsParts || head_parts == kGdnHeadPair ||
                head_parts == kGdnOneToken || head_parts == kGdnVerifyMma,
            "GDN decode: %d row parts a head", head_parts);
  const bool normed = norm.z != nullptr;
  DS_ASSERT(!normed || (short_chunks && gdn_decode_norm_supported(dk, dv, state_dtype)),
            "the GDN kernels normalise their output at decode only, in the kernel of a CTA a head (dk %d, dv %d)", dk,
            dv);
  if (short_chunks && gdn_decode_supported(dk)) {
    auto go = [&](auto* typed_state, auto norm_on) {
      using StateT = std::remove_pointer_t<decltype(typed_state)>;
      constexpr bool Norm = decltype(norm_on)::value;
      if (head_parts == kGdnOneToken) {
        DS_ASSERT(gates.a && gdn_decode_token_supported(dk, dv),
                  "GDN decode: the one-token kernel takes the gates' a and b, and even head dims up to %d (dk %d, "
                  "dv %d)",
                  kDecodeMaxK, dk, dv);
        auto token = [&](auto full, auto conv_on) {
          launch_kernel("gdn_decode",
                        gdn_decode_token_kernel<StateT, Norm, decltype(full)::value, decltype(conv_on)::value>,
                        dim3(n_seqs, Hv), kTokWarps * 32, 0, s, qkv, gates, typed_state, out, cu_seqlens, n_past,
                        slots, Hk, Hv, dk, dv, norm, conv);
        };
        auto shaped = [&](auto conv_on) {
          if (dk == kDecodeMaxK && dv == kDecodeMaxK) token(std::true_type{}, conv_on);
          else token(std::false_type{}, conv_on);
        };
        if constexpr (Norm) {
          if (conv.w) {
            DS_ASSERT(conv.K >= 1 && conv.K <= kGdnConvMaxK && int64_t(n_seqs) * Hk <= kGdnConvCounters,
                      "GDN decode: the conv in the kernel takes widths up to %d and %d (sequence, k-head) counters "
                      "(width %d, %d sequences, %d k-heads)",
                      kGdnConvMaxK, kGdnConvCounters, conv.K, n_seqs, Hk);
            shaped(std::true_type{});
            return;
          }
        }
        DS_ASSERT(!conv.w, "GDN decode: the conv in the kernel needs the norm");
        shaped(std::false_type{});
        return;
      }
      if (head_parts == kGdnVerifyMma) {
        DS_ASSERT(gates.a && gdn_verify_mma_supported(dk, dv, state_dtype),
                  "GDN verify: the tensor-core kernel takes the gates' a and b, head dims of %d and an fp16 state "
                  "(dk %d, dv %d, state dtype %d)",
                  kVerD, dk, dv, state_dtype);
        if constexpr (std::is_same_v<StateT, __half>)
          launch_kernel("gdn_verify", gdn_verify_mma_kernel<Norm>, dim3(n_seqs, Hv), kVerWarps * 32, 0, s, qkv, gates,
                        typed_state, out, cu_seqlens, n_past, slots, Hk, Hv, norm);
        return;
      }
      // head_parts: Parts of a CTA a head, or kGdnHeadPair (a CTA pair a head, kPairParts each).
      auto head = [&](auto parts) {
        constexpr bool Pair = decltype(parts)::value == kGdnHeadPair;
        constexpr int Parts = Pair ? kPairParts : decltype(parts)::value;
        auto* kernel = [] {
          if constexpr (Pair) return gdn_decode_pair_kernel<StateT, Norm>;
          else return gdn_decode_head_kernel<StateT, Norm, Parts>;
        }();
        const int smem = dk * dv * static_cast<int>(sizeof(StateT));
        static int smem_attr = 0;  // the kernel's dynamic shared-memory limit, raised as needed (the
                                   // default leaves 48 KB less its static shared memory)
        if (smem > smem_attr) {
          CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          smem_attr = smem;
        }
        launch_kernel("gdn_decode", kernel, dim3(n_seqs, Hv, Pair ? 2 : 1), kDecodeMaxK / (Pair ? 2 : 1) * Parts, smem,
                      s, qkv, gates, typed_state, out, cu_seqlens, n_past, slots, Hk, Hv, dk, dv, norm);
      };
      if ((Norm || n_seqs >= kDecodeHeadSeqs) && gdn_decode_head_supported(dk, dv, sizeof(StateT))) {
        if (head_parts == kGdnHeadPair) head(std::integral_constant<int, kGdnHeadPair>{});
        else if (head_parts == kGdnHeadFewSeqsParts) head(std::integral_constant<int, kGdnHeadFewSeqsParts>{});
        else head(std::integral_constant<int, kGdnHeadParts>{});
        return;
      }
      if constexpr (!Norm)
        launch_kernel("gdn_decode", gdn_decode_kernel<StateT>, dim3(n_seqs, Hv, (dv + 31) / 32), kDecodeWarps * 32, 0,
                      s, qkv, gates, typed_state, out, cu_seqlens, n_past, slots, Hk, Hv, dk, dv);
    };
    auto typed = [&](auto norm_on) {
      if (state_dtype == 0) go(static_cast<float*>(state), norm_on);
      else if (state_dtype == 1) go(static_cast<__half*>(state), norm_on);
      else go(static_cast<__nv_bfloat16*>(state), norm_on);
    };
    if (normed) typed(std::true_type{});
    else typed(std::false_type{});
    return;
  }
  DS_ASSERT(gates.g && gates.beta, "the long-chunk GDN kernel takes precomputed gates");
  const float* g = gates.g;
  const float* beta = gates.beta;
  const int cols = dv;
  const int threads = ((std::max(dk, cols) + 31) / 32) * 32;  // dk threads load q and k; cols threads update S
  const size_t smem = (size_t(dk) * cols + 2 * dk) * sizeof(float);
  static size_t smem_attr = 48 * 1024;  // the kernel's dynamic shared-memory limit, raised as needed
  if (smem > smem_attr) {
    CUDA_CHECK(cudaFuncSetAttribute(gdn_recurrent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    smem_attr = smem;
  }
  const dim3 grid(n_seqs, Hv, 1);
  launch_kernel("gdn_recurrent", gdn_recurrent_kernel, grid, threads, smem, s, qkv, g, beta, state, state_dtype, out,
                cu_seqlens, n_past, slots, Hk, Hv, dk, dv, cols);
}

}  // namespace ds::cuda
