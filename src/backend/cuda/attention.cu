// Paged KV append and causal GQA attention over the paged cache: one CTA per (key split, KV
// head, group of 8 query rows) with an online softmax over K/V tiles in shared memory (two
// buffers: cp.async loads the next tile while this one is used), so one tile load serves every
// query head of the KV group and every token of a verify block (GQA packing); splits of a long
// context run in parallel and are merged by a combine kernel (split-KV). Correct for any step
// shape (head_dim <= 256, a multiple of 8); steps with long chunks give those sequences to the
// tensor-core kernel of attention_prefill.cu.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/ptx.cuh"

namespace ds::cuda {

namespace {

constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// grid T, block (nKV * hd) threads or fewer with striding
__global__ void kv_append_kernel(const bf16* k, const bf16* v, bf16* k_cache, bf16* v_cache,
                                 const int32_t* seq_of_token, const int32_t* cu_seqlens, const int32_t* n_past,
                                 const int32_t* block_tables, int max_blocks, int width, int block_size, bool vec) {
  // The attention launch after it may be placed at once, so that it asks for its cached keys
  // while attention prep runs (it waits for this kernel, and so for prep, before it reads what
  // either writes).
  // Against the trigger after pdl_wait and the flash kernel's keys asked for after its own: verify
  // 8 at 4k 6.952-7.000 against 6.970-7.005 ms (4 rounds of 5 faster), the flash launch 12.9
  // against 14.4 us a launch in place (H100, docs/perf/2026-12-06-s70-cuda-27b.md).
  pdl_trigger();
  // The cache row first: the step plan and the block tables are written before the step, so their
  // three dependent loads run while the previous kernel ends (after pdl_wait they took the kernel
  // to 2.8 us a launch in place at one token, against 1.7 now on the H200: docs/perf/
  // 2026-12-01-s16-cuda-27b.md).
  const int t = blockIdx.x;
  const int s = seq_of_token[t];
  const int64_t row =
      cache_row(block_tables + s * max_blocks, n_past[s] + (t - cu_seqlens[s]), block_shift_of(block_size));
  pdl_wait();  // launch.cuh
  // vec: 16 bytes a thread, the keys' and values' loads all issued at once. (Element by element,
  // a thread's loads waited on its stores before them, which may alias: 8 round trips to L2 at
  // the 27B's width, 1.87 against 0.95 us a launch in place at C1 on the H200, docs/perf/
  // 2026-12-03-s30-cuda-27b.md.)
  if (vec) {
    const int n = width / 8;
    for (int i = threadIdx.x; i < 2 * n; i += blockDim.x) {
      const bool is_v = i >= n;
      const int c = is_v ? i - n : i;
      const uint4 x = reinterpret_cast<const uint4*>((is_v ? v : k) + int64_t(t) * width)[c];
      reinterpret_cast<uint4*>((is_v ? v_cache : k_cache) + row * width)[c] = x;
    }
    return;
  }
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    k_cache[row * width + i] = k[int64_t(t) * width + i];
    v_cache[row * width + i] = v[int64_t(t) * width + i];
  }
}

constexpr int kRowsPerWarp = 2;                    // query rows (token, head of the group) per warp
constexpr int kWarps = 4;
constexpr int kRowsPerCta = kRowsPerWarp * kWarps;  // 8
constexpr int kTileKeys = 32;                       // keys per shared-memory tile: lane = key
constexpr int kPad = 8;                             // bf16 padding per smem row (bank spread)
using KvTile = bf16[kTileKeys][kMaxHeadDim + kPad];  // keys of one K or V tile in shared memory
constexpr int kAttnSmemBytes = 4 * sizeof(KvTile) + kRowsPerCta * kMaxHeadDim * sizeof(float);  // 74 KiB

// One CTA per (key split, KV head, sequence x row group): the group's query rows (token-major,
// then the nH/nKV heads sharing the KV head) share every K/V tile loaded into shared memory,
// so a tile's bytes serve all heads of the group and all tokens of a verify block (GQA
// packing). Per tile, lane = key for the scores, lane = 8 head dims for P.V. With
// n_splits == 1 the normalised output is written; otherwise the split's unnormalised
// accumulator and (max, sum) go to `partial` f32 [t_end - t_begin, nH, n_splits, hd + 2]
// (rows from t_begin). Sequences with more than max_chunk new tokens are left to the prefill
// kernel.
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(
    const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, float* partial, const int32_t* cu_seqlens,
    const int32_t* n_past, const int32_t* block_tables, int max_blocks, int nH, int nKV, int hd, int block_size,
    float scale, int n_splits, int split_len, int row_groups, int t_begin, int max_chunk) {
  pdl_wait();  // launch.cuh
  pdl_trigger();
  // Dynamic shared memory (kAttnSmemBytes): K and V tiles, two of each, then the query rows.
  extern __shared__ __align__(16) unsigned char attn_smem[];
  KvTile* ks = reinterpret_cast<KvTile*>(attn_smem);  // [2]
  KvTile* vs = ks + 2;                                 // [2]
  auto qs = reinterpret_cast<float (*)[kMaxHeadDim]>(vs + 2);  // [kRowsPerCta][kMaxHeadDim]
  const int split = blockIdx.x, kvh = blockIdx.y;
  const int s = blockIdx.z / row_groups, rg = blockIdx.z % row_groups;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = nH / nKV;
  const int t0 = cu_seqlens[s], n_tok = cu_seqlens[s + 1] - t0;
  const int row0 = rg * kRowsPerCta;
  if (row0 >= n_tok * G || n_tok > max_chunk) return;  // longer sequences: the prefill kernel
  const int past = n_past[s];
  const int last_row = min(row0 + kRowsPerCta, n_tok * G) - 1;
  const int j0 = split * split_len;
  const int j_end = min(j0 + split_len, past + last_row / G + 1);  // keys any row of the CTA needs

  // Query rows, pre-scaled, fp32 in shared memory (rows past the sequence are zeros).
  for (int i = threadIdx.x; i < kRowsPerCta * hd; i += blockDim.x) {
    const int r = i / hd, d = i % hd, row = row0 + r;
    float v = 0.f;
    if (row < n_tok * G) v = to_f32(q[(int64_t(t0 + row / G) * nH + kvh * G + row % G) * hd + d]) * scale;
    qs[r][d] = v;
  }
  int n_ctx[kRowsPerWarp];  // keys row r attends to: 0 .. own position
  bool valid[kRowsPerWarp];
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][8];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int row = row0 + warp * kRowsPerWarp + r;
    valid[r] = row < n_tok * G;
    n_ctx[r] = valid[r] ? past + row / G + 1 : 0;
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r][e] = 0.f;
  }
  const int vec_per_row = hd / 8;  // 16-byte vectors per key row
  const int block_shift = block_shift_of(block_size);
  // Tile [tile, tile + kTileKeys) of K and V into buffer b, zeros past j_end (cp.async).
  auto load_tile = [&](int tile, int b) {
    for (int i = threadIdx.x; i < kTileKeys * vec_per_row; i += blockDim.x) {
      const int kk = i / vec_per_row, c = i % vec_per_row, j = tile + kk;
      const bool ok = j < j_end;
      const int64_t base = ok ? (cache_row(block_tables + s * max_blocks, j, block_shift) * nKV + kvh) * hd + c * 8 : 0;
      cp_async16(&ks[b][kk][c * 8], k_cache + base, ok);
      cp_async16(&vs[b][kk][c * 8], v_cache + base, ok);
    }
  };
  // Two buffers: the next tile loads while this one is used.
  if (j0 < j_end) load_tile(j0, 0);
  cp_async_commit();
  int buf = 0;
  for (int tile = j0; tile < j_end; tile += kTileKeys, buf ^= 1) {
    if (tile + kTileKeys < j_end) load_tile(tile + kTileKeys, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of `tile` have landed ...
    __syncthreads();     // ... and every thread's (and qs is written, on the first pass)
    // Scores: lane = key of the tile.
    float sc[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) sc[r] = 0.f;
    for (int c = 0; c < vec_per_row; ++c) {
      const uint4 raw = *reinterpret_cast<const uint4*>(&ks[buf][lane][c * 8]);
      const bf16* kv = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float* qr = &qs[warp * kRowsPerWarp + r][c * 8];
        float a = sc[r];
#pragma unroll
        for (int e = 0; e < 8; ++e) a += qr[e] * to_f32(kv[e]);
        sc[r] = a;
      }
    }
    // Online softmax per row, then P.V with lane = head dims [8 lane, 8 lane + 8).
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      if (!valid[r] || tile >= n_ctx[r]) continue;  // warp-uniform
      const float x = tile + lane < n_ctx[r] ? sc[r] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(x));
      const float p = expf(x - m_new);
      const float corr = expf(m[r] - m_new);
      l[r] = l[r] * corr + warp_sum(p);
      m[r] = m_new;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[r][e] *= corr;
      const int n_keys = min(kTileKeys, n_ctx[r] - tile);
      for (int kk = 0; kk < n_keys; ++kk) {
        const float pk = __shfl_sync(0xffffffffu, p, kk);  // every lane shuffles; lanes past hd skip the FMAs
        if (8 * lane < hd) {
          const uint4 raw = *reinterpret_cast<const uint4*>(&vs[buf][kk][8 * lane]);
          const bf16* vv = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[r][e] += pk * to_f32(vv[e]);
        }
      }
    }
    __syncthreads();  // every thread is done with buf before the next pass refills it
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (!valid[r]) continue;
    const int row = row0 + warp * kRowsPerWarp + r;
    const int64_t th = int64_t(t0 + row / G) * nH + kvh * G + row % G;  // (token, head)
    if (n_splits == 1) {
      if (8 * lane < hd)
#pragma unroll
        for (int e = 0; e < 8; ++e) out[th * hd + 8 * lane + e] = to_bf16(acc[r][e] / l[r]);
      continue;
    }
    float* dst = partial + ((th - int64_t(t_begin) * nH) * n_splits + split) * (hd + 2);
    if (8 * lane < hd)
