// Elementwise and row kernels: embedding, norms, gating, gathers, RoPE, GDN gates.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"
#include "ops/random_fill.h"

namespace ds::cuda {

namespace {

constexpr int kThreads = 256;
inline int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8)); }

// The block copies n bf16 from src to dst: 16 bytes per thread and step when n is a multiple of
// 8 and both pointers are 16-byte aligned, else element by element. (Copied element by element,
// each load waits on the thread's store before it, since the pointers may alias.)
__device__ __forceinline__ void copy_row(const bf16* src, bf16* dst, int n) {
  if (n % 8 == 0 && aligned16(src) && aligned16(dst)) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int i = threadIdx.x; i < n / 8; i += blockDim.x) d[i] = s[i];
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void embedding_kernel(const bf16* table, const int32_t* ids, bf16* out, int H) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int t = blockIdx.x;
  copy_row(table + int64_t(ids[t]) * H, out + int64_t(t) * H, H);
}

// RMSNorm (optionally gated) over rows of D (a multiple of 8) with 16-byte vectors held in
// registers between the two passes: a warp per row for D <= 1024 (4 rows per block), else a
// block per row. Each thread holds at most kMaxVec vectors.
constexpr int kMaxVec = 4;

// What the vector norm kernel does around the RMSNorm: nothing, gate the output by act(aux)
// (aux = z), or first add aux to x and store the sum to `sum` (aux = y, sum = x for the in-place
// residual add; the norm is of the bf16 sum as stored).
enum class NormKind { kPlain, kGated, kAdd };

template <bool kWarpRow, NormKind kKind>
__global__ void rms_norm_vec_kernel(const bf16* x, const bf16* aux, bf16* sum, const float* w, bf16* out, int R, int D,
                                    float eps, bool sigmoid_gate) {
  const int lane = threadIdx.x & 31;
  const int64_t r = kWarpRow ? int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5) : blockIdx.x;
  const int tid = kWarpRow ? lane : threadIdx.x, nthr = kWarpRow ? 32 : blockDim.x;
  if (r >= R) return;  // whole warps (kWarpRow) or the whole block leave together
  const int nv = D / 8;
  // The norm weights first: no kernel writes them, so they load while the previous kernel ends.
  float4 wv[kMaxVec][2];
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int c = tid + k * nthr;
    if (c < nv) {
      wv[k][0] = __ldg(reinterpret_cast<const float4*>(w) + 2 * c);
      wv[k][1] = __ldg(reinterpret_cast<const float4*>(w) + 2 * c + 1);
    }
  }
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const uint4* xr = reinterpret_cast<const uint4*>(x + r * D);
  const uint4* ar = reinterpret_cast<const uint4*>(aux + r * D);
  uint4 v[kMaxVec], zv[kMaxVec];  // zv: the gate (kGated), read with x rather than after the sum
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int c = tid + k * nthr;
    if (c < nv) {
      v[k] = xr[c];
      if constexpr (kKind == NormKind::kGated) zv[k] = ar[c];
      if constexpr (kKind == NormKind::kAdd) {
        float a[8], b[8];
        unpack8(v[k], a);
        unpack8(ar[c], b);
        uint4 sv;
        bf16* sb = reinterpret_cast<bf16*>(&sv);
#pragma unroll
        for (int e = 0; e < 8; ++e) sb[e] = to_bf16(a[e] + b[e]);
        v[k] = sv;
        reinterpret_cast<uint4*>(sum + r * D)[c] = sv;
      }
      float f[8];
      unpack8(v[k], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
    }
  }
  ss = kWarpRow ? warp_sum(ss) : block_sum(ss);
  const float inv = rsqrtf(ss / D + eps);
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    const int c = tid + k * nthr;
    if (c < nv) {
      float f[8], gz[8];
      unpack8(v[k], f);
      if constexpr (kKind == NormKind::kGated) unpack8(zv[k], gz);
      uint4 o;
      bf16* ob = reinterpret_cast<bf16*>(&o);
      const float wk[8] = {wv[k][0].x, wv[k][0].y, wv[k][0].z, wv[k][0].w,
                           wv[k][1].x, wv[k][1].y, wv[k][1].z, wv[k][1].w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float y = f[e] * inv * wk[e];
        if constexpr (kKind == NormKind::kGated) y *= sigmoid_gate ? sigmoid_f(gz[e]) : silu_f(gz[e]);
        ob[e] = to_bf16(y);
      }
      reinterpret_cast<uint4*>(out + r * D)[c] = o;
    }
  }
}

