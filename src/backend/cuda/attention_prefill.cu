// Tensor-core flash-attention over the paged KV cache (FlashAttention-2 scheme): a CTA of 8
// warps owns 128 query rows of one sequence, streams their KV head's K/V in tiles of 64 keys
// gathered through the block table into shared memory (cp.async, two stages), computes
// S = Q K^T and O += P V with mma.sync m16n8k16 bf16 (fp32 accumulate) and keeps an fp32 online
// softmax per row. Tiles entirely above the diagonal are never loaded; only tiles that cross it
// are masked. Head dims 64, 128 and 256. Short chunks on long contexts split the keys over
// several CTAs (split-KV) whose partial softmax states attention.cu's combine kernel merges.
// Rows are packed `pack` query heads per token: pack 1 (prefill) gives a CTA consecutive tokens
// of one query head; pack = the GQA group (decode and verify) gives it every query head of one
// KV head for consecutive tokens, so one K/V tile serves them all (GQA packing); warps whose 16
// rows are all past the sequence skip the mma work. Decode and verify chunks of at most 32 packed
// rows take attention_decode_kernel instead (below), which puts all 8 warps on each key tile.
#include <algorithm>
#include <climits>
#include <type_traits>
#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda {

namespace {

constexpr int kBM = 128;              // query rows per CTA
constexpr int kBN = 64;               // keys per K/V tile
constexpr int kWarps = kBM / 16;      // each warp owns 16 query rows
constexpr int kThreads = 32 * kWarps;

// Shared memory (bf16): Q [kBM, HD], K [2][kBN, HD], V [2][kBN, HD]; hd 256: 192 KiB.
template <int HD>
__host__ __device__ constexpr int prefill_smem_bytes() {
  return (kBM + 4 * kBN) * HD * 2;
}

// Element offset of (row, 16-byte chunk) in a [rows, HD] bf16 tile. The chunk index is XORed
// with row % 8 so the 8 rows an ldmatrix phase reads (same logical chunk) hit 8 different
// bank groups.
template <int HD>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * HD + ((chunk ^ (row & 7)) << 3);
}

// Two floats as bf16x2, `lo` in the low half (the lower column of an mma fragment).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Element offset of key j's 16-byte chunk ch in the caches (bf16 [blocks, block_size, nKV, HD]),
// through the sequence's block table.
template <int HD>
__device__ __forceinline__ int64_t cache_offset(const int32_t* table, int block_shift, int nKV, int kvh, int j,
                                                int ch) {
  return (cache_row(table, j, block_shift) * nKV + kvh) * HD + ch * 8;
}

// The step's own keys and values, those from past: where attention_decode_kernel appends them
// itself, key past + i is token seq_start + i of k_new and v_new (bf16 [T, nKV, HD]); with k_new
// null they are in the caches (kv_append wrote them).
struct StepKeys {
  const bf16* k_new = nullptr;
  const bf16* v_new = nullptr;
  int past = 0, seq_start = 0;
};
// Which keys of a tile load_kv_tile asks for: those before the step's own (which the kernels
// before do not write, so they may be asked for before pdl_wait), the others, or all.
enum class KvPart { kCached, kFresh, kAll };

// Keys [kt kBN, (kt + 1) kBN) of KV head kvh into one stage (dk, dv bf16 [kBN, HD], swizzled),
// gathered through the sequence's block table by cp.async, kThreads threads; keys outside [lo, hi)
// are zeros (the callers mask them). Both kernels' K/V tiles; the step's own keys from `step`
// where it has them. Blocks hold 2^block_shift keys (at least 2: CudaOps::alloc_caches): lane e of
// each warp reads the table entry of the tile's e-th block, and each row takes its block's entry
// from that lane, so a tile costs a warp one table load and no division. A load and a division a
// row were, counted from the source, about half the decode kernel's instructions; without them,
// on the H200 (three rounds): C1 at 1k 5.233-5.245 against 5.269-5.284 ms, at 16k 5.53-5.56
// against 5.63-5.67, C8 at 16k 8.67-8.69 against 9.48-9.52, verify 8 at 4k 6.24-6.26 against
// 6.28-6.29; the decode kernel 4.1 against 5.5 us a launch at 1k
// (docs/perf/2026-12-04-s42-cuda-27b.md).
template <int HD>
__device__ __forceinline__ void load_kv_tile(bf16* dk, bf16* dv, const bf16* k_cache, const bf16* v_cache,
                                             const int32_t* table, int block_shift, int nKV, int kvh, int kt, int lo,
                                             int hi, int tid, const StepKeys& step = {}, KvPart part = KvPart::kAll) {
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  static_assert((kBN * CH) % kThreads == 0, "a K/V tile in whole rounds of the CTA");
  static_assert(kBN <= 64, "a tile's blocks of 2 or more keys, one a lane");
  const int first = kt * kBN;
  const int fresh = step.past;  // the first key of kFresh
  if ((part == KvPart::kCached && first >= fresh) || (part == KvPart::kFresh && first + kBN <= fresh)) return;
  const int b0 = first >> block_shift, lane = tid & 31;
  int entry = 0;  // lane e: the table entry of block b0 + e, where it holds a key below hi
  if (lane <= (kBN - 1) >> block_shift && ((b0 + lane) << block_shift) < hi) entry = table[b0 + lane];
#pragma unroll 2  // fully unrolled: 255 registers at hd 256
  for (int i = 0; i < kBN * CH / kThreads; ++i) {
    const int id = tid + i * kThreads, row = id / CH, ch = id % CH;
    const int j = first + row;
    const int block = __shfl_sync(0xffffffffu, entry, row >> block_shift);
    if (part != KvPart::kAll && (j < fresh) != (part == KvPart::kCached)) continue;
    const bool valid = j >= lo && j < hi;
    const bool own = step.k_new != nullptr && j >= step.past;
    const bf16* ks = own ? step.k_new : k_cache;
    const bf16* vs = own ? step.v_new : v_cache;
    int64_t off = 0;
    if (valid) {
      const int64_t key_row = own ? step.seq_start + j - step.past : block_row(block, j, block_shift);
      off = (key_row * nKV + kvh) * HD + ch * 8;
    }
    const int dst = swz<HD>(row, ch);
    cp_async16(smem_u32(dk + dst), ks + off, valid);
    cp_async16(smem_u32(dv + dst), vs + off, valid);
  }
}

