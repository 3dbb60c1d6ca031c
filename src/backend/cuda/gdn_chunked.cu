// Gated delta rule prefill in chunks of 64 tokens on tensor cores: the WY/UT form of the
// architecture reference (CPU twin: gdn_head_chunked in backend/cpu/gdn_ref.cpp). Two kernels:
//  1. gdn_chunk_prep: one block per (chunk, sequence, v-head), every chunk at once: per row the
//     inverse norms of q (times dk^-0.5) and k and the in-chunk cumulative log-decay gamma; per
//     chunk (q, k normalised) A[r][s] = beta_r (k_r . k_s) e^(gamma_r - gamma_s) for s < r,
//     T = (I + A)^-1 by fp32 forward substitution, and P = (Q K^T) o Gamma with
//     Gamma[r][s] = e^(gamma_r - gamma_s) for s <= r (else 0); T and P stored bf16.
//  2. gdn_chunk_pass: one block per (sequence, v-head, tile of 32 state columns) walks its
//     chunks in order with the state tile S [dk, 32] in fp32 registers (mma accumulators):
//       V' = T diag(beta) (V - diag(e^gamma) K S)
//       O  = diag(e^gamma) Q S + P V'
//       S <- e^gamma_L S + K^T diag(e^(gamma_L - gamma)) V'
//     while cp.async fetches the next chunk.
// q, k, v enter the matmuls as their raw bf16 values (norms are fp32 row/column scales); S, V',
// T, Y and P are rounded to bf16 as mma operands; all accumulation is fp32 (mma.sync m16n8k16).
// Head dims up to 128, zero padded to 128 in shared memory; a partial last chunk is zero padded.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda {

namespace {

constexpr int kC = 64;          // chunk length (tokens)
constexpr int kD = 128;         // padded head dim: dk, dv <= kD
constexpr int kNV = 32;         // state columns per pass block
constexpr int kThreads = 128;   // 4 warps in both kernels
constexpr int kLdD = kD + 8;    // smem row strides in elements: +16 bytes keeps ldmatrix
constexpr int kLdC = kC + 8;    // rows on distinct banks
constexpr int kLdV = kNV + 8;
constexpr int kLdA = kC + 1;    // fp32 [64, 64] matrices of the triangular solve

static_assert(kThreads == 2 * kC, "prep splits its threads into k rows and q rows");
static_assert(kD == 32 * (kThreads / 32), "each pass warp owns 32 state rows");

size_t align256(size_t n) { return (n + 255) & ~size_t(255); }

// ---- fragment helpers (cp.async, ldmatrix, mma: ptx.cuh; state elements: common.cuh) ----

// Operand fragments from shared tiles with row stride ld (elements). Lane l gives the address
// of row (l % 8) of 8x8 matrix l / 8.
// A rows m0..m0+15, cols k0..k0+15 of a row-major [m][k] tile.
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const bf16* x, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31, q = l >> 3, r = l & 7;
  ldmatrix_x4(a, x + (m0 + r + (q & 1) * 8) * ld + k0 + (q >> 1) * 8);
}
// The same A fragment of A = X^T, X stored row-major [k][m].
__device__ __forceinline__ void frag_a_trans(uint32_t (&a)[4], const bf16* x, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31, q = l >> 3, r = l & 7;
  ldmatrix_x4_trans(a, x + (k0 + r + (q >> 1) * 8) * ld + m0 + (q & 1) * 8);
}
// B rows k0..k0+15, cols n0..n0+15 (two n8 tiles: {b0, b1} cols n0.., {b2, b3} cols n0+8..)
// of B stored row-major [k][n].
__device__ __forceinline__ void frag_b(uint32_t (&b)[4], const bf16* x, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, q = l >> 3, r = l & 7;
  ldmatrix_x4_trans(b, x + (k0 + r + (q & 1) * 8) * ld + n0 + (q >> 1) * 8);
}
// The same B fragments of B = X^T, X stored row-major [n][k].
__device__ __forceinline__ void frag_b_trans(uint32_t (&b)[4], const bf16* x, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, q = l >> 3, r = l & 7;
  ldmatrix_x4(b, x + (n0 + r + (q >> 1) * 8) * ld + k0 + (q & 1) * 8);
}

