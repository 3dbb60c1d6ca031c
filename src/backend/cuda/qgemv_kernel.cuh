// Device code of the quantized GEMV shared by the W4A16 and int8 weights (both tiled):
// out bf16 [T, N] = x bf16 [T, K] . W^T for T <= 8 * NT tokens on bf16 tensor cores
// (mma.m16n8k16, fp32 accumulation), streaming the weights once for all tokens. The output may
// be cut into parts (OutParts: the rows of a fused weight, Ops::linear_parts).
//
// Work: a warp owns one block of 16 output rows over a range of 64-column chunks; a thread
// block is 8 warps (128 rows, one "tile"); gridDim.y splits K so small N still fills the GPU.
// A weight format exposes `load` (one chunk of the warp's 16 rows: raw codes + the two scales
// of the lane's rows) and `a_frag` (the mma A operand of one 16-column k-step, as exact integer
// values in bf16). Each chunk's integer dot products are scaled in fp32 afterwards, so the
// result is the fp32 math of the dequantised weights, not a bf16 rounding of them.
//
// The main loop loads U chunks into registers (all in flight), then uses them. (A cp.async ring
// of 4 or 8 shared-memory slots per lane, and reading the input through its SwiGLU/sigmoid gate,
// were measured slower on the H200: docs/perf/2026-11-29-s4-cuda-27b.md.)
//
// Column order inside a chunk: mma k-step j (0..3) slot s of lane (g = lane / 4, q = lane % 4)
// is chunk column 16 q + 4 j + (s < 8 ? 0 : 2) + (s & 1); so lane q's B operand (x) for the whole
// chunk is the 16 contiguous columns [16 q, 16 q + 16) and its A operand for rows g and g + 8 is
// the same 16 columns of those rows. Any order is exact as long as A and B agree.
//
// Split-K (gridDim.y > 1): each block writes fp32 partials [split, T, N]; the last block of a
// tile to finish (a per-tile counter, reset by that block) sums them in split order, so results
// do not depend on scheduling.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv_out.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda::qgemv {

constexpr int kWarps = 8;                   // warps per block, one 16-row block each
constexpr int kTileRows = 16 * kWarps;      // output rows per block
static_assert(kTileRows == kGemvTileRows, "GemvNorm's tiles are the split-K tiles");
constexpr int kChunk = 64;                  // input columns per chunk (4 mma k-steps)

// 16 bytes read once: not kept in L1, so L1 keeps x for the other warps.
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a compile-time constant after unrolling
}

__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Nibbles at bits 0-3 and 16-19 of t (stored q + 8) -> bf16x2 (q_lo, q_hi), exact:
// 0x4300 | n is the bf16 128 + n, minus 136. (Leaving out the subtraction, the mma summing
// q + 136 and 136 times each chunk's input sum taken off afterwards, was slower on the H200 in
// every form tried: the sums made at the start of each launch, or a second mma against -136,
// cost more than the loop saved: docs/perf/2026-12-03-s34-cuda-27b.md.)
__device__ __forceinline__ uint32_t nibbles_to_bf16x2(uint32_t t) {
  return bf16x2_sub(and_or<0x000F000Fu>(t, 0x43004300u), 0x43084308u);
}

// Signed bytes at bits 0-7 and 16-23 of t -> bf16x2, exact: (128 + low 7 bits) - (128 or 256
// by the sign bit), both built by OR-ing into the bf16 exponent of 128.
__device__ __forceinline__ uint32_t bytes_to_bf16x2(uint32_t t) {
  return bf16x2_sub((t & 0x007F007Fu) | 0x43004300u, (t & 0x00800080u) | 0x43004300u);
}