// The vector kernels need D % 8 == 0, 16-byte aligned rows and at most kMaxVec vectors per thread.
template <class... P>
bool vec_ok(int D, const P*... ptrs) {
  const bool aligned = (aligned16(ptrs) && ...);
  return D % 8 == 0 && D <= 8 * 1024 * kMaxVec && aligned;
}

template <NormKind kKind>
void launch_norm(const bf16* x, const bf16* aux, bf16* sum, const float* w, bf16* out, int R, int D, float eps,
                 bool sigmoid_gate, cudaStream_t s) {
  const int nv = D / 8;
  const char* name = kKind == NormKind::kAdd     ? "add_rms_norm"
                     : kKind == NormKind::kGated ? "gated_rms_norm"
                                                 : "rms_norm";
  if (nv <= 32 * kMaxVec) {
    launch_kernel(name, rms_norm_vec_kernel<true, kKind>, (R + 3) / 4, 128, 0, s, x, aux, sum, w, out, R, D, eps,
                  sigmoid_gate);
  } else {
    const int threads = std::min(1024, ((nv + 31) / 32) * 32);
    launch_kernel(name, rms_norm_vec_kernel<false, kKind>, R, threads, 0, s, x, aux, sum, w, out, R, D, eps,
                  sigmoid_gate);
  }
}

// Scalar fallbacks for D not a multiple of 8 (tiny test shapes).
__global__ void rms_norm_kernel(const bf16* x, const float* w, bf16* out, int D, float eps) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int64_t r = blockIdx.x;
  const bf16* xr = x + r * D;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = to_f32(xr[i]);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) out[r * D + i] = to_bf16(to_f32(xr[i]) * inv * w[i]);
}

__global__ void gated_rms_norm_kernel(const bf16* x, const bf16* z, const float* w, bf16* out, int D, float eps,
                                      bool sigmoid_gate) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int64_t r = blockIdx.x;
  float ss = 0.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float v = to_f32(x[r * D + i]);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / D + eps);
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const float zi = to_f32(z[r * D + i]);
    const float gate = sigmoid_gate ? sigmoid_f(zi) : silu_f(zi);
    out[r * D + i] = to_bf16(w[i] * (to_f32(x[r * D + i]) * inv) * gate);
  }
}

// Block t: row t of out, its factor from the sums added in order p = 0, 1, .. (the GEMV epilogues'
// order, OutParts::row_scale, differs in the last bits).
__global__ void scale_rows_kernel(bf16* out, const float* ss, int T, int N, int P, float inv_d, float eps) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int t = blockIdx.x;
  float sum = 0.f;
  for (int p = 0; p < P; ++p) sum += ss[p * T + t];
  const float r = rsqrtf(sum * inv_d + eps);
  bf16* row = out + int64_t(t) * N;
  for (int i = threadIdx.x; i < N; i += blockDim.x) row[i] = to_bf16(to_f32(row[i]) * r);
}

__global__ void add_kernel(bf16* x, const bf16* y, int64_t n) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = to_bf16(to_f32(x[i]) + to_f32(y[i]));
}

__global__ void silu_mul_kernel(const bf16* gate, const bf16* up, bf16* out, int64_t n) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = swiglu_bf16(to_f32(gate[i]), to_f32(up[i]));
}

// One thread per output element i = t * half + c of launch_paired_rows.
__global__ void paired_rows_kernel(const bf16* in, bf16* a, bf16* b, int half, int64_t n, bool swiglu) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / half;
    const int c = static_cast<int>(i % half);
    const bf16* pair = in + t * 2 * half + (c / 8) * 16 + c % 8;  // gate; up 8 columns on
    if (swiglu) {
      a[i] = swiglu_bf16(to_f32(pair[0]), to_f32(pair[8]));
    } else {
      a[i] = pair[0];
      b[i] = pair[8];
    }
  }
}

__global__ void sigmoid_mul_kernel(bf16* x, const bf16* gate, int64_t n) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = to_bf16(to_f32(x[i]) * sigmoid_f(to_f32(gate[i])));
}

__global__ void gather_rows_kernel(const bf16* x, const int32_t* rows, bf16* out, int H) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int r = blockIdx.x;
  copy_row(x + int64_t(rows[r]) * H, out + int64_t(r) * H, H);
}