// acc[0], acc[1] (the two 16x8 f32 tiles of a 16x16 block) += a bf16 [16, 16] . b, b the x4
// fragment of a 16x16 B block (frag_b / frag_b_trans: columns 0-7, then 8-15).
__device__ __forceinline__ void mma_16x16(float (*acc)[4], const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  mma_bf16(acc[0], a, b[0], b[1]);
  mma_bf16(acc[1], a, b[2], b[3]);
}

__device__ __forceinline__ void store_pair(bf16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}

// Rows [0, kC) x cols [0, width) of the shared tile dst (row stride ld) <- rows of src (row
// stride src_ld); zero where row >= L or col >= n_cols. vec: cp.async in 16-byte pieces (src,
// src_ld and n_cols multiples of 8 elements); else plain element copies.
__device__ __forceinline__ void load_rows(bf16* dst, int ld, int width, const bf16* src, int64_t src_ld, int L,
                                          int n_cols, bool vec) {
  if (vec) {
    const int per_row = width / 8;
    for (int i = threadIdx.x; i < kC * per_row; i += blockDim.x) {
      const int r = i / per_row, c = (i % per_row) * 8;
      const bool ok = r < L && c < n_cols;
      cp_async16(dst + r * ld + c, ok ? src + r * src_ld + c : src, ok);
    }
  } else {
    for (int i = threadIdx.x; i < kC * width; i += blockDim.x) {
      const int r = i / width, c = i % width;
      dst[r * ld + c] = r < L && c < n_cols ? src[r * src_ld + c] : __float2bfloat16_rn(0.f);
    }
  }
}

// ---- kernel 1: per-chunk quantities, all chunks in parallel ----

struct PrepSmem {
  bf16 k[kC * kLdD];    // raw k rows of the chunk, zero padded
  bf16 q[kC * kLdD];    // raw q rows
  float a[kC * kLdA];   // A, strictly lower
  float t[kC * kLdA];   // (I + A)^-1, unit lower
  float g[kC], beta[kC], gam[kC], kn[kC], qn[kC];  // zero on padding rows
};