// W4A16 repacked at load (w4a16.cu): for each 16-row block, ceil(K / 256) units of kUnitChunks
// chunks, each unit `slots` scale slots (f32 [8 g][2]: rows g, g + 8 of one group) followed by
// its chunks (u32 [kUnitChunks][32 lanes][4]), so a unit is one contiguous copy.
constexpr int kUnitChunks = 4;    // chunks per unit
constexpr int kChunkBytes = 512;  // one chunk of a 16-row block: a uint4 per lane
constexpr int kSlotBytes = 64;    // one scale slot
struct W4Tiled {
  const unsigned char* base;
  int n_chunks;    // K / 64
  int n_units;     // ceil(n_chunks / kUnitChunks)
  int unit_bytes;  // slots * kSlotBytes + kUnitChunks * kChunkBytes
  int slots;       // kUnitChunks >> slot_shift
  int slot_shift;  // min(log2(group / 64), 2): chunk u of a unit has its scales in slot u >> slot_shift

  __device__ __forceinline__ int64_t unit_offset(int rb, int u) const {
    return (int64_t(rb) * n_units + u) * unit_bytes;
  }
  __device__ __forceinline__ const unsigned char* unit(int rb, int u) const { return base + unit_offset(rb, u); }
  // Bytes of one copy of n chunks of a row block from a unit's start: whole units, then a short
  // unit's scales and its chunks.
  __device__ __forceinline__ uint32_t copy_bytes(int n) const {
    const int rem = n % kUnitChunks;
    return n / kUnitChunks * unit_bytes + (rem ? slots * kSlotBytes + rem * kChunkBytes : 0);
  }

  struct Frag {
    uint4 w;    // word j: k-step j, nibbles r and r + 4 = A register r
    float2 s;   // scales of rows g, g + 8
  };
  __device__ __forceinline__ Frag load(int rb, int c, int lane, int /*N*/) const {
    const unsigned char* u = unit(rb, c / kUnitChunks);
    const int cu = c % kUnitChunks;
    Frag f;
    f.w = load_stream(u + slots * kSlotBytes + cu * kChunkBytes + 16 * lane);
    f.s = __ldg(reinterpret_cast<const float2*>(u + (cu >> slot_shift) * kSlotBytes) + lane / 4);
    return f;
  }
  __device__ __forceinline__ void a_frag(const Frag& f, int j, uint32_t (&a)[4]) const {
    const uint32_t word = word_of(f.w, j);
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = nibbles_to_bf16x2(word >> (4 * r));
  }
  // The wide kernels' stages (qgemv_wide.cuh): a unit holds its own scales, so none are staged.
  static constexpr int kStagedScaleBytes = 0;
  // Chunk c of a unit as a stage holds it in shared memory (unit: the row block's; scales: unused).
  __device__ __forceinline__ Frag stage_frag(const unsigned char* unit, const float2* /*scales*/, int c,
                                             int lane) const {
    Frag f;
    f.w = reinterpret_cast<const uint4*>(unit + slots * kSlotBytes)[c * 32 + lane];
    f.s = reinterpret_cast<const float2*>(unit)[(c >> slot_shift) * 8 + lane / 4];
    return f;
  }
};

// The view of a weight in the tiled layout (w4a16.cu): K columns in groups of `group`.
W4Tiled tiled_weight(const uint32_t* tiled, int K, int group);