__global__ void concat_cols_kernel(const bf16* a, const bf16* b, bf16* out, int D1, int D2) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int64_t t = blockIdx.x;
  bf16* row = out + t * (D1 + D2);
  copy_row(a + t * D1, row, D1);
  copy_row(b + t * D2, row + D1, D2);
}

// Block per (token, head): copies the head's query and gate halves (16-byte vectors when hd % 8 == 0).
__global__ void split_query_gate_kernel(const bf16* p, bf16* q, bf16* gate, int n_heads, int hd) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const bf16* src = p + (t * n_heads + h) * 2 * hd;
  bf16* qd = q + (t * n_heads + h) * hd;
  bf16* gd = gate + (t * n_heads + h) * hd;
  if (hd % 8 == 0) {
    for (int c = threadIdx.x; c < hd / 8; c += blockDim.x) {
      reinterpret_cast<uint4*>(qd)[c] = reinterpret_cast<const uint4*>(src)[c];
      reinterpret_cast<uint4*>(gd)[c] = reinterpret_cast<const uint4*>(src + hd)[c];
    }
    return;
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    qd[d] = src[d];
    gd[d] = src[hd + d];
  }
}

// Block per (token, head); thread i rotates the pair (i, i + rotary_dim / 2).
__global__ void rope_kernel(bf16* x, const int32_t* positions, int n, int hd, int rotary_dim, float theta) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int half = rotary_dim / 2;
  const float pos = static_cast<float>(positions[t]);
  bf16* v = x + (t * n + blockIdx.y) * hd;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
    float sn, cs;
    sincosf(pos * inv_freq, &sn, &cs);
    const float x1 = to_f32(v[i]), x2 = to_f32(v[i + half]);
    v[i] = to_bf16(x1 * cs - x2 * sn);
    v[i + half] = to_bf16(x2 * cs + x1 * sn);
  }
}

// Attention input preparation, a warp per head of one token (grid (T, heads / kPrepWarps)): query
// heads come out of the projection's [query | gate] pairs (the gate half is copied), key heads
// are updated in place; each head is RMS-normalised (rounded to bf16 as rms_norm stores it),
// then its first rotary_dim dims rotated as rope_kernel does, through a per-warp staging row.
constexpr int kPrepWarps = 4;
constexpr int kPrepMaxHd = 256;

__global__ void __launch_bounds__(kPrepWarps * 32) attention_prep_kernel(
    const bf16* p, bf16* k, const float* q_norm, const float* k_norm, bf16* q, bf16* gate, const int32_t* positions,
    int nH, int nKV, int hd, int rotary_dim, float theta, float eps, bool vec_gate) {
  __shared__ float row[kPrepWarps][kPrepMaxHd];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = rotary_dim / 2;
  float* r = row[warp];
  const int head = blockIdx.y * kPrepWarps + warp;
  const bool is_q = head < nH;
  // Before pdl_wait, what no kernel of the step writes: the position (the step plan), the norm
  // weights and the rotation of the lane's dims (all after the wait: 4.8 us a launch in place, 4.5
  // now, on the H200: docs/perf/2026-12-01-s16-cuda-27b.md).
  const float pos = static_cast<float>(positions[t]);
  const float* w = is_q ? q_norm : k_norm;
  float wv[kPrepMaxHd / 32], sn[kPrepMaxHd / 64], cs[kPrepMaxHd / 64];
#pragma unroll
  for (int e = 0; e < kPrepMaxHd / 32; ++e) wv[e] = lane + 32 * e < hd ? w[lane + 32 * e] : 0.f;
#pragma unroll
  for (int e = 0; e < kPrepMaxHd / 64; ++e) {
    const int i = lane + 32 * e;
    if (i < half) {
      const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
      sincosf(pos * inv_freq, &sn[e], &cs[e]);
    }
  }
  pdl_wait();  // launch.cuh
  pdl_trigger();
  if (head >= nH + nKV) return;  // whole warps
  const bf16* src = is_q ? p + (t * nH + head) * 2 * hd : k + (t * nKV + (head - nH)) * hd;
  bf16* dst = is_q ? q + (t * nH + head) * hd : k + (t * nKV + (head - nH)) * hd;
  float x[kPrepMaxHd / 32], ss = 0.f;
  // vec_gate: the lane's 8 gate values in one load issued with the others, stored as one. (Element
  // by element each load waited on the store before it, which may alias: 8 round trips to L2 a
  // query head at hd 256, 4.01 against 1.98 us a launch in place at C1 on the H200, docs/perf/
  // 2026-12-03-s30-cuda-27b.md.)
  uint4 g = {};
  if (vec_gate && is_q && lane < hd / 8) g = reinterpret_cast<const uint4*>(src + hd)[lane];
#pragma unroll
  for (int e = 0; e < kPrepMaxHd / 32; ++e) x[e] = to_f32(src[min(lane + 32 * e, hd - 1)]);  // all loads at once
#pragma unroll
  for (int e = 0; e < kPrepMaxHd / 32; ++e) {
    const int d = lane + 32 * e;
    if (d < hd) {
      r[d] = x[e];
      ss += x[e] * x[e];
    }
  }
  if (is_q && vec_gate) {
    if (lane < hd / 8) reinterpret_cast<uint4*>(gate + (t * nH + head) * hd)[lane] = g;
  } else if (is_q) {
    for (int d = lane; d < hd; d += 32) gate[(t * nH + head) * hd + d] = src[hd + d];
  }
  const float inv = rsqrtf(warp_sum(ss) / hd + eps);
  __syncwarp();
#pragma unroll
  for (int e = 0; e < kPrepMaxHd / 32; ++e) {
    const int d = lane + 32 * e;
    if (d < hd) r[d] = to_f32(to_bf16(r[d] * inv * wv[e]));
  }
  __syncwarp();
#pragma unroll
  for (int e = 0; e < kPrepMaxHd / 64; ++e) {
    const int i = lane + 32 * e;
    if (i < half) {
      const float x1 = r[i], x2 = r[i + half];
      dst[i] = to_bf16(x1 * cs[e] - x2 * sn[e]);
      dst[i + half] = to_bf16(x2 * cs[e] + x1 * sn[e]);
    }
  }
  for (int d = rotary_dim + lane; d < hd; d += 32) dst[d] = to_bf16(r[d]);
}