#pragma unroll
      for (int e = 0; e < 8; ++e) dst[8 * lane + e] = acc[r][e];
    if (lane == 0) {
      dst[hd] = m[r];  // -inf for an empty split (its l is 0)
      dst[hd + 1] = l[r];
    }
  }
}

// One CTA of kCombineWarps warps per (token, query head) of the rows from t_begin, for tokens of
// sequences with min_chunk < new tokens <= max_chunk: merges the splits' partial softmax states.
// Warp w merges splits w, w + kCombineWarps, ... (lane = 8 head dims) into its own state, their
// partials loaded Batch splits at a time before any is used; the warps' states are then
// merged in warp order, so the result does not depend on scheduling. The step plan (which
// sequence a token is of, its length) is read before pdl_wait: it is written before the step.
// (Three passes over the splits, for the maximum, the sum and the accumulators, each waiting on
// its loads, took 6.3 us a launch in place at one token and 64 splits and 6.8 at 8 tokens, against
// 5.3 and 5.1 now on the H200: docs/perf/2026-12-01-s16-cuda-27b.md. A single warp per row took
// 50 us a layer at 132 splits.)
// Batch: splits a warp loads at once, kCombineBatch where a warp has more than one split (decode,
// verify), else 1: the registers of 8 splits a thread left 2 CTAs an SM, and a 1k prefill's combine
// (24,576 rows of 2 splits) took 1.7 ms longer (H200, docs/perf/2026-12-01-s16-cuda-27b.md).
// gate (AttnGate): each thread's gate value is read before pdl_wait too. It comes from a kernel
// before the attention kernel, which waited for it to finish before it let this one start.
constexpr int kCombineWarps = 8;
constexpr int kCombineBatch = 8;
static_assert(kCombineWarps * 32 >= kMaxHeadDim, "a thread a head dim of the row");