// Int8 group-128 tables in the tile layout (int8_rows.cu), rows padded to whole 16-row blocks
// with zeros: for row block b and chunk c (columns [64c, 64c + 64)), 1,024 bytes at
// (b K/64 + c) 1024, the first 512 rows 16b + g and the last 512 rows 16b + 8 + g (g < 8), lane
// l = 4g + j of each half holding the 16 columns [64c + 16j, + 16) of its row; so a warp's two
// 16-byte loads a chunk read 1,024 contiguous bytes, and its chunks follow each other. Scales f32
// at ((b K/128 + group) 8 + g) 2 + (row's half): a lane's two rows' scales are one float2.
__host__ __device__ constexpr int64_t int8_tile_offset(int64_t r, int k, int K) {
  return ((r / 16) * (K / kChunk) + k / kChunk) * 1024 + (r % 16 / 8) * 512 + ((r % 8) * 4 + k % kChunk / 16) * 16 +
         k % 16;
}
__host__ __device__ constexpr int64_t int8_scale_index(int64_t r, int k, int K) {
  return (((r / 16) * (K / 128) + k / 128) * 8 + r % 8) * 2 + r % 16 / 8;
}
// Int8Tiled::load reads this layout with its own arithmetic (a chunk's base, + 512 for rows g + 8,
// a float2 of scales): the two agree, here for row block 5, lane 4 * 3 + 2, chunk 7 at K 1024.
static_assert(int8_tile_offset(16 * 5 + 3, 64 * 7 + 16 * 2, 1024) == (5 * 16 + 7) * 1024 + 16 * (4 * 3 + 2));
static_assert(int8_tile_offset(16 * 5 + 8 + 3, 64 * 7 + 16 * 2, 1024) ==
              (5 * 16 + 7) * 1024 + 512 + 16 * (4 * 3 + 2));
static_assert(int8_scale_index(16 * 5 + 3, 64 * 7, 1024) == 2 * ((5 * 8 + 7 / 2) * 8 + 3));
struct Int8Tiled {
  const int8_t* q;
  const float* scales;
  int n_chunks;  // K / 64
  int n_groups;  // K / 128

  struct Frag {
    uint4 lo, hi;  // rows g and g + 8, the lane's 16 columns
    float2 s;
  };
  __device__ __forceinline__ Frag load(int rb, int c, int lane, int /*N: padded rows read zeros*/) const {
    const int8_t* chunk = q + (int64_t(rb) * n_chunks + c) * 1024;
    Frag f;
    f.lo = load_stream(chunk + 16 * lane);
    f.hi = load_stream(chunk + 512 + 16 * lane);
    f.s = __ldg(reinterpret_cast<const float2*>(scales) + (int64_t(rb) * n_groups + c / 2) * 8 + lane / 4);
    return f;
  }
  __device__ __forceinline__ void a_frag(const Frag& f, int j, uint32_t (&a)[4]) const {
    const uint32_t w0 = word_of(f.lo, j), w1 = word_of(f.hi, j);  // columns 4j .. 4j + 3
    a[0] = bytes_to_bf16x2(__byte_perm(w0, 0, 0x4140));  // row g,     columns 4j, 4j + 1
    a[1] = bytes_to_bf16x2(__byte_perm(w1, 0, 0x4140));  // row g + 8
    a[2] = bytes_to_bf16x2(__byte_perm(w0, 0, 0x4342));  // row g,     columns 4j + 2, 4j + 3
    a[3] = bytes_to_bf16x2(__byte_perm(w1, 0, 0x4342));  // row g + 8
  }
  // The wide kernels' stages (qgemv_wide.cuh): a unit is kUnitChunks chunks of a row block's codes
  // (the tile layout's 1,024 bytes a chunk, one after the other), and the stage holds the scales
  // of its 16 row blocks apart, f32 [16 row blocks][2 groups][8 g][2], as the table has them.
  static constexpr int unit_bytes = kUnitChunks * 1024;
  static constexpr int kStagedScaleBytes = 16 * 2 * 64;
  // Chunk c of a unit as a stage holds it (unit: the row block's codes; scales: its two groups').
  __device__ __forceinline__ Frag stage_frag(const unsigned char* unit, const float2* scales, int c, int lane) const {
    Frag f;
    f.lo = reinterpret_cast<const uint4*>(unit)[c * 64 + lane];
    f.hi = reinterpret_cast<const uint4*>(unit)[c * 64 + 32 + lane];
    f.s = scales[(c / 2) * 8 + lane / 4];
    return f;
  }
};