// Row r of a chunk at token c0 + r: tinv, pmat bf16 [T, Hv, 64] rows of (I + A)^-1 and P;
// gam f32 [T, Hv]; kn, qn f32 [T, Hk] (written by the first v-head of each k-head).
__global__ void __launch_bounds__(kThreads)
    gdn_chunk_prep_kernel(const bf16* qkv, const float* g, const float* beta, const int32_t* cu_seqlens,
                          bf16* tinv, bf16* pmat, float* gam_out, float* kn_out, float* qn_out, int Hk, int Hv,
                          int dk, int dv, bool vec) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  PrepSmem& sm = *reinterpret_cast<PrepSmem*>(smem_raw);
  const int seq = blockIdx.y, h = blockIdx.z;
  const int t0 = cu_seqlens[seq], t1 = cu_seqlens[seq + 1];
  const int c0 = t0 + blockIdx.x * kC;
  if (c0 >= t1) return;
  const int L = min(kC, t1 - c0);
  const int ratio = Hv / Hk, kh = h / ratio;
  const bool writes_norms = h % ratio == 0;
  const int64_t C = 2LL * Hk * dk + int64_t(Hv) * dv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gr = lane >> 2, tq = lane & 3;

  load_rows(sm.k, kLdD, kD, qkv + c0 * C + Hk * dk + kh * dk, C, L, dk, vec);
  load_rows(sm.q, kLdD, kD, qkv + c0 * C + kh * dk, C, L, dk, vec);
  cp_async_commit();
  if (tid < kC) {
    const bool ok = tid < L;
    sm.g[tid] = ok ? g[int64_t(c0 + tid) * Hv + h] : 0.f;
    sm.beta[tid] = ok ? beta[int64_t(c0 + tid) * Hv + h] : 0.f;
  }
  cp_async_wait<0>();
  __syncthreads();

  {  // inverse norms: threads 0..63 of k rows, 64..127 of q rows
    const int r = tid & (kC - 1);
    const bool is_q = tid >= kC;
    const bf16* x = (is_q ? sm.q : sm.k) + r * kLdD;
    float ss = 0.f;
    for (int i = 0; i < dk; ++i) ss += to_f32(x[i]) * to_f32(x[i]);
    const float inv = r < L ? rsqrtf(ss + 1e-6f) * (is_q ? rsqrtf(static_cast<float>(dk)) : 1.f) : 0.f;
    (is_q ? sm.qn : sm.kn)[r] = inv;
    if (writes_norms && r < L) (is_q ? qn_out : kn_out)[int64_t(c0 + r) * Hk + kh] = inv;
  }
  if (warp == 0) {  // gamma = inclusive cumsum of g; lane holds rows 2 lane, 2 lane + 1
    const float a0 = sm.g[2 * lane], a1 = a0 + sm.g[2 * lane + 1];
    float incl = a1;
    for (int o = 1; o < 32; o <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += n;
    }
    const float excl = incl - a1;
    sm.gam[2 * lane] = excl + a0;
    sm.gam[2 * lane + 1] = excl + a1;
    for (int r = 2 * lane; r < 2 * lane + 2; ++r)
      if (r < L) gam_out[int64_t(c0 + r) * Hv + h] = sm.gam[r];
  }
  __syncthreads();

  // G = K K^T and QK = Q K^T (raw) on tensor cores: warp w has rows 16w..16w+15, column
  // blocks up to its diagonal.
  const int m0 = 16 * warp;
  float G[8][4] = {}, QK[8][4] = {};
  for (int kk = 0; kk < (dk + 15) / 16; ++kk) {
    uint32_t ak[4], aq[4];
    frag_a(ak, sm.k, kLdD, m0, 16 * kk);
    frag_a(aq, sm.q, kLdD, m0, 16 * kk);
#pragma unroll
    for (int np = 0; np < 4; ++np)
      if (np <= warp) {
        uint32_t b[4];
        frag_b_trans(b, sm.k, kLdD, 16 * kk, 16 * np);
        mma_16x16(&G[2 * np], ak, b);
        mma_16x16(&QK[2 * np], aq, b);
      }
  }
  // A into shared memory; P rows straight to global memory (zero beyond the diagonal block).
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = m0 + gr + 8 * hf;
      float pv[2] = {0.f, 0.f};
      if (nt / 2 <= warp) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int s = 8 * nt + 2 * tq + e;
          const bool in_chunk = s <= r && r < L;
          const float decay = in_chunk ? expf(sm.gam[r] - sm.gam[s]) : 0.f;
          sm.a[r * kLdA + s] = s < r ? sm.beta[r] * sm.kn[r] * sm.kn[s] * G[nt][2 * hf + e] * decay : 0.f;
          pv[e] = sm.qn[r] * sm.kn[s] * QK[nt][2 * hf + e] * decay;
        }
      }
      if (r < L) store_pair(pmat + (int64_t(c0 + r) * Hv + h) * kC + 8 * nt + 2 * tq, pv[0], pv[1]);
    }
  __syncthreads();

  // T = (I + A)^-1, row by row: T[r][j] = delta_rj - sum_{s<r} A[r][s] T[s][j] (thread j; T is
  // lower triangular, so its zeros above the diagonal come out of the same loop).
  for (int r = 0; r < L; ++r) {
    if (tid < kC) {
      float acc = r == tid ? 1.f : 0.f;
      for (int s = 0; s < r; ++s) acc -= sm.a[r * kLdA + s] * sm.t[s * kLdA + tid];
      sm.t[r * kLdA + tid] = acc;
    }
    __syncthreads();
  }
  for (int i = tid; i < L * (kC / 2); i += kThreads) {
    const int r = i / (kC / 2), j = 2 * (i % (kC / 2));
    store_pair(tinv + (int64_t(c0 + r) * Hv + h) * kC + j, sm.t[r * kLdA + j], sm.t[r * kLdA + j + 1]);
  }
}

// ---- kernel 2: sequential over chunks, per (sequence, v-head, column tile) ----

struct PassSmem {
  bf16 k[2][kC * kLdD];  // raw k rows (double buffered: the state update reads them last)
  bf16 q[kC * kLdD];     // raw q rows
  bf16 tinv[kC * kLdC];  // (I + A)^-1
  bf16 p[2][kC * kLdC];  // P (double buffered: read last, by step 3)
  bf16 v[kC * kLdV];     // raw v, the tile's columns
  bf16 y[kC * kLdV];     // diag(beta) (V - diag(e^gamma) K S)
  bf16 vn[kC * kLdV];    // V'
  bf16 vd[kC * kLdV];    // V' rows times kn e^(gamma_L - gamma), for the state update
  bf16 s[kD * kLdV];     // S at the chunk start (bf16 operand copy)
  float gam[2][kC], beta[2][kC], kn[2][kC], qn[2][kC];  // zero on padding rows
};

