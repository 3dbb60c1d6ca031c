// Paged KV append and causal GQA attention over the paged cache: one warp per (token, query
// head, key split) with an online softmax, each lane owning head dims lane, lane+32, ...
// (head_dim <= 256); splits of a long context run in parallel and are merged by a combine
// kernel (split-KV). Correct for any step shape; steps with long chunks give those sequences
// to the tensor-core kernel of attention_prefill.cu. GQA packing (one key load for all heads of
// a group) is future work.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

namespace {

constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256

__device__ __forceinline__ int64_t cache_row(const int32_t* block_tables, int max_blocks, int s, int i, int bs) {
  return int64_t(block_tables[s * max_blocks + i / bs]) * bs + i % bs;
}

// grid T, block (nKV * hd) threads or fewer with striding
__global__ void kv_append_kernel(const bf16* k, const bf16* v, bf16* k_cache, bf16* v_cache,
                                 const int32_t* seq_of_token, const int32_t* cu_seqlens, const int32_t* n_past,
                                 const int32_t* block_tables, int max_blocks, int width, int block_size) {
  const int t = blockIdx.x;
  const int s = seq_of_token[t];
  const int64_t row = cache_row(block_tables, max_blocks, s, n_past[s] + (t - cu_seqlens[s]), block_size);
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    k_cache[row * width + i] = k[int64_t(t) * width + i];
    v_cache[row * width + i] = v[int64_t(t) * width + i];
  }
}

// One warp per (token, query head, key split) for the n_rows tokens from t_begin, skipping
// tokens of sequences with more than max_chunk new tokens. With n_splits == 1 it writes the
// normalised output; otherwise the split's unnormalised accumulator and its (max, sum) go to
// `partial` f32 [n_rows, nH, n_splits, hd + 2] for attention_combine_kernel.
__global__ void attention_kernel(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, float* partial,
                                 const int32_t* seq_of_token, const int32_t* cu_seqlens, const int32_t* n_past,
                                 const int32_t* block_tables, int max_blocks, int t_begin, int n_rows, int max_chunk,
                                 int nH, int nKV, int hd, int block_size, float scale, int n_splits, int split_len) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= n_rows * nH * n_splits) return;
  const int split = warp % n_splits, th = warp / n_splits;
  const int t = t_begin + th / nH, h = th % nH, kvh = h / (nH / nKV);
  const int s = seq_of_token[t];
  if (cu_seqlens[s + 1] - cu_seqlens[s] > max_chunk) return;
  const int n_ctx = n_past[s] + (t - cu_seqlens[s]) + 1;  // causal: keys 0..own position
  const int j0 = split * split_len, j1 = min(n_ctx, j0 + split_len);
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int e = 0; e < kMaxDimsPerLane; ++e) {
    const int d = lane + 32 * e;
    qr[e] = d < hd ? to_f32(q[(int64_t(t) * nH + h) * hd + d]) : 0.f;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = j0; j < j1; ++j) {
    const int64_t base = (cache_row(block_tables, max_blocks, s, j, block_size) * nKV + kvh) * hd;
    float part = 0.f;
#pragma unroll
    for (int e = 0; e < kMaxDimsPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < hd) part += qr[e] * to_f32(k_cache[base + d]);
    }
    const float score = warp_sum(part) * scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new);
    const float p = expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int e = 0; e < kMaxDimsPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < hd) acc[e] = acc[e] * corr + p * to_f32(v_cache[base + d]);
    }
    m = m_new;
  }
  if (n_splits == 1) {
#pragma unroll
    for (int e = 0; e < kMaxDimsPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < hd) out[(int64_t(t) * nH + h) * hd + d] = to_bf16(acc[e] / l);
    }
    return;
  }
  float* dst = partial + (int64_t(th) * n_splits + split) * (hd + 2);
#pragma unroll
  for (int e = 0; e < kMaxDimsPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < hd) dst[d] = acc[e];
  }
  if (lane == 0) {
    dst[hd] = m;  // -inf for an empty split (its l is 0)
    dst[hd + 1] = l;
  }
}