// 8 input values from element offset i (16-byte aligned), through L1 (the block's warps share x).
__device__ __forceinline__ uint4 load_x8(const __nv_bfloat16* x, int64_t i) {
  return __ldg(reinterpret_cast<const uint4*>(x + i));
}

// acc += the chunk's contribution: f holds the warp's 16 rows of the chunk, col0 = 64 c + 16 q4
// (token t's columns start at element t K + col0 of the input).
template <class Fmt, int NT>
__device__ __forceinline__ void accumulate_chunk(const Fmt& w, const typename Fmt::Frag& f, const __nv_bfloat16* x,
                                                 int col0, int T, int K, int g, float (&acc)[NT][4]) {
  float p[NT][4] = {};
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // columns [8h, 8h + 8) of the lane's 16: k-steps 2h, 2h + 1
    uint4 xv[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int t = nt * 8 + g;
      xv[nt] = t < T ? load_x8(x, int64_t(t) * K + col0 + 8 * h) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      uint32_t a[4];
      w.a_frag(f, 2 * h + jj, a);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_bf16(p[nt], a, word_of(xv[nt], 2 * jj), word_of(xv[nt], 2 * jj + 1));
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    acc[nt][0] += f.s.x * p[nt][0];
    acc[nt][1] += f.s.x * p[nt][1];
    acc[nt][2] += f.s.y * p[nt][2];
    acc[nt][3] += f.s.y * p[nt][3];
  }
}

// A warp's accumulators of one token tile of row block rb to out as store_row_block's Norm form
// stores them, scaled by r0 and r1: the factors of the lane's tokens 2 q4 and 2 q4 + 1.
__device__ __forceinline__ void store_row_block_scaled(const float (&acc)[1][4], const OutParts& out, int T, int N,
                                                       int rb, int lane, float r0, float r1) {
  const int g = lane / 4, q4 = lane % 4, row = rb * 16 + g;
  if (out.swiglu) {
    if (2 * q4 < T && row < N) out.store_swiglu(2 * q4, rb * 8 + g, acc[0][0] * r0, acc[0][2] * r0);
    if (2 * q4 + 1 < T && row < N) out.store_swiglu(2 * q4 + 1, rb * 8 + g, acc[0][1] * r1, acc[0][3] * r1);
    return;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int t = 2 * q4 + (i & 1), n = row + (i >= 2 ? 8 : 0);
    if (t < T && n < N) out.store(t, n, acc[0][i] * ((i & 1) ? r1 : r0));
  }
}
// The factors store_row_block_scaled takes: a consumer's scale of the lane's tokens 2 q4 and
// 2 q4 + 1 (1 without one); the whole warp calls.
__device__ __forceinline__ void lane_row_scales(const OutParts& out, int T, int lane, float& r0, float& r1) {
  const int q4 = lane % 4;
  r0 = 1.f;
  r1 = 1.f;
  if (out.scales()) {
    out.row_scales8(0, T, [&](int t, float f) {
      if (t == 2 * q4) r0 = f;
      if (t == 2 * q4 + 1) r1 = f;
    });
  }
}

// A warp's accumulators of row block rb to out (those of tokens below T and rows below N). With
// out.swiglu (a paired weight, one token tile) rows g and g + 8 are the gate and up of output
// 8 rb + g.
// Norm: a consumer's scale (out.norm) at one token tile; the whole warp calls.
template <int NT, bool Norm = false>
__device__ __forceinline__ void store_row_block(const float (&acc)[NT][4], const OutParts& out, int T, int N, int rb,
                                                int lane) {
  // Accumulator i of tile nt: row rb*16 + g (+8 for i >= 2), token nt*8 + 2*q4 + (i & 1).
  const int g = lane / 4, q4 = lane % 4, row = rb * 16 + g;
  if constexpr (Norm) {  // one token tile
    static_assert(NT == 1, "a consumer's scale at one token tile");
    float r0, r1;
    lane_row_scales(out, T, lane, r0, r1);
    store_row_block_scaled(acc, out, T, N, rb, lane, r0, r1);
    return;
  }
  // One tile only (kGemvSwigluMaxTokens): in the 8-tile kernels the code cost registers and spills.
  if constexpr (NT == 1) {
    if (out.swiglu) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int t = 2 * q4 + i;
        if (t < T && row < N) out.store_swiglu(t, rb * 8 + g, acc[0][i], acc[0][i + 2]);
      }
      return;
    }
  }
  // The lane's two rows looked up once for all its tokens (at 8 tiles, 32 stores).
  const OutParts::Row rows[2] = {out.row(row), out.row(row + 8)};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = nt * 8 + 2 * q4 + (i & 1), n = row + (i >= 2 ? 8 : 0);
      if (t < T && n < N) rows[i >> 1].store(t, acc[nt][i]);
    }
}