// grid (nH / pack, tile bound, n_splits), kThreads threads, prefill_smem_bytes<HD>() dynamic
// shared memory. A sequence of len new tokens has len * pack rows, row r being token r / pack
// and query head blockIdx.x * pack + r % pack. Query tiles of the sequences with min_len < len
// <= max_len are numbered in sequence order; blockIdx.y counts them from the last, so the long
// last tiles of a causal prefill start first. Split blockIdx.z takes its share of the tile's K/V
// tiles; with n_splits > 1 the rows go unnormalised to partial f32 [T, nH, n_splits, HD + 2]
// (accumulator, max, sum; the layout of attention_kernel's partials) instead of out.
template <int HD>
__global__ void __launch_bounds__(kThreads, 1)
    attention_prefill_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k_cache,
                             const bf16* __restrict__ v_cache, bf16* __restrict__ out, float* __restrict__ partial,
                             const int32_t* __restrict__ cu_seqlens, const int32_t* __restrict__ n_past,
                             const int32_t* __restrict__ block_tables, int max_blocks, int n_seqs, int min_len,
                             int max_len, int pack, int nH, int nKV, int block_size, float scale) {
  constexpr int CH = HD / 8;  // 16-byte chunks per row
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [kBM, HD]
  bf16* sK = sQ + kBM * HD;                      // [2][kBN, HD]
  bf16* sV = sK + 2 * kBN * HD;                  // [2][kBN, HD]

  // This CTA's (sequence, tile).
  int tile = gridDim.y - 1 - blockIdx.y;
  int s = 0;
  for (; s < n_seqs; ++s) {
    const int len = cu_seqlens[s + 1] - cu_seqlens[s];
    if (len <= min_len || len > max_len) continue;
    const int n_tiles = (len * pack + kBM - 1) / kBM;
    if (tile < n_tiles) break;
    tile -= n_tiles;
  }
  if (s == n_seqs) return;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h0 = blockIdx.x * pack, kvh = h0 / (nH / nKV);  // first query head of the CTA's rows
  const int seq_start = cu_seqlens[s];
  const int r0 = tile * kBM;                                 // first row's index in the sequence
  const int rows = min(kBM, (cu_seqlens[s + 1] - seq_start) * pack - r0);  // valid query rows
  // (token, head) index t nH + h of row r of the tile: token seq_start + (r0 + r) / pack, head
  // h0 + (r0 + r) % pack.
  auto row_th = [&](int r) { return int64_t(seq_start + (r0 + r) / pack) * nH + h0 + (r0 + r) % pack; };
  const int past = n_past[s];
  const int p_min = past + r0 / pack, p_max = past + (r0 + rows - 1) / pack;  // first and last row's positions
  const int n_keys = p_max + 1;                                // keys any row of the tile sees
  const int n_kv_tiles = (n_keys + kBN - 1) / kBN;
  const int n_splits = gridDim.z, per_split = (n_kv_tiles + n_splits - 1) / n_splits;
  const int kt_begin = min(n_kv_tiles, int(blockIdx.z) * per_split);  // this split's K/V tiles
  const int kt_end = min(n_kv_tiles, kt_begin + per_split);            // (may be none)
  const int32_t* table = block_tables + int64_t(s) * max_blocks;
  const int block_shift = block_shift_of(block_size);
  // K/V tile `kt` into stage `stage` (zeros for keys >= n_keys: they are masked below). The first
  // two tiles' keys before the step's own (which kv_append writes) are asked for before pdl_wait,
  // kv_append letting this launch be placed while attention prep runs.
  const StepKeys step{nullptr, nullptr, past, seq_start};
  auto load_kv = [&](int kt, int stage, KvPart part) {
    load_kv_tile<HD>(sK + stage * kBN * HD, sV + stage * kBN * HD, k_cache, v_cache, table, block_shift, nKV, kvh, kt,
                     0, n_keys, tid, step, part);
  };
  if (kt_begin < kt_end) load_kv(kt_begin, 0, KvPart::kCached);
  if (kt_begin + 1 < kt_end) load_kv(kt_begin + 1, 1, KvPart::kCached);
  pdl_wait();  // launch.cuh: the queries and the step's keys and values come from the kernels before
  pdl_trigger();

  // Q rows up to the last warp's with rows (zeros past the sequence's end): at verify 8 (48 rows)
  // all 128 took 0.8 us more a launch (H100, docs/perf/2026-12-06-s70-cuda-27b.md).
  const int q_rows = (rows + 15) / 16 * 16;
#pragma unroll
  for (int i = 0; i < kBM * CH / kThreads; ++i) {
    const int id = tid + i * kThreads, row = id / CH, ch = id % CH;
    if (row >= q_rows) break;
    const bool valid = row < rows;
    const bf16* src = valid ? q + row_th(row) * HD + ch * 8 : q;
    cp_async16(smem_u32(sQ + swz<HD>(row, ch)), src, valid);
  }
  // cp.async group g holds K/V tile kt_begin + g (group 0 also Q); empty groups keep the count
  // uniform.
  if (kt_begin < kt_end) load_kv(kt_begin, 0, KvPart::kFresh);
  cp_async_commit();
  if (kt_begin + 1 < kt_end) load_kv(kt_begin + 1, 1, KvPart::kFresh);
  cp_async_commit();

  // mma fragment coordinates: this thread holds rows g and g + 8 of the warp's 16 rows, and
  // columns 2c, 2c + 1 of every 8-column n-tile.
  const int g = lane >> 2, c = lane & 3;
  const int row_a = warp * 16 + g, row_b = row_a + 8;
  // Causal limits; rows past the sequence's end reuse the last row's (never written).
  const int pos_a = past + (r0 + min(row_a, rows - 1)) / pack;
  const int pos_b = past + (r0 + min(row_b, rows - 1)) / pack;
  const bool has_rows = warp * 16 < rows;  // else this warp only helps load the tiles
  const float scale_log2 = scale * 1.4426950408889634f;  // softmax in base 2

  float o[HD / 8][4];  // O f32 [16, HD] of this warp, as HD/8 n-tiles
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY;  // running row max (scaled, base 2)
  float l_a = 0.f, l_b = 0.f;              // running row sum, this thread's columns only

  // ldmatrix addresses of this lane (see the fragment layouts of mma m16n8k16): lane supplies
  // row lm_row of matrix lane / 8. Chunk 2 k + x (k a 16-dim step, x = lm_hi or lm_q) of a row
  // r with r % 8 == lm_row sits at byte 128 (k / 4) + sw_x[k % 4] of the row (swz), so four
  // per-lane offsets and compile-time constants address every fragment.
  const int lm_row = lane & 7, lm_hi = (lane >> 3) & 1, lm_q = lane >> 4;
  uint32_t sw_hi[4], sw_q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    sw_hi[i] = ((2 * i + lm_hi) ^ lm_row) << 4;
    sw_q[i] = ((2 * i + lm_q) ^ lm_row) << 4;
  }
  // row starts (bytes): Q rows 16 warp + 8 lm_hi + lm_row, K rows 8 lm_q + lm_row, V rows 8 lm_hi + lm_row
  const uint32_t q_row = smem_u32(sQ) + (warp * 16 + lm_hi * 8 + lm_row) * HD * 2;
  const uint32_t k_row = smem_u32(sK) + (lm_q * 8 + lm_row) * HD * 2;
  const uint32_t v_row = smem_u32(sV) + (lm_hi * 8 + lm_row) * HD * 2;

  // One K/V tile (kt, in the stage at k_base / v_base) into this warp's rows.
  auto attend_tile = [&](int kt, uint32_t k_base, uint32_t v_base) {
    // S f32 [16, kBN] = Q_warp . K_tile^T
    float sc[kBN / 8][4];
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t a[4];  // Q rows 8 lm_hi + lm_row of the warp, dims 16 kk + 8 lm_q ..
      ldmatrix_x4(a, q_row + (kk / 4) * 128 + sw_q[kk % 4]);
#pragma unroll
      for (int nb = 0; nb < kBN / 16; ++nb) {
        uint32_t b[4];  // keys 16 nb + 8 lm_q + lm_row, dims 16 kk + 8 lm_hi ..
        ldmatrix_x4(b, k_base + nb * 16 * HD * 2 + (kk / 4) * 128 + sw_hi[kk % 4]);
        mma_bf16(sc[2 * nb], a, b[0], b[1]);
        mma_bf16(sc[2 * nb + 1], a, b[2], b[3]);
      }
    }

    // Online softmax; only tiles reaching past the first row's position need the mask.
    const int kv0 = kt * kBN;
    const bool masked = kv0 + kBN - 1 > p_min;
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = sc[i][e] * scale_log2;
        const int key = kv0 + i * 8 + 2 * c + (e & 1);
        if (masked && key > (e < 2 ? pos_a : pos_b)) v = -INFINITY;
        sc[i][e] = v;
      }
      mx_a = fmaxf(mx_a, fmaxf(sc[i][0], sc[i][1]));
      mx_b = fmaxf(mx_b, fmaxf(sc[i][2], sc[i][3]));
    }
    // the 4 threads of a row (same g) hold its 64 columns
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    // A row with no visible key so far keeps max -inf; subtract 0 then (all its p are 0).
    const float base_a = mn_a == -INFINITY ? 0.f : mn_a;
    const float base_b = mn_b == -INFINITY ? 0.f : mn_b;
    const float corr_a = exp2f(m_a - base_a), corr_b = exp2f(m_b - base_b);
    m_a = mn_a;
    m_b = mn_b;
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i) {
      sc[i][0] = exp2f(sc[i][0] - base_a);
      sc[i][1] = exp2f(sc[i][1] - base_a);
      sc[i][2] = exp2f(sc[i][2] - base_b);
      sc[i][3] = exp2f(sc[i][3] - base_b);
      sum_a += sc[i][0] + sc[i][1];
      sum_b += sc[i][2] + sc[i][3];
    }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