__global__ void gdn_gates_kernel(const bf16* a, const bf16* b, const float* a_log, const float* dt_bias, float* g,
                                 float* beta, int64_t n, int Hv) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i % Hv);
    gdn_gate(to_f32(a[i]), to_f32(b[i]), a_log[h], dt_bias[h], g[i], beta[i]);
  }
}

template <class T>
__global__ void fill_random_kernel(T* x, int64_t n, float mean, float half_range, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = random_uniform(seed, static_cast<uint64_t>(i), mean, half_range);
    if constexpr (sizeof(T) == 4) x[i] = v;
    else x[i] = to_bf16(v);
  }
}

}  // namespace

void launch_fill_random_f32(float* x, int64_t n, float mean, float half_range, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  fill_random_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, mean, half_range, seed);
  cuda_check_launch("fill_random", s);
}

void launch_fill_random_bf16(bf16* x, int64_t n, float mean, float half_range, uint64_t seed, cudaStream_t s) {
  if (n == 0) return;
  fill_random_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, n, mean, half_range, seed);
  cuda_check_launch("fill_random", s);
}

void launch_embedding(const bf16* table, const int32_t* ids, bf16* out, int T, int H, cudaStream_t s) {
  if (T == 0) return;
  launch_kernel("embedding", embedding_kernel, T, kThreads, 0, s, table, ids, out, H);
}

void launch_rms_norm(const bf16* x, const float* w, bf16* out, int R, int D, float eps, cudaStream_t s) {
  if (R == 0) return;
  if (vec_ok(D, x, out, w)) launch_norm<NormKind::kPlain>(x, nullptr, nullptr, w, out, R, D, eps, false, s);
  else launch_kernel("rms_norm", rms_norm_kernel, R, D >= 512 ? 256 : 128, 0, s, x, w, out, D, eps);
}

bool launch_add_rms_norm(bf16* x, const bf16* y, const float* w, bf16* out, int R, int D, float eps, cudaStream_t s) {
  if (R == 0) return true;
  if (!vec_ok(D, x, y, out, w)) return false;
  launch_norm<NormKind::kAdd>(x, y, x, w, out, R, D, eps, false, s);
  return true;
}

void launch_gated_rms_norm(const bf16* x, const bf16* z, const float* w, bf16* out, int R, int D, float eps,
                           bool sigmoid_gate, cudaStream_t s) {
  if (R == 0) return;
  if (vec_ok(D, x, z, out, w))
    launch_norm<NormKind::kGated>(x, z, nullptr, w, out, R, D, eps, sigmoid_gate, s);
  else launch_kernel("gated_rms_norm", gated_rms_norm_kernel, R, D >= 256 ? 128 : 64, 0, s, x, z, w, out, D, eps,
                     sigmoid_gate);
}