// Partials loaded at once by sum_splits: a split sum pays an L2 round trip per kSumBatch splits.
// A plain loop over the splits, which the compiler unrolled by 4 with a branch per remaining
// split, paid three at 9 or 3 splits, and the last block of a tile pays them for each of its
// outputs in turn (4 a thread at 8 tokens): C8 8.04 against 7.80 ms, verify 8 7.58 against 7.34
// on the H200, one token unchanged (docs/perf/2026-12-01-s16-cuda-27b.md).
constexpr int kSumBatch = 12;
__device__ __forceinline__ void add_to(float& s, float v) { s += v; }
__device__ __forceinline__ void add_to(float4& s, float4 v) {
  s.x += v.x;
  s.y += v.y;
  s.z += v.z;
  s.w += v.w;
}
// The sum of p[0], p[stride], .. p[(splits - 1) stride] (V: float or float4), in split order from
// zero, as a plain loop adds them. Each batch loads Batch splits before adding any: those past the
// last load the last again (no branch around a load) and are not added.
template <int Batch, class V>
__device__ __forceinline__ V sum_splits(const V* p, int64_t stride, int splits) {
  V s{};
  if constexpr (Batch == 1) {
    for (int sp = 0; sp < splits; ++sp) add_to(s, __ldcg(p + sp * stride));
  } else {
    for (int sp0 = 0; sp0 < splits; sp0 += Batch) {
      V v[Batch];
#pragma unroll
      for (int k = 0; k < Batch; ++k) v[k] = __ldcg(p + min(sp0 + k, splits - 1) * stride);
#pragma unroll
      for (int k = 0; k < Batch; ++k)
        if (sp0 + k < splits) add_to(s, v[k]);
    }
  }
  return s;
}

// The producer's epilogue of a GemvNorm (out.norm.x) for rows n .. n + 3 of token t (at = t N + n):
// given their x (bf16 x 4), norm weights and split sums v, x += bf16(v) and part 0 = hv =
// bf16(x * w); returns the sum of the new x^2.
__device__ __forceinline__ float norm_rows(const OutParts& out, int64_t at, uint2 xv, float4 w, float4 v, uint2& hv) {
  __nv_bfloat16* xb = reinterpret_cast<__nv_bfloat16*>(&xv);
  const float y[4] = {v.x, v.y, v.z, v.w}, wv[4] = {w.x, w.y, w.z, w.w};
  __nv_bfloat16* hb = reinterpret_cast<__nv_bfloat16*>(&hv);
  float sq = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    xb[e] = to_bf16(to_f32(xb[e]) + to_f32(to_bf16(y[e])));
    const float xf = to_f32(xb[e]);
    hb[e] = to_bf16(xf * wv[e]);
    sq += xf * xf;
  }
  *reinterpret_cast<uint2*>(out.norm.x + at) = xv;
  *reinterpret_cast<uint2*>(out.ptr[0] + at) = hv;
  return sq;
}

