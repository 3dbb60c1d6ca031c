// Paged KV append and causal GQA attention over the paged cache: one warp per (token, query
// head) with an online softmax; each lane owns head dims lane, lane+32, ... (head_dim <= 256).
// Correct for any step shape; the split-KV decode and flash prefill kernels are future work.
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

__global__ void attention_kernel(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out,
                                 const int32_t* seq_of_token, const int32_t* cu_seqlens, const int32_t* n_past,
                                 const int32_t* block_tables, int max_blocks, int T, int nH, int nKV, int hd,
                                 int block_size, float scale) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= T * nH) return;
  const int t = warp / nH, h = warp % nH, kvh = h / (nH / nKV);
  const int s = seq_of_token[t];
  const int n_ctx = n_past[s] + (t - cu_seqlens[s]) + 1;  // causal: keys 0..own position
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int e = 0; e < kMaxDimsPerLane; ++e) {
    const int d = lane + 32 * e;
    qr[e] = d < hd ? to_f32(q[(int64_t(t) * nH + h) * hd + d]) : 0.f;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j < n_ctx; ++j) {
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
#pragma unroll
  for (int e = 0; e < kMaxDimsPerLane; ++e) {
    const int d = lane + 32 * e;
    if (d < hd) out[(int64_t(t) * nH + h) * hd + d] = to_bf16(acc[e] / l);
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

void launch_attention(const bf16* q, const bf16* k_cache, const bf16* v_cache, bf16* out,
                      const int32_t* seq_of_token, const int32_t* cu_seqlens, const int32_t* n_past,
                      const int32_t* block_tables, int max_blocks, int T, int nH, int nKV, int hd, int block_size,
                      float scale, cudaStream_t s) {
  if (T == 0) return;
  DS_ASSERT(hd <= 32 * kMaxDimsPerLane, "attention supports head_dim <= %d, got %d", 32 * kMaxDimsPerLane, hd);
  const int warps = T * nH, per_block = 4;
  attention_kernel<<<(warps + per_block - 1) / per_block, 32 * per_block, 0, s>>>(
      q, k_cache, v_cache, out, seq_of_token, cu_seqlens, n_past, block_tables, max_blocks, T, nH, nKV, hd,
      block_size, scale);
  cuda_check_launch("attention", s);
}

}  // namespace ds::cuda