// Two pass blocks share an SM (228 KB): 192 blocks of the 27B's 48 heads run in one wave.
static_assert(sizeof(PassSmem) + 1024 <= 228 * 1024 / 2, "pass shared memory");

struct PassArgs {
  const bf16* qkv;
  const float* beta;
  void* state;
  bf16* out;
  const int32_t *cu_seqlens, *n_past, *slots;
  const bf16 *tinv, *pmat;
  const float *gam, *kn, *qn;
  int state_dtype, Hk, Hv, dk, dv;
  bool vec;
};

__global__ void __launch_bounds__(kThreads) gdn_chunk_pass_kernel(PassArgs p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  PassSmem& sm = *reinterpret_cast<PassSmem*>(smem_raw);
  const int seq = blockIdx.x, h = blockIdx.y, col0 = blockIdx.z * kNV;
  const int t0 = p.cu_seqlens[seq], t1 = p.cu_seqlens[seq + 1];
  if (t1 == t0) return;
  const int Hk = p.Hk, Hv = p.Hv, dk = p.dk, dv = p.dv;
  const int kh = h / (Hv / Hk);
  const int64_t C = 2LL * Hk * dk + int64_t(Hv) * dv;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gr = lane >> 2, tq = lane & 3;
  const int nk = (dk + 15) / 16;  // 16-wide steps over the head dim
  const int n_chunks = (t1 - t0 + kC - 1) / kC;

  // Chunk c's inputs into shared memory (k and the per-row values into buffer b).
  auto issue_kq = [&](int c, int b) {
    const int c0 = t0 + c * kC, L = min(kC, t1 - c0);
    const bf16* row0 = p.qkv + c0 * C;
    load_rows(sm.k[b], kLdD, kD, row0 + Hk * dk + kh * dk, C, L, dk, p.vec);
    load_rows(sm.q, kLdD, kD, row0 + kh * dk, C, L, dk, p.vec);
    const int r = tid & (kC - 1);
    const bool ok = r < L;
    if (tid < kC) {
      const int64_t i = int64_t(c0 + r) * Hv + h;
      cp_async4(&sm.gam[b][r], ok ? p.gam + i : p.gam, ok);
      cp_async4(&sm.beta[b][r], ok ? p.beta + i : p.beta, ok);
    } else {
      const int64_t i = int64_t(c0 + r) * Hk + kh;
      cp_async4(&sm.kn[b][r], ok ? p.kn + i : p.kn, ok);
      cp_async4(&sm.qn[b][r], ok ? p.qn + i : p.qn, ok);
    }
  };
  auto issue_v = [&](int c) {
    const int c0 = t0 + c * kC, L = min(kC, t1 - c0);
    load_rows(sm.v, kLdV, kNV, p.qkv + c0 * C + 2 * Hk * dk + h * dv + col0, C, L, dv - col0, p.vec);
  };
  auto issue_tp = [&](int c, int b) {
    const int c0 = t0 + c * kC, L = min(kC, t1 - c0);
    const int64_t row0 = (int64_t(c0) * Hv + h) * kC;
    load_rows(sm.tinv, kLdC, kC, p.tinv + row0, int64_t(Hv) * kC, L, kC, true);
    load_rows(sm.p[b], kLdC, kC, p.pmat + row0, int64_t(Hv) * kC, L, kC, true);
  };
  issue_kq(0, 0);
  issue_v(0);
  issue_tp(0, 0);
  cp_async_commit();

  // State tile in the accumulator layout: S[mt][nt][e] is row 32 warp + 16 mt + gr + 8 (e / 2),
  // column 8 nt + 2 tq + e % 2 of the tile (state column col0 + that).
  const int64_t state_off = (int64_t(p.slots[seq]) * Hv + h) * dk * dv;
  const bool fresh = p.n_past[seq] == 0;
  float S[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 32 * warp + 16 * mt + gr + 8 * (e >> 1), j = col0 + 8 * nt + 2 * tq + (e & 1);
        S[mt][nt][e] = !fresh && i < dk && j < dv ? load_state(p.state, state_off + int64_t(i) * dv + j, p.state_dtype)
                                                  : 0.f;
      }
  auto write_state_operand = [&]() {  // this warp's rows of S into sm.s
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 32 * warp + 16 * mt + gr + 8 * hf, j = 8 * nt + 2 * tq;
          store_pair(&sm.s[i * kLdV + j], S[mt][nt][2 * hf], S[mt][nt][2 * hf + 1]);
        }
  };
  write_state_operand();

  const int m0 = 16 * warp;  // this warp's chunk rows in steps 1-3
  for (int c = 0; c < n_chunks; ++c) {
    const int b = c & 1, c0 = t0 + c * kC, L = min(kC, t1 - c0);
    cp_async_wait<0>();
    __syncthreads();
    const bf16* kc = sm.k[b];
    const float *gam = sm.gam[b], *beta = sm.beta[b], *kn = sm.kn[b], *qn = sm.qn[b];
    const float gL = gam[L - 1];

    // 1. X = K S, O = Q S (raw k, q).
    float X[4][4] = {}, O[4][4] = {};
    for (int kk = 0; kk < nk; ++kk) {
      uint32_t ak[4], aq[4];
      frag_a(ak, kc, kLdD, m0, 16 * kk);
      frag_a(aq, sm.q, kLdD, m0, 16 * kk);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t bs[4];
        frag_b(bs, sm.s, kLdV, 16 * kk, 16 * np);
        mma_16x16(&X[2 * np], ak, bs);
        mma_16x16(&O[2 * np], aq, bs);
      }
    }
    // O rows *= e^gamma qn (inter-chunk part); Y = diag(beta) (V - diag(e^gamma kn) X).
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = m0 + gr + 8 * hf, j = 8 * nt + 2 * tq;
        const float eg = expf(gam[r]);
        O[nt][2 * hf] *= eg * qn[r];
        O[nt][2 * hf + 1] *= eg * qn[r];
        const float xs = eg * kn[r];
        const float y0 = beta[r] * (to_f32(sm.v[r * kLdV + j]) - xs * X[nt][2 * hf]);
        const float y1 = beta[r] * (to_f32(sm.v[r * kLdV + j + 1]) - xs * X[nt][2 * hf + 1]);
        store_pair(&sm.y[r * kLdV + j], y0, y1);
      }
    __syncthreads();  // Y complete; q, v and the other k buffer are free
    if (c + 1 < n_chunks) {
      issue_kq(c + 1, b ^ 1);
      issue_v(c + 1);
      cp_async_commit();
    }

    // 2. V' = T Y (T lower triangular: column blocks up to the diagonal).
    float Vn[4][4] = {};
    for (int kk = 0; kk <= warp; ++kk) {
      uint32_t at[4];
      frag_a(at, sm.tinv, kLdC, m0, 16 * kk);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t by[4];
        frag_b(by, sm.y, kLdV, 16 * kk, 16 * np);
        mma_16x16(&Vn[2 * np], at, by);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = m0 + gr + 8 * hf, j = 8 * nt + 2 * tq;
        const float d = r < L ? kn[r] * expf(gL - gam[r]) : 0.f;
        store_pair(&sm.vn[r * kLdV + j], Vn[nt][2 * hf], Vn[nt][2 * hf + 1]);
        store_pair(&sm.vd[r * kLdV + j], d * Vn[nt][2 * hf], d * Vn[nt][2 * hf + 1]);
      }
    __syncthreads();  // V' complete; T, Y and the other P buffer are free
    if (c + 1 < n_chunks) {
      issue_tp(c + 1, b ^ 1);
      cp_async_commit();
    }

    // 3. O += P V', then the chunk's outputs.
    for (int kk = 0; kk <= warp; ++kk) {
      uint32_t ap[4];
      frag_a(ap, sm.p[b], kLdC, m0, 16 * kk);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t bv[4];
        frag_b(bv, sm.vn, kLdV, 16 * kk, 16 * np);
        mma_16x16(&O[2 * np], ap, bv);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + gr + 8 * (e >> 1), j = col0 + 8 * nt + 2 * tq + (e & 1);
        if (r < L && j < dv) p.out[(int64_t(c0 + r) * Hv + h) * dv + j] = to_bf16(O[nt][e]);
      }

    // 4. S <- e^gamma_L S + K^T Vd over the chunk's valid 16-row blocks (rows 32 warp .. + 31).
    const float decay = expf(gL);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[mt][nt][e] *= decay;
    for (int kk = 0; kk < (L + 15) / 16; ++kk) {
      uint32_t bv[2][4];
      frag_b(bv[0], sm.vd, kLdV, 16 * kk, 0);
      frag_b(bv[1], sm.vd, kLdV, 16 * kk, 16);
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        uint32_t ak[4];
        frag_a_trans(ak, kc, kLdD, 32 * warp + 16 * mt, 16 * kk);
#pragma unroll
        for (int np = 0; np < 2; ++np) mma_16x16(&S[mt][2 * np], ak, bv[np]);
      }
    }
    write_state_operand();  // sm.s was last read in step 1, before two barriers
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = 32 * warp + 16 * mt + gr + 8 * (e >> 1), j = col0 + 8 * nt + 2 * tq + (e & 1);
        if (i < dk && j < dv) store_state(p.state, state_off + int64_t(i) * dv + j, S[mt][nt][e], p.state_dtype);
      }
}

}  // namespace