// W4A8 inputs in GemvInt8In's layout (ops/act_int8.h's rounding): 4 consecutive inputs f of a
// chunk whose max |x| is amax, as int8 stored in the column order 0, 2, 1, 3 (the order of the
// int8 mma's codes); and the chunk's scale, with the 1/16 of those codes.
__device__ __forceinline__ uint32_t int8x4_of(const float* f, float amax) {
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  uint32_t q[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) q[k] = static_cast<uint32_t>(__float2int_rn(f[k] * inv)) & 0xFFu;
  return q[0] | q[2] << 8 | q[1] << 16 | q[3] << 24;
}
__device__ __forceinline__ float int8_input_scale(float amax) { return amax / (127.f * 16.f); }

// The int8 twin of a producer's rows n .. n + 3 of token t (hv: their bf16 values; out.norm.q8,
// GemvInt8In's layout): the whole warp calls, lanes 0-15 and 16-31 each one 64-row chunk (n0 + 4
// lane a multiple of 128 at lane 0), rows from N (N % 64 == 0: whole chunks) left out.
__device__ __forceinline__ void norm_rows_int8(const GemvNorm& norm, uint2 hv, int t, int n, int N, int lane) {
  float f[4];
  unpack4(hv, f);
  float amax = fmaxf(fmaxf(fabsf(f[0]), fabsf(f[1])), fmaxf(fabsf(f[2]), fabsf(f[3])));
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (n >= N) return;
  *reinterpret_cast<uint32_t*>(norm.q8 + int64_t(t) * N + n) = int8x4_of(f, amax);
  if (lane % 16 == 0) norm.q8_scale[t * (N / kChunk) + n / kChunk] = int8_input_scale(amax);
}