template <int Batch>
__global__ void __launch_bounds__(kCombineWarps * 32) attention_combine_kernel(
    const float* partial, bf16* out, const int32_t* seq_of_token, const int32_t* cu_seqlens, int t_begin, int nH,
    int hd, int n_splits, int min_chunk, int max_chunk, AttnGate gate) {
  __shared__ float warp_m[kCombineWarps], warp_l[kCombineWarps];
  __shared__ float warp_acc[kCombineWarps][kMaxHeadDim];
  const int th = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = t_begin + th / nH, s = seq_of_token[t];
  const int len = cu_seqlens[s + 1] - cu_seqlens[s];
  const int64_t at = (int64_t(t) * nH + th % nH) * hd + threadIdx.x;  // the thread's element of out
  const float g = gate.gate && int(threadIdx.x) < hd ? to_f32(gate.gate[at]) : 0.f;
  pdl_wait();  // launch.cuh: the partials come from the attention kernel
  pdl_trigger();
  if (len <= min_chunk || len > max_chunk) return;  // the whole CTA
  const int stride = hd + 2;  // floats per split: accumulator [hd], max, sum
  const float* src = partial + int64_t(th) * n_splits * stride;
  const int d0 = min(8 * lane, hd - 8);  // hd is a multiple of 8 and at most 256; lanes past hd repeat the last 8
  // This warp's state: maximum, sum of l * exp(m - mw), accumulators scaled alike.
  float mw = -INFINITY, lw = 0.f, acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int sp0 = warp; sp0 < n_splits; sp0 += kCombineWarps * Batch) {
    float ms[Batch], ls[Batch];
    float2 a[Batch][4];  // float2: the stride is even, so 8-byte aligned
#pragma unroll
    for (int k = 0; k < Batch; ++k) {
      const int sp = sp0 + k * kCombineWarps;
      const float* p = src + int64_t(sp < n_splits ? sp : sp0) * stride;  // past the last: sp0 again, unused
      ms[k] = sp < n_splits ? p[hd] : -INFINITY;
      ls[k] = p[hd + 1];
#pragma unroll
      for (int e = 0; e < 4; ++e) a[k][e] = reinterpret_cast<const float2*>(p + d0)[e];
    }
    float mn = mw;
#pragma unroll
    for (int k = 0; k < Batch; ++k) mn = fmaxf(mn, ms[k]);
    if (mn == -INFINITY) continue;  // only empty splits so far (an empty split's m is -inf, its l 0)
    const float rescale = mw == -INFINITY ? 0.f : expf(mw - mn);
    lw *= rescale;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= rescale;
#pragma unroll
    for (int k = 0; k < Batch; ++k) {
      const float wgt = ms[k] == -INFINITY ? 0.f : expf(ms[k] - mn);
      lw += wgt * ls[k];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        acc[2 * e] += wgt * a[k][e].x;
        acc[2 * e + 1] += wgt * a[k][e].y;
      }
    }
    mw = mn;
  }
  if (lane == 0) {
    warp_m[warp] = mw;
    warp_l[warp] = lw;
  }
  if (8 * lane < hd)