#pragma unroll
    for (int i = 0; i < HD / 8; ++i) {
      o[i][0] *= corr_a;
      o[i][1] *= corr_a;
      o[i][2] *= corr_b;
      o[i][3] *= corr_b;
    }

    // O f32 [16, HD] += P bf16 [16, kBN] . V_tile bf16 [kBN, HD]; the S accumulators of
    // n-tiles 2 kk and 2 kk + 1 are exactly the A fragment of keys 16 kk ..
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16x2(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16x2(sc[2 * kk][2], sc[2 * kk][3]),
                             pack_bf16x2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                             pack_bf16x2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int db = 0; db < HD / 16; ++db) {
        uint32_t b[4];  // keys 16 kk + 8 lm_hi + lm_row, dims 16 db + 8 lm_q .. (transposed)
        ldmatrix_x4_trans(b, v_base + kk * 16 * HD * 2 + (db / 4) * 128 + sw_q[db % 4]);
        mma_bf16(o[2 * db], a, b[0], b[1]);
        mma_bf16(o[2 * db + 1], a, b[2], b[3]);
      }
    }
  };

  for (int kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<1>();  // tile kt (and Q) landed for this thread ...
    __syncthreads();     // ... and for every thread
    const int stage = (kt - kt_begin) & 1;
    if (has_rows) attend_tile(kt, k_row + stage * kBN * HD * 2, v_row + stage * kBN * HD * 2);
    __syncthreads();  // every warp is done with this stage before it is refilled
    if (kt + 2 < kt_end) load_kv(kt + 2, stage, KvPart::kAll);
    cp_async_commit();
  }
  cp_async_wait<0>();

  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  if (n_splits > 1) {
    // Unnormalised rows, max in natural-log units (as attention_kernel writes them), staged in
    // shared memory from its start once the tiles are done (f32 [rows][kStride]: 8 floats of
    // padding put the 16 lanes of a fragment's 8-byte store in distinct banks), then written a row
    // a warp at a time, the lanes on consecutive floats. A split with no visible key for a row
    // leaves max -inf and sum 0, which the combine skips. (Each thread's 8-byte stores of its own
    // fragments, 8 rows an instruction, took 3.7 us of the verify 8 launch's 17 at 4k; staged, the
    // launch took 2.4 us less: H100, docs/perf/2026-12-06-s70-cuda-27b.md.)
    constexpr float kLn2 = 0.6931471805599453f;
    constexpr int kStride = HD + 8;
    static_assert(kBM * kStride * 4 <= prefill_smem_bytes<HD>(), "the rows' O in f32 within the tiles' room");
    float* stage = reinterpret_cast<float*>(smem_raw);
    __syncthreads();  // every thread's copies have landed, every warp is done with the tiles
    if (has_rows) {
      float* sa = stage + row_a * kStride + 2 * c;
      float* sb = stage + row_b * kStride + 2 * c;
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) {
        *reinterpret_cast<float2*>(sa + i * 8) = make_float2(o[i][0], o[i][1]);
        *reinterpret_cast<float2*>(sb + i * 8) = make_float2(o[i][2], o[i][3]);
      }
      if (c == 0) {
        *reinterpret_cast<float2*>(stage + row_a * kStride + HD) = make_float2(m_a * kLn2, l_a);
        *reinterpret_cast<float2*>(stage + row_b * kStride + HD) = make_float2(m_b * kLn2, l_b);
      }
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps) {
      float* dst = partial + (row_th(r) * n_splits + blockIdx.z) * (HD + 2);
      const float* src = stage + r * kStride;
#pragma unroll
      for (int k = 0; k < HD / 64; ++k) {
        const int at = 2 * lane + 64 * k;
        *reinterpret_cast<float2*>(dst + at) = *reinterpret_cast<const float2*>(src + at);
      }
      if (lane == 0) *reinterpret_cast<float2*>(dst + HD) = *reinterpret_cast<const float2*>(src + HD);
    }
    return;
  }
  // Normalise, stage the warp's O rows in its own Q rows (no other warp reads them), then
  // write them out as 16-byte rows.
  const float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) {
    *reinterpret_cast<uint32_t*>(sQ + swz<HD>(row_a, i) + 2 * c) = pack_bf16x2(o[i][0] * inv_a, o[i][1] * inv_a);
    *reinterpret_cast<uint32_t*>(sQ + swz<HD>(row_b, i) + 2 * c) = pack_bf16x2(o[i][2] * inv_b, o[i][3] * inv_b);
  }
  __syncwarp();