// The block's results to out: directly without split-K, else through the partials (the last
// block of the tile sums them). Every thread of the block calls it. Norm: an out.norm (the
// one-tile TMA kernels: the producer's epilogue in split-K launches, a consumer's scale in all).
template <int NT, bool Norm = false>
__device__ __forceinline__ void store_results(const float (&acc)[NT][4], const OutParts& out,
                                              float* __restrict__ partial, int* __restrict__ counters, int T, int N,
                                              int rb, int lane) {
  // Accumulator i of tile nt: row rb*16 + g (+8 for i >= 2), token nt*8 + 2*q4 + (i & 1).
  const int g = lane / 4, q4 = lane % 4, row = rb * 16 + g;
  const int splits = gridDim.y, split = blockIdx.y;
  if (splits == 1) {
    store_row_block<NT, Norm>(acc, out, T, N, rb, lane);
    return;
  }
  float* mine = partial + int64_t(split) * T * N;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int t = nt * 8 + 2 * q4 + (i & 1), n = row + (i >= 2 ? 8 : 0);
      if (t < T && n < N) mine[int64_t(t) * N + n] = acc[nt][i];
    }
  // The block's partials are released by one acquire-release arrival after the barrier (not a
  // fence per thread); the last block's reads of the others' come after its acquire.
  __shared__ int is_last;
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomic_add_acq_rel_gpu(&counters[blockIdx.x], 1) == splits - 1;
  __syncthreads();
  if (!is_last) return;
  const int n0 = blockIdx.x * kTileRows;
  // The tile's rows are stored: the counter ready for the next launch.
  auto finish = [&] {
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;
  };
  const int64_t split_stride = int64_t(T) * N;
  // The split sums (the other blocks' partials, read after the acquire). One token tile:
  // kSumBatch splits loaded at once, 4 rows of a token a thread where N % 4 == 0 (16-byte loads;
  // the launchers check that partial is 16-byte aligned). The kernels of more tiles (taken where
  // the wide kernel is off) add one partial at a time: they are at their register limit, and the
  // batches made them spill.
  constexpr int batch = NT == 1 ? kSumBatch : 1;
  auto sum_of = [&](int t, int n) { return sum_splits<batch>(partial + int64_t(t) * N + n, split_stride, splits); };
  if constexpr (NT == 1) {
    if (out.swiglu) {  // a thread a pair: rows n and n + 8 of a 16-row block
      // A consumer's scale (Norm): every loop's bound is a multiple of 32, so a warp's turn is one
      // token's and the whole warp takes its factor.
      for (int i = threadIdx.x; i < T * kTileRows / 2; i += blockDim.x) {
        const int t = i / (kTileRows / 2), j = i % (kTileRows / 2), n = n0 + (j / 8) * 16 + j % 8;
        if constexpr (Norm) {
          const float r = out.scales() ? out.row_scale(t, T) : 1.f;
          if (n < N) out.store_swiglu(t, n0 / 2 + j, sum_of(t, n) * r, sum_of(t, n + 8) * r);
        } else {
          if (n < N) out.store_swiglu(t, n0 / 2 + j, sum_of(t, n), sum_of(t, n + 8));
        }
      }
      finish();
      return;
    }
    if (Norm && out.norm.x) {  // the producer of a GemvNorm (N % 4 == 0: out_parts)
      // A warp a token: the loop's bound is a multiple of 32, so whole warps take each turn.
      for (int i = threadIdx.x; i < T * kTileRows / 4; i += blockDim.x) {
        const int t = i / (kTileRows / 4), n = n0 + 4 * (i % (kTileRows / 4));
        float sq = 0.f;
        uint2 hv = make_uint2(0, 0);
        if (n < N) {  // x and the norm weights asked for before the partials: one round trip
          const int64_t at = int64_t(t) * N + n;
          const uint2 xv = *reinterpret_cast<const uint2*>(out.norm.x + at);
          const float4 w = *reinterpret_cast<const float4*>(out.norm.w + n);
          sq = norm_rows(out, at, xv, w,
                         sum_splits<batch>(reinterpret_cast<const float4*>(partial + at), split_stride / 4, splits),
                         hv);
        }
        sq = warp_sum(sq);
        if (lane == 0) out.norm.ss[blockIdx.x * T + t] = sq;
        if (out.norm.q8) norm_rows_int8(out.norm, hv, t, n, N, lane);
        if (out.f16 && n < N)
          *reinterpret_cast<uint2*>(out.f16 + int64_t(t) * N + n) =
              make_uint2(bf16x2_to_f16x2_16th(hv.x), bf16x2_to_f16x2_16th(hv.y));
      }
      finish();
      return;
    }
    if (N % 4 == 0) {
      for (int i = threadIdx.x; i < T * kTileRows / 4; i += blockDim.x) {
        const int t = i / (kTileRows / 4), n = n0 + 4 * (i % (kTileRows / 4));
        if (Norm && out.scales()) {  // the whole warp, before any lane leaves the turn
          const float part = out.row_part(t, T);  // asked for with the partials: one round trip
          float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
          if (n < N)
            v = sum_splits<batch>(reinterpret_cast<const float4*>(partial + int64_t(t) * N + n), split_stride / 4,
                                  splits);
          const float r = out.row_factor(part);
          if (n >= N) continue;
          out.store(t, n, v.x * r);
          out.store(t, n + 1, v.y * r);
          out.store(t, n + 2, v.z * r);
          out.store(t, n + 3, v.w * r);
          continue;
        }
        if (n >= N) continue;  // rows n .. n + 3 are all in or all out
        const float4 v = sum_splits<batch>(reinterpret_cast<const float4*>(partial + int64_t(t) * N + n),
                                           split_stride / 4, splits);
        out.store(t, n, v.x);
        out.store(t, n + 1, v.y);
        out.store(t, n + 2, v.z);
        out.store(t, n + 3, v.w);
      }
      finish();
      return;
    }
  }
  for (int i = threadIdx.x; i < T * kTileRows; i += blockDim.x) {
    const int t = i / kTileRows, n = n0 + i % kTileRows;
    if constexpr (Norm) {
      const float r = out.scales() ? out.row_scale(t, T) : 1.f;
      if (n < N) out.store(t, n, sum_of(t, n) * r);
    } else {
      if (n < N) out.store(t, n, sum_of(t, n));
    }
  }
  finish();
}