#pragma unroll
    for (int e = 0; e < 8; ++e) warp_acc[warp][d0 + e] = acc[e];
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) M = fmaxf(M, warp_m[w]);
  float f[kCombineWarps], L = 0.f;  // each warp's scale to the row's maximum
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) {
    f[w] = warp_m[w] == -INFINITY ? 0.f : expf(warp_m[w] - M);
    L += warp_l[w] * f[w];
  }
  if (int(threadIdx.x) >= hd) return;
  float v = 0.f;
#pragma unroll
  for (int w = 0; w < kCombineWarps; ++w) v += warp_acc[w][threadIdx.x] * f[w];
  bf16 o = to_bf16(v / L);
  if (gate.gate) o = to_bf16(to_f32(o) * sigmoid_f(g));  // as sigmoid_mul_kernel
  out[at] = o;
  if (gate.half)  // o / 16 as bf16x2_to_f16x2_16th makes it (the GEMV's F16 inputs)
    reinterpret_cast<uint16_t*>(gate.half)[at] = static_cast<uint16_t>(bf16x2_to_f16x2_16th(__bfloat16_as_ushort(o)));
}

}  // namespace

void launch_kv_append(const bf16* k, const bf16* v, bf16* k_cache, bf16* v_cache, const int32_t* seq_of_token,
                      const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* block_tables, int max_blocks,
                      int T, int nKV, int hd, int block_size, cudaStream_t s) {
  if (T == 0) return;
  const bool vec = (nKV * hd) % 8 == 0 && aligned16(k) && aligned16(v) && aligned16(k_cache) && aligned16(v_cache);
  launch_kernel("kv_append", kv_append_kernel, T, 256, 0, s, k, v, k_cache, v_cache, seq_of_token, cu_seqlens, n_past,
                block_tables, max_blocks, nKV * hd, block_size, vec);
}