#pragma unroll
  for (int i = 0; i < 16 * CH / 32; ++i) {
    const int id = lane + 32 * i, r = warp * 16 + id / CH, ch = id % CH;
    if (r < rows)
      *reinterpret_cast<uint4*>(out + row_th(r) * HD + ch * 8) =
          *reinterpret_cast<const uint4*>(sQ + swz<HD>(r, ch));
  }
}

// ---- Decode and verify chunks: at most kDecMaxRows packed rows a sequence, all 8 warps on them.
// A CTA takes one sequence's rows (MT m-tiles of 16: its new tokens times the GQA group) for one KV
// head and its split of the keys. Per 64-key tile, warp w computes the scores of keys [8w, 8w + 8)
// for every row, the row maxima and sums meet in shared memory, every warp then holds the same
// running max and sum, and warp w accumulates O's head dims [w HD / 8, (w + 1) HD / 8) from the
// whole tile's P (bf16, in shared memory). So no warp's O is merged with another's, and the tile's
// mma work is spread over the 8 warps instead of falling on the one warp that owns 16 rows in
// attention_prefill_kernel (1.5 us a 64-key tile at one token on the H200).
constexpr int kDecMaxRows = 32;
constexpr int kDecWarps = 8;
constexpr int kDecThreads = 32 * kDecWarps;
constexpr int kDecBN = kBN;  // keys per K/V tile (load_kv_tile's): one 8-key n-tile a warp
static_assert(kDecThreads == kThreads, "attention_decode_kernel loads its tiles with load_kv_tile");