// Chunks [c_begin, c_end) of this block's split.
__device__ __forceinline__ void split_range(int K, int& c_begin, int& c_end) {
  const int n_chunks = K / kChunk;
  c_begin = static_cast<int>(int64_t(blockIdx.y) * n_chunks / gridDim.y);
  c_end = static_cast<int>(int64_t(blockIdx.y + 1) * n_chunks / gridDim.y);
}

// Register main loop: U chunks are loaded (all in flight) before any is used. (Loading the next U
// while using these, a software pipeline in registers, measured 15% slower on the H200: more
// registers, fewer warps. Loading the first U before pdl_wait, out of the loop, coincided with
// the int8 lm_head going from 372 to 554 us and the W4A16 step sum from 7.42 to 7.74 ms, and was
// taken back.) With U 8 registers are capped so that 3 blocks fit on an SM (80, no spills).
// partial f32 [gridDim.y, T, N] and counters i32 [gridDim.x] (zero between launches) are used
// only when gridDim.y > 1.
template <class Fmt, int NT, int U>
__global__ void __launch_bounds__(kWarps * 32, U > 4 ? 3 : 0)
    qgemv_kernel(Fmt w, const __nv_bfloat16* __restrict__ x, OutParts out, float* __restrict__ partial,
                 int* __restrict__ counters, int T, int N, int K) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rb = blockIdx.x * kWarps + warp;
  pdl_wait();  // x comes from the previous kernel; out and partial may still be read by it
  pdl_trigger();
  int c_begin, c_end;
  split_range(K, c_begin, c_end);
  float acc[NT][4] = {};

  if (rb * 16 < N) {
    for (int c0 = c_begin; c0 < c_end; c0 += U) {
      typename Fmt::Frag f[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c0 + u < c_end) f[u] = w.load(rb, c0 + u, lane, N);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (c0 + u < c_end)
          accumulate_chunk<Fmt, NT>(w, f[u], x, (c0 + u) * kChunk + 16 * (lane % 4), T, K, lane / 4, acc);
    }
  }
  store_results<NT>(acc, out, partial, counters, T, N, rb, lane);
}

// Blocks of the kernel resident on the whole GPU at once (asked once per kernel).
template <class Fmt, int NT, int U>
int resident_blocks() {
  static const int n = [] {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qgemv_kernel<Fmt, NT, U>, kWarps * 32, 0);
    return sm_count() * std::max(per_sm, 1);
  }();
  return n;
}

// K splits: as many as keep every block resident in one wave (so all stream at once), with at
// least 4 chunks per split, and partial traffic (8 bytes per token and row per split) at most a
// quarter of the weight bytes read (ratio 16 S T / K for 4-bit weights). 1 when N alone fills
// the GPU or has more tiles than there are counters.
inline int choose_splits(int resident, int T, int N, int K, int max_tiles) {
  const int tiles = (N + kTileRows - 1) / kTileRows, n_chunks = K / kChunk;
  if (tiles >= resident || tiles > max_tiles) return 1;
  return std::max(1, std::min({resident / tiles, n_chunks / 4, n_chunks / std::max(T, 1)}));
}

template <class Fmt, int NT, int U>
void launch(const Fmt& w, const __nv_bfloat16* x, const OutParts& out, float* partial, int* counters, int splits,
            int T, int N, int K, cudaStream_t s) {
  launch_kernel("qgemv", qgemv_kernel<Fmt, NT, U>, dim3((N + kTileRows - 1) / kTileRows, splits), dim3(kWarps * 32), 0,
                s, w, x, out, partial, counters, T, N, K);
}

}  // namespace ds::cuda::qgemv