void launch_scale_rows(bf16* out, const float* ss, int T, int N, int P, int D, float eps, cudaStream_t s) {
  if (T == 0 || N == 0) return;
  launch_kernel("scale_rows", scale_rows_kernel, T, kThreads, 0, s, out, ss, T, N, P, 1.f / static_cast<float>(D),
                eps);
}

void launch_add(bf16* x, const bf16* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_kernel("add", add_kernel, blocks_for(n), kThreads, 0, s, x, y, n);
}

void launch_silu_mul(const bf16* gate, const bf16* up, bf16* out, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_kernel("silu_mul", silu_mul_kernel, blocks_for(n), kThreads, 0, s, gate, up, out, n);
}

void launch_paired_rows(const bf16* in, bf16* a, bf16* b, int T, int half, bool swiglu, cudaStream_t s) {
  DS_ASSERT(half % 8 == 0, "paired rows: half %d is not a multiple of 8", half);
  const int64_t n = int64_t(T) * half;
  if (n == 0) return;
  launch_kernel("paired_rows", paired_rows_kernel, blocks_for(n), kThreads, 0, s, in, a, b, half, n, swiglu);
}

void launch_sigmoid_mul(bf16* x, const bf16* gate, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_kernel("sigmoid_mul", sigmoid_mul_kernel, blocks_for(n), kThreads, 0, s, x, gate, n);
}

void launch_gather_rows(const bf16* x, const int32_t* rows, bf16* out, int n_rows, int H, cudaStream_t s) {
  if (n_rows == 0) return;
  launch_kernel("gather_rows", gather_rows_kernel, n_rows, kThreads, 0, s, x, rows, out, H);
}

void launch_concat_cols(const bf16* a, const bf16* b, bf16* out, int T, int D1, int D2, cudaStream_t s) {
  if (T == 0) return;
  launch_kernel("concat_cols", concat_cols_kernel, T, kThreads, 0, s, a, b, out, D1, D2);
}

void launch_split_query_gate(const bf16* p, bf16* q, bf16* gate, int T, int n_heads, int hd, cudaStream_t s) {
  if (T == 0) return;
  launch_kernel("split_query_gate", split_query_gate_kernel, dim3(T, n_heads), 32, 0, s, p, q, gate, n_heads, hd);
}

void launch_rope(bf16* x, const int32_t* positions, int T, int n, int hd, int rotary_dim, float theta,
                 cudaStream_t s) {
  if (T == 0) return;
  launch_kernel("rope", rope_kernel, dim3(T, n), std::min(128, ((rotary_dim / 2 + 31) / 32) * 32), 0, s, x, positions,
                n, hd, rotary_dim, theta);
}

bool attention_prep_supported(int hd, int rotary_dim) {
  return hd <= kPrepMaxHd && rotary_dim <= hd && rotary_dim % 2 == 0;
}

void launch_attention_prep(const bf16* p, bf16* k, const float* q_norm, const float* k_norm, bf16* q, bf16* gate,
                           const int32_t* positions, int T, int nH, int nKV, int hd, int rotary_dim, float theta,
                           float eps, cudaStream_t s) {
  if (T == 0) return;
  DS_ASSERT(attention_prep_supported(hd, rotary_dim), "attention prep: hd %d, rotary dim %d", hd, rotary_dim);
  const dim3 grid(T, (nH + nKV + kPrepWarps - 1) / kPrepWarps);
  const bool vec_gate = hd % 8 == 0 && aligned16(p) && aligned16(gate);
  launch_kernel("attention_prep", attention_prep_kernel, grid, kPrepWarps * 32, 0, s, p, k, q_norm, k_norm, q, gate,
                positions, nH, nKV, hd, rotary_dim, theta, eps, vec_gate);
}

void launch_gdn_gates(const bf16* a, const bf16* b, const float* a_log, const float* dt_bias, float* g, float* beta,
                      int T, int Hv, cudaStream_t s) {
  const int64_t n = int64_t(T) * Hv;
  if (n == 0) return;
  launch_kernel("gdn_gates", gdn_gates_kernel, blocks_for(n), kThreads, 0, s, a, b, a_log, dt_bias, g, beta, n, Hv);
}

}  // namespace ds::cuda