// Shared memory: Q bf16 [MT 16, HD], K and V bf16 [2][kDecBN, HD], P bf16 [MT 16, kDecBN], the
// warps' row maxima and sums f32 [2][kDecWarps][MT 16]. hd 256, MT 1: 139 KiB.
template <int HD, int MT>
constexpr int decode_smem_bytes() {
  return (MT * 16 + 4 * kDecBN) * HD * 2 + MT * 16 * kDecBN * 2 + 2 * kDecWarps * MT * 16 * 4;
}

// grid (nKV, n_seqs, n_splits), kDecThreads threads, decode_smem_bytes<HD, MT>() dynamic shared
// memory; rows, partial and out as attention_prefill_kernel's with pack = nH / nKV (blockIdx.y
// counts the sequences with min_len < len <= max_len; each has at most MT 16 rows).
// Split z takes the key tiles [z m / n_splits, (z + 1) m / n_splits) of the m that hold the keys
// its last row sees; a split without a tile (more splits than tiles) writes an empty partial.
// Whole tiles, so that no split runs its tile loop once more for a range that straddles a tile
// edge. Ranges of keys did: at 1k the slowest of 128 CTAs ended 2 us after the average, in
// %globaltimer stamps. Whole tiles took C1 at 1k to 5.215-5.218 from 5.236-5.256 ms, verify 4 at
// 4k to 5.68-5.75 from 5.72-5.78, and C1 at 16k to 5.60-5.63 from 5.62-5.64 on the H200
// (docs/perf/2026-12-04-s40-cuda-27b.md).
// k_new, v_new: null (the step's keys and values are in the caches already: launch_kv_append), or
// the step's, bf16 [T, nKV, HD], which the kernel reads from there and appends to the caches
// itself (split 0). Either way the keys before the step's own are asked for before pdl_wait,
// while the kernel before (attention prep, or kv_append, which triggers first) still runs.
template <int HD, int MT>
__global__ void __launch_bounds__(kDecThreads, 1)
    attention_decode_kernel(const bf16* __restrict__ q, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                            const bf16* __restrict__ k_new, const bf16* __restrict__ v_new, bf16* __restrict__ out,
                            float* __restrict__ partial, const int32_t* __restrict__ cu_seqlens,
                            const int32_t* __restrict__ n_past, const int32_t* __restrict__ block_tables,
                            int max_blocks, int n_seqs, int min_len, int max_len, int nH, int nKV, int block_size,
                            float scale) {
  constexpr int CH = HD / 8;         // 16-byte chunks per row
  constexpr int NTD = HD / 64;       // 8-dim n-tiles of O a warp
  constexpr int R = MT * 16;         // rows of the CTA
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // [R, HD]
  bf16* sK = sQ + R * HD;                        // [2][kDecBN, HD]
  bf16* sV = sK + 2 * kDecBN * HD;               // [2][kDecBN, HD]
  bf16* sP = sV + 2 * kDecBN * HD;               // [R, kDecBN], 16-byte chunks swizzled by row % 8
  float* red_max = reinterpret_cast<float*>(sP + R * kDecBN);  // [kDecWarps][R]
  float* red_sum = red_max + kDecWarps * R;                    // [kDecWarps][R]

  int s = 0;
  for (int tile = blockIdx.y; s < n_seqs; ++s) {  // the blockIdx.y-th sequence in range
    const int len = cu_seqlens[s + 1] - cu_seqlens[s];
    if (len <= min_len || len > max_len) continue;
    if (tile-- == 0) break;
  }
  if (s == n_seqs) return;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int pack = nH / nKV, kvh = blockIdx.x, h0 = kvh * pack;
  const int seq_start = cu_seqlens[s];
  const int rows = (cu_seqlens[s + 1] - seq_start) * pack;  // valid rows, <= R
  auto row_th = [&](int r) { return int64_t(seq_start + r / pack) * nH + h0 + r % pack; };
  const int past = n_past[s];
  const int n_keys = past + (rows - 1) / pack + 1;  // keys the last row sees
  // This split's K/V tiles [kt_begin, kt_end) (may be none), its keys [k_begin, k_end).
  const int n_splits = gridDim.z, n_tiles = (n_keys + kDecBN - 1) / kDecBN;
  const int kt_begin = static_cast<int>(int64_t(blockIdx.z) * n_tiles / n_splits);
  const int kt_end = static_cast<int>(int64_t(blockIdx.z + 1) * n_tiles / n_splits);
  const int k_begin = kt_begin * kDecBN, k_end = min(n_keys, kt_end * kDecBN);
  const int32_t* table = block_tables + int64_t(s) * max_blocks;
  const int block_shift = block_shift_of(block_size);
  // The step's keys from k_new where the kernel appends them; the first two tiles' cached keys are
  // asked for before pdl_wait.
  const StepKeys step{k_new, v_new, past, seq_start};
  auto load_kv = [&](int kt, int stage, KvPart part) {
    load_kv_tile<HD>(sK + stage * kDecBN * HD, sV + stage * kDecBN * HD, k_cache, v_cache, table, block_shift, nKV,
                     kvh, kt, k_begin, k_end, tid, step, part);
  };
  // cp.async group 0 holds Q and the first tile (and the second's cached keys), group 1 the
  // second tile, group g > 1 tile kt_begin + g.
  if (kt_begin < kt_end) load_kv(kt_begin, 0, KvPart::kCached);
  if (kt_begin + 1 < kt_end) load_kv(kt_begin + 1, 1, KvPart::kCached);
  pdl_wait();  // launch.cuh: the queries and the step's keys and values come from the kernels before
  pdl_trigger();

#pragma unroll
  for (int i = 0; i < (R * CH + kDecThreads - 1) / kDecThreads; ++i) {
    const int id = tid + i * kDecThreads, row = id / CH, ch = id % CH;
    if (row < R) {
      const bool valid = row < rows;
      cp_async16(smem_u32(sQ + swz<HD>(row, ch)), valid ? q + row_th(row) * HD + ch * 8 : q, valid);
    }
  }
  if (kt_begin < kt_end) load_kv(kt_begin, 0, KvPart::kFresh);
  cp_async_commit();
  if (kt_begin + 1 < kt_end) load_kv(kt_begin + 1, 1, KvPart::kFresh);
  cp_async_commit();
  // The step's keys and values into the caches (split 0 of each sequence and KV head), for the
  // steps after: this launch reads them from k_new and v_new.
  if (k_new != nullptr && blockIdx.z == 0)
    for (int i = tid; i < rows / pack * CH; i += kDecThreads) {
      const int t = i / CH, ch = i % CH;
      const int64_t from = (int64_t(seq_start + t) * nKV + kvh) * HD + ch * 8,
                    to = cache_offset<HD>(table, block_shift, nKV, kvh, past + t, ch);
      *reinterpret_cast<uint4*>(k_cache + to) = *reinterpret_cast<const uint4*>(k_new + from);
      *reinterpret_cast<uint4*>(v_cache + to) = *reinterpret_cast<const uint4*>(v_new + from);
    }

  const int g = lane >> 2, c = lane & 3;
  const int lm_row = lane & 7, lm_hi = (lane >> 3) & 1, lm_q = lane >> 4;
  // Causal limit of rows g and g + 8 of each m-tile (rows past the end reuse the last row's).
  int pos[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) pos[mt][h] = past + min(mt * 16 + g + 8 * h, rows - 1) / pack;
  const float scale_log2 = scale * 1.4426950408889634f;

  // Q fragments: rows 16 mt + 8 lm_hi + lm_row, chunk 2 kk + lm_q (as attention_prefill_kernel).
  uint32_t sw_q[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) sw_q[i] = ((2 * i + lm_q) ^ lm_row) << 4;
  const uint32_t q_row = smem_u32(sQ) + (lm_hi * 8 + lm_row) * HD * 2;
  // K fragments of two 16-dim steps at once: key 8 warp + lm_row, chunk 2 (kk + lm_q) + lm_hi.
  uint32_t sw_k[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) sw_k[i] = ((2 * (2 * i + lm_q) + lm_hi) ^ lm_row) << 4;
  const uint32_t k_row = smem_u32(sK) + (warp * 8 + lm_row) * HD * 2;
  // V fragments (transposed) of two 16-key steps at once: key 8 (lane / 8) + lm_row, this warp's
  // chunk NTD warp + j.
  const uint32_t v_row = smem_u32(sV) + (8 * (lane >> 3) + lm_row) * HD * 2;
  // P fragments: row 16 mt + 8 lm_hi + lm_row, chunk 2 kk + lm_q of a 64-key row (8 chunks).
  const uint32_t p_row = smem_u32(sP) + (lm_hi * 8 + lm_row) * kDecBN * 2;

  float o[MT][NTD][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NTD; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
  float m[MT][2], l[MT][2];  // running max (scaled, base 2) and sum of rows g, g + 8: the same in every warp
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  // The Q fragments stay in registers (64 an m-tile at hd 256: 248 registers at 2 m-tiles, no
  // spill) from the first tile on. At 2 m-tiles, against reading them from shared memory each tile,
  // on the H200 (three rounds): verify 3 at 4k 5.631-5.671 against 5.662-5.695 ms, verify 4
  // 5.698-5.705 against 5.708-5.729, the kernel 10.98 against 11.38 us a launch at verify 4
  // (docs/perf/2026-12-04-s42-cuda-27b.md).
  uint32_t qf[MT][HD / 16][4];
  for (int kt = kt_begin; kt < kt_end; ++kt) {
    cp_async_wait<1>();  // tile kt (and Q) landed for this thread ...
    __syncthreads();     // ... and for every thread; the last tile's P and sums are read
    if (kt == kt_begin)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)
          ldmatrix_x4(qf[mt][kk], q_row + mt * 16 * HD * 2 + (kk / 4) * 128 + sw_q[kk % 4]);
    const int stage = (kt - kt_begin) & 1;
    const uint32_t k_base = k_row + stage * kDecBN * HD * 2, v_base = v_row + stage * kDecBN * HD * 2;
    // S f32 [R, 8] of this warp's keys: two accumulators per m-tile halve the mma chain.
    float sc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) sc[mt][h][0] = sc[mt][h][1] = sc[mt][h][2] = sc[mt][h][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk += 2) {
      uint32_t b[4];  // dims 16 kk .. 16 kk + 31 of the warp's 8 keys
      ldmatrix_x4(b, k_base + (kk / 4) * 128 + sw_k[(kk % 4) / 2]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(sc[mt][0], qf[mt][kk], b[0], b[1]);
        mma_bf16(sc[mt][1], qf[mt][kk + 1], b[2], b[3]);
      }
    }
    const int kv0 = kt * kDecBN;
    // Keys outside the split, and past a row's position (the first row's is past), are masked.
    const bool masked = kv0 < k_begin || kv0 + kDecBN > k_end || kv0 + kDecBN - 1 > past;
    float mx[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = (sc[mt][0][e] + sc[mt][1][e]) * scale_log2;
        const int key = kv0 + warp * 8 + 2 * c + (e & 1);
        if (masked && (key < k_begin || key >= k_end || key > pos[mt][e >> 1])) v = -INFINITY;
        sc[mt][0][e] = v;
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float x = fmaxf(sc[mt][0][2 * h], sc[mt][0][2 * h + 1]);
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
        mx[mt][h] = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
        if (c == 0) red_max[warp * R + mt * 16 + g + 8 * h] = mx[mt][h];
      }
    }
    __syncthreads();
    float corr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mt * 16 + g + 8 * h;
        float mn = m[mt][h];