int attention_row_groups(int max_chunk, int nH, int nKV) {
  return (max_chunk * (nH / nKV) + kRowsPerCta - 1) / kRowsPerCta;
}

int attention_splits(int n_seqs, int row_groups, int nH, int nKV, int hd, int T, int max_ctx,
                     size_t partial_budget_bytes) {
  constexpr int kMinSplitLen = 64;   // keys per CTA: enough work to amortise a combine
  // Twice the CTAs resident at once on an H100/H200 (2 per SM at 74 KiB of shared memory): for
  // graph steps the splits cover the padded table width, of which about half lies past the
  // context, and those CTAs end at once.
  constexpr int kTargetCtas = 528;
  const int ctas = n_seqs * row_groups * nKV;
  int n = (max_ctx + kMinSplitLen - 1) / kMinSplitLen;
  n = std::min(n, std::max(1, kTargetCtas / ctas));  // split only to fill the GPU
  const size_t per_split = size_t(T) * nH * (hd + 2) * sizeof(float);
  if (n > 1 && size_t(n) * per_split > partial_budget_bytes) n = static_cast<int>(partial_budget_bytes / per_split);
  return n < 1 ? 1 : n;
}

void launch_attention(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, float* partial,
                      int n_splits, int row_groups, int max_ctx, const int32_t* seq_of_token, const int32_t* cu_seqlens,
                      const int32_t* n_past, const int32_t* block_tables, int max_blocks, int t_begin, int t_end,
                      int n_seqs, int max_chunk, int nH, int nKV, int hd, int block_size, float scale, cudaStream_t s) {
  if (t_end <= t_begin) return;
  DS_ASSERT(hd <= kMaxHeadDim && hd % 8 == 0, "attention supports head_dim <= %d and a multiple of 8, got %d",
            kMaxHeadDim, hd);
  DS_ASSERT(nH % nKV == 0, "query heads %d not a multiple of KV heads %d", nH, nKV);
  DS_ASSERT(n_splits == 1 || partial != nullptr, "split attention needs partial buffers");
  DS_ASSERT(int64_t(n_seqs) * row_groups <= 65535, "attention grid: %d sequences x %d row groups", n_seqs, row_groups);
  int split_len = (max_ctx + n_splits - 1) / n_splits;
  split_len = (split_len + kTileKeys - 1) / kTileKeys * kTileKeys;
  const dim3 grid(n_splits, nKV, n_seqs * row_groups);
  static const bool smem_set = [] {  // over the 48 KiB default, once
    CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kAttnSmemBytes));
    return true;
  }();
  (void)smem_set;
  launch_kernel("attention", attention_kernel, grid, kWarps * 32, kAttnSmemBytes, s, q, k_cache, v_cache, out, partial, cu_seqlens,
                n_past, block_tables, max_blocks, nH, nKV, hd, block_size, scale, n_splits, split_len, row_groups,
                t_begin, max_chunk);
  if (n_splits > 1)
    launch_attention_combine(partial, out, seq_of_token, cu_seqlens, t_begin, t_end, 0, max_chunk, nH, hd, n_splits,
                             s);
}

void launch_attention_combine(const float* partial, bf16* out, const int32_t* seq_of_token, const int32_t* cu_seqlens,
                              int t_begin, int t_end, int min_chunk, int max_chunk, int nH, int hd, int n_splits,
                              cudaStream_t s, AttnGate gate) {
  DS_ASSERT(hd % 8 == 0 && hd <= kMaxHeadDim, "attention combine: head_dim %d", hd);
  DS_ASSERT(gate.gate || !gate.half, "attention combine: an fp16 copy of the gated output only");
  const int TH = (t_end - t_begin) * nH;
  if (TH <= 0) return;
  auto* kernel = n_splits > kCombineWarps ? attention_combine_kernel<kCombineBatch> : attention_combine_kernel<1>;
  launch_kernel("attention_combine", kernel, TH, kCombineWarps * 32, 0, s, partial, out, seq_of_token, cu_seqlens,
                t_begin, nH, hd, n_splits, min_chunk, max_chunk, gate);
}

}  // namespace ds::cuda