// One warp per (token, query head) of the n_rows tokens from t_begin, for tokens of sequences
// with min_chunk < new tokens <= max_chunk: merges the splits' partial softmax states.
__global__ void attention_combine_kernel(const float* partial, bf16* out, const int32_t* seq_of_token,
                                         const int32_t* cu_seqlens, int t_begin, int TH, int min_chunk, int max_chunk,
                                         int nH, int hd, int n_splits) {
  const int th = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (th >= TH) return;
  const int t = t_begin + th / nH, s = seq_of_token[t];
  const int len = cu_seqlens[s + 1] - cu_seqlens[s];
  if (len <= min_chunk || len > max_chunk) return;
  const float* src = partial + int64_t(th) * n_splits * (hd + 2);
  float M = -INFINITY;
  for (int sp = 0; sp < n_splits; ++sp) M = fmaxf(M, src[sp * (hd + 2) + hd]);
  float L = 0.f;
  for (int sp = 0; sp < n_splits; ++sp) {
    const float ms = src[sp * (hd + 2) + hd];
    if (ms != -INFINITY) L += src[sp * (hd + 2) + hd + 1] * expf(ms - M);
  }
  for (int d = lane; d < hd; d += 32) {
    float acc = 0.f;
    for (int sp = 0; sp < n_splits; ++sp) {
      const float ms = src[sp * (hd + 2) + hd];
      if (ms != -INFINITY) acc += src[sp * (hd + 2) + d] * expf(ms - M);
    }
    out[(int64_t(t) * nH + th % nH) * hd + d] = to_bf16(acc / L);
  }
}

}  // namespace

void launch_kv_append(const bf16* k, const bf16* v, bf16* k_cache, bf16* v_cache, const int32_t* seq_of_token,
                      const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* block_tables, int max_blocks,
                      int T, int nKV, int hd, int block_size, cudaStream_t s) {
  if (T == 0) return;
  kv_append_kernel<<<T, 256, 0, s>>>(k, v, k_cache, v_cache, seq_of_token, cu_seqlens, n_past, block_tables,
                                     max_blocks, nKV * hd, block_size);
  cuda_check_launch("kv_append", s);
}

int attention_splits(int T, int nH, int hd, int max_ctx, size_t partial_budget_bytes) {
  constexpr int kSplitLen = 256;     // keys per warp: enough work to amortise a combine
  constexpr int kTargetWarps = 16384;  // ~2 waves of resident warps on an H100/H200
  int n = (max_ctx + kSplitLen - 1) / kSplitLen;
  n = std::min(n, std::max(1, kTargetWarps / (T * nH)));  // split only to fill the GPU
  const size_t per_split = size_t(T) * nH * (hd + 2) * sizeof(float);
  if (n > 1 && size_t(n) * per_split > partial_budget_bytes) n = static_cast<int>(partial_budget_bytes / per_split);
  return n < 1 ? 1 : n;
}

void launch_attention(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out, float* partial,
                      int n_splits, int max_ctx, const int32_t* seq_of_token, const int32_t* cu_seqlens,
                      const int32_t* n_past, const int32_t* block_tables, int max_blocks, int t_begin, int t_end,
                      int max_chunk, int nH, int nKV, int hd, int block_size, float scale, cudaStream_t s) {
  const int n_rows = t_end - t_begin;
  if (n_rows <= 0) return;
  DS_ASSERT(hd <= 32 * kMaxDimsPerLane, "attention supports head_dim <= %d, got %d", 32 * kMaxDimsPerLane, hd);
  DS_ASSERT(n_splits == 1 || partial != nullptr, "split attention needs partial buffers");
  const int split_len = (max_ctx + n_splits - 1) / n_splits;
  const int64_t warps = int64_t(n_rows) * nH * n_splits;
  const int per_block = 4;
  attention_kernel<<<static_cast<int>((warps + per_block - 1) / per_block), 32 * per_block, 0, s>>>(
      q, k_cache, v_cache, out, partial, seq_of_token, cu_seqlens, n_past, block_tables, max_blocks, t_begin, n_rows,
      max_chunk, nH, nKV, hd, block_size, scale, n_splits, split_len);
  cuda_check_launch("attention", s);
  if (n_splits > 1)
    launch_attention_combine(partial, out, seq_of_token, cu_seqlens, t_begin, t_end, 0, max_chunk, nH, hd, n_splits,
                             s);
}

void launch_attention_combine(const float* partial, bf16* out, const int32_t* seq_of_token, const int32_t* cu_seqlens,
                              int t_begin, int t_end, int min_chunk, int max_chunk, int nH, int hd, int n_splits,
                              cudaStream_t s) {
  const int TH = (t_end - t_begin) * nH, per_block = 4;
  if (TH <= 0) return;
  attention_combine_kernel<<<(TH + per_block - 1) / per_block, 32 * per_block, 0, s>>>(
      partial, out, seq_of_token, cu_seqlens, t_begin, TH, min_chunk, max_chunk, nH, hd, n_splits);
  cuda_check_launch("attention_combine", s);
}

}  // namespace ds::cuda