#pragma unroll
        for (int w = 0; w < kDecWarps; ++w) mn = fmaxf(mn, red_max[w * R + r]);
        const float base = mn == -INFINITY ? 0.f : mn;  // no visible key yet: every p is 0
        corr[mt][h] = exp2f(m[mt][h] - base);
        m[mt][h] = mn;
        const float p0 = exp2f(sc[mt][0][2 * h] - base), p1 = exp2f(sc[mt][0][2 * h + 1] - base);
        float sum = p0 + p1;
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (c == 0) red_sum[warp * R + r] = sum;
        // P row r, keys 8 warp + 2c, 2c + 1: chunk `warp` of the row, swizzled by r % 8.
        *reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(sP) + r * kDecBN * 2 + ((warp ^ (r & 7)) << 4) + 4 * c) =
            pack_bf16x2(p0, p1);
      }
    __syncthreads();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = mt * 16 + g + 8 * h;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kDecWarps; ++w) sum += red_sum[w * R + r];
        l[mt][h] = l[mt][h] * corr[mt][h] + sum;
#pragma unroll
        for (int j = 0; j < NTD; ++j) {
          o[mt][j][2 * h] *= corr[mt][h];
          o[mt][j][2 * h + 1] *= corr[mt][h];
        }
      }
    // O f32 [R, this warp's dims] += P bf16 [R, 64] . V_tile bf16 [64, this warp's dims]