bool gdn_chunked_supported(int dk, int dv) { return dk >= 1 && dk <= kD && dv >= 1 && dv <= kD; }

size_t gdn_chunked_scratch_bytes(int T, int Hk, int Hv) {
  return 2 * align256(size_t(T) * Hv * kC * sizeof(bf16)) + align256(size_t(T) * Hv * sizeof(float)) +
         2 * align256(size_t(T) * Hk * sizeof(float));
}

void launch_gdn_chunked(const bf16* qkv, const float* g, const float* beta, void* state, int state_dtype, bf16* out,
                        const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int n_seqs, int T,
                        int max_seq_len, int Hk, int Hv, int dk, int dv, void* scratch, cudaStream_t s) {
  if (n_seqs == 0 || T == 0 || max_seq_len == 0) return;
  char* at = static_cast<char*>(scratch);
  bf16* tinv = reinterpret_cast<bf16*>(at);  // bf16 [T, Hv, 64]
  at += align256(size_t(T) * Hv * kC * sizeof(bf16));
  bf16* pmat = reinterpret_cast<bf16*>(at);  // bf16 [T, Hv, 64]
  at += align256(size_t(T) * Hv * kC * sizeof(bf16));
  float* gam = reinterpret_cast<float*>(at);  // f32 [T, Hv]
  at += align256(size_t(T) * Hv * sizeof(float));
  float* kn = reinterpret_cast<float*>(at);  // f32 [T, Hk]
  at += align256(size_t(T) * Hk * sizeof(float));
  float* qn = reinterpret_cast<float*>(at);  // f32 [T, Hk]
  // 16-byte copies of q/k/v rows need every row and head offset on 8 elements.
  const bool vec = dk % 8 == 0 && dv % 8 == 0 && aligned16(qkv);

  const size_t prep_smem = sizeof(PrepSmem);
  CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem));
  const dim3 prep_grid((max_seq_len + kC - 1) / kC, n_seqs, Hv);
  gdn_chunk_prep_kernel<<<prep_grid, kThreads, prep_smem, s>>>(qkv, g, beta, cu_seqlens, tinv, pmat, gam, kn, qn,
                                                                Hk, Hv, dk, dv, vec);
  cuda_check_launch("gdn_chunk_prep", s);

  const size_t pass_smem = sizeof(PassSmem);
  CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_pass_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pass_smem));
  CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_pass_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
  const PassArgs args{qkv, beta, state, out, cu_seqlens, n_past, slots, tinv, pmat, gam, kn, qn, state_dtype, Hk, Hv, dk, dv,
                      vec};
  const dim3 pass_grid(n_seqs, Hv, (dv + kNV - 1) / kNV);
  gdn_chunk_pass_kernel<<<pass_grid, kThreads, pass_smem, s>>>(args);
  cuda_check_launch("gdn_chunk_pass", s);
}

}  // namespace ds::cuda