#pragma unroll
    for (int kk = 0; kk < kDecBN / 16; kk += 2) {
#pragma unroll
      for (int j = 0; j < NTD; ++j) {
        const int chunk = NTD * warp + j;
        uint32_t b[4];  // keys 16 kk .. 16 kk + 31, dims 8 chunk ..
        ldmatrix_x4_trans(b, v_base + kk * 16 * HD * 2 + (((chunk & ~7) | ((chunk & 7) ^ lm_row)) << 4));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t a0[4], a1[4];
          const uint32_t pr = p_row + mt * 16 * kDecBN * 2;
          ldmatrix_x4(a0, pr + (((2 * kk + lm_q) ^ lm_row) << 4));
          ldmatrix_x4(a1, pr + (((2 * kk + 2 + lm_q) ^ lm_row) << 4));
          mma_bf16(o[mt][j], a0, b[0], b[1]);
          mma_bf16(o[mt][j], a1, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage and with P before they are refilled
    if (kt + 2 < kt_end) load_kv(kt + 2, stage, KvPart::kAll);
    cp_async_commit();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + g + 8 * h;
      if (r >= rows) continue;
      const int d0 = 8 * NTD * warp + 2 * c;
      if (n_splits > 1) {
        // Unnormalised, max in natural-log units: the combine kernel's partial layout. A split with
        // no visible key for a row leaves max -inf and sum 0, which the combine skips.
        float* dst = partial + (row_th(r) * n_splits + blockIdx.z) * (HD + 2);
#pragma unroll
        for (int j = 0; j < NTD; ++j)
          *reinterpret_cast<float2*>(dst + d0 + 8 * j) = make_float2(o[mt][j][2 * h], o[mt][j][2 * h + 1]);
        if (warp == 0 && c == 0) {
          dst[HD] = m[mt][h] * 0.6931471805599453f;
          dst[HD + 1] = l[mt][h];
        }
      } else {
        const float inv = 1.f / l[mt][h];
        bf16* dst = out + row_th(r) * HD;
#pragma unroll
        for (int j = 0; j < NTD; ++j)
          *reinterpret_cast<uint32_t*>(dst + d0 + 8 * j) = pack_bf16x2(o[mt][j][2 * h] * inv, o[mt][j][2 * h + 1] * inv);
      }
    }
}

template <int HD>
void launch_prefill(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, float* partial, int n_splits,
                    const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* block_tables, int max_blocks,
                    int T, int n_seqs, int min_len, int max_len, int pack, int nH, int nKV, int block_size,
                    float scale, cudaStream_t s) {
  constexpr int smem = prefill_smem_bytes<HD>();
  static const bool configured = [] {  // once per head dim: more than the default 48 KiB
    CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  // Every sequence of len tokens has ceil(len pack / kBM) <= len pack / kBM + 1 tiles.
  const dim3 grid(nH / pack, (T * pack + kBM - 1) / kBM + n_seqs, n_splits);
  launch_kernel("attention_prefill", attention_prefill_kernel<HD>, grid, kThreads, smem, s, q, k_cache, v_cache, out,
                partial, cu_seqlens, n_past, block_tables, max_blocks, n_seqs, min_len, max_len, pack, nH, nKV,
                block_size, scale);
}

template <int HD, int MT>
void launch_decode(const bf16* q, bf16* k_cache, bf16* v_cache, const bf16* k_new, const bf16* v_new, bf16* out,
                   float* partial, int n_splits, const int32_t* cu_seqlens, const int32_t* n_past,
                   const int32_t* block_tables, int max_blocks, int n_seqs, int min_len, int max_len, int nH, int nKV,
                   int block_size, float scale, cudaStream_t s) {
  constexpr int smem = decode_smem_bytes<HD, MT>();
  static const bool configured = [] {  // once per instantiation: more than the default 48 KiB
    CUDA_CHECK(
        cudaFuncSetAttribute(attention_decode_kernel<HD, MT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  const dim3 grid(nKV, n_seqs, n_splits);
  launch_kernel("attention_decode", attention_decode_kernel<HD, MT>, grid, kDecThreads, smem, s, q, k_cache, v_cache,
                k_new, v_new, out, partial, cu_seqlens, n_past, block_tables, max_blocks, n_seqs, min_len, max_len,
                nH, nKV, block_size, scale);
}

}  // namespace

bool attention_prefill_supported(int hd) { return hd == 64 || hd == 128 || hd == 256; }

bool attention_decode_takes(int max_len, int pack) {
  return int64_t(max_len) * pack <= kDecMaxRows && attention_decode_warps();
}

int attention_prefill_splits(int n_seqs, int T, int nH, int hd, int max_ctx, int pack, int min_split_keys,
                             int waves, size_t partial_budget_bytes) {
  const int n_sms = sm_count();
  const int ctas = std::max({1, n_seqs, (T * pack + kBM - 1) / kBM}) * (nH / pack);
  int n = std::min(waves == 1 ? n_sms / ctas : (waves * n_sms + ctas - 1) / ctas, max_ctx / min_split_keys);
  const size_t per_split = size_t(T) * nH * (hd + 2) * sizeof(float);
  if (n > 1 && size_t(n) * per_split > partial_budget_bytes) n = static_cast<int>(partial_budget_bytes / per_split);
  return std::max(n, 1);
}

void launch_attention_prefill(const bf16* q, bf16* k_cache, bf16* v_cache, const bf16* k_new, const bf16* v_new,
                              bf16* out, float* partial, int n_splits, const int32_t* seq_of_token,
                              const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* block_tables,
                              int max_blocks, int T, int n_seqs, int min_len, int max_len, int pack, int nH, int nKV,
                              int hd, int block_size, float scale, cudaStream_t s, AttnGate gate) {
  if (T == 0) return;
  DS_ASSERT(attention_prefill_supported(hd), "attention_prefill: head_dim %d unsupported", hd);
  DS_ASSERT(nKV > 0 && nH % nKV == 0, "attention_prefill: %d query heads over %d kv heads", nH, nKV);
  DS_ASSERT(pack == 1 || pack == nH / nKV, "attention_prefill: pack %d (1 or the group, %d)", pack, nH / nKV);
  DS_ASSERT(n_splits == 1 || partial != nullptr, "split attention_prefill needs partial buffers");
  // attention_decode_kernel for sequences of at most 32 packed rows (one m-tile up to 16), else
  // the flash kernel.
  const bool decode = pack == nH / nKV && attention_decode_takes(max_len, pack);
  DS_ASSERT((k_new == nullptr) == (v_new == nullptr), "attention_prefill: the step's keys without its values");
  DS_ASSERT(k_new == nullptr || (decode && min_len == 0),
            "attention_prefill: the step's keys are appended by attention_decode_kernel only, for every sequence");
  auto go = [&](auto head_dim) {
    constexpr int HD = decltype(head_dim)::value;
    if (!decode)
      launch_prefill<HD>(q, k_cache, v_cache, out, partial, n_splits, cu_seqlens, n_past, block_tables, max_blocks, T,
                         n_seqs, min_len, max_len, pack, nH, nKV, block_size, scale, s);
    else if (max_len * pack <= 16)
      launch_decode<HD, 1>(q, k_cache, v_cache, k_new, v_new, out, partial, n_splits, cu_seqlens, n_past, block_tables,
                           max_blocks, n_seqs, min_len, max_len, nH, nKV, block_size, scale, s);
    else
      launch_decode<HD, 2>(q, k_cache, v_cache, k_new, v_new, out, partial, n_splits, cu_seqlens, n_past, block_tables,
                           max_blocks, n_seqs, min_len, max_len, nH, nKV, block_size, scale, s);
  };
  if (hd == 64) go(std::integral_constant<int, 64>{});
  else if (hd == 128) go(std::integral_constant<int, 128>{});
  else go(std::integral_constant<int, 256>{});
  DS_ASSERT(n_splits > 1 || (!gate.gate && !gate.half), "attention_prefill: a gate needs split partials to merge");
  if (n_splits > 1)
    launch_attention_combine(partial, out, seq_of_token, cu_seqlens, 0, T, min_len, max_len, nH, hd, n_splits, s,
                             gate);
}

}  // namespace ds::cuda
