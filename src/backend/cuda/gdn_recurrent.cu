// Gated delta rule, token by token: one block per (sequence, v-head) holds the head's state
// S [dk, dv] in fp32 shared memory for the whole chunk; thread j owns column j. Used for every
// chunk length for now (a chunked tensor-core prefill kernel is future work).
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/launchers.h"

namespace ds::cuda {

namespace {

__device__ __forceinline__ float load_state(const void* p, int64_t i, int dtype) {
  if (dtype == 0) return static_cast<const float*>(p)[i];
  if (dtype == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void store_state(void* p, int64_t i, float v, int dtype) {
  if (dtype == 0) static_cast<float*>(p)[i] = v;
  else if (dtype == 1) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}

__global__ void gdn_recurrent_kernel(const bf16* qkv, const float* g, const float* beta, void* state, int state_dtype,
                                     bf16* out, const int32_t* cu_seqlens, const int32_t* n_past,
                                     const int32_t* slots, int Hk, int Hv, int dk, int dv) {
  extern __shared__ float smem[];
  float* S = smem;             // [dk, dv]
  float* qs = S + dk * dv;     // [dk] normalised, scaled query
  float* ks = qs + dk;         // [dk] normalised key
  const int s = blockIdx.x, h = blockIdx.y, kh = h / (Hv / Hk);
  const int t0 = cu_seqlens[s], t1 = cu_seqlens[s + 1];
  if (t1 == t0) return;
  const int C = 2 * Hk * dk + Hv * dv;
  const int64_t state_off = (int64_t(slots[s]) * Hv + h) * dk * dv;
  const bool fresh = n_past[s] == 0;
  const int j = threadIdx.x;
  for (int i = 0; i < dk; ++i)
    if (j < dv) S[i * dv + j] = fresh ? 0.f : load_state(state, state_off + int64_t(i) * dv + j, state_dtype);
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
    if (j < dv) {
      const float alpha = expf(g[int64_t(t) * Hv + h]);
      const float b = beta[int64_t(t) * Hv + h];
      const float v = to_f32(row[2 * Hk * dk + h * dv + j]);
      float m = 0.f;
      for (int i = 0; i < dk; ++i) {
        const float x = S[i * dv + j] * alpha;  // decay first
        S[i * dv + j] = x;
        m += x * ks[i];
      }
      const float delta = b * (v - m);
      float o = 0.f;
      for (int i = 0; i < dk; ++i) {
        const float x = S[i * dv + j] + ks[i] * delta;
        S[i * dv + j] = x;
        o += x * qs[i];  // read after the update
      }
      out[(int64_t(t) * Hv + h) * dv + j] = to_bf16(o);
    }
    __syncthreads();  // qs/ks are rewritten by the next token
  }
  for (int i = 0; i < dk; ++i)
    if (j < dv) store_state(state, state_off + int64_t(i) * dv + j, S[i * dv + j], state_dtype);
}

}  // namespace

void launch_gdn_recurrent(const bf16* qkv, const float* g, const float* beta, void* state, int state_dtype,
                          bf16* out, const int32_t* cu_seqlens, const int32_t* n_past, const int32_t* slots, int n_seqs,
                          int Hk, int Hv, int dk, int dv, cudaStream_t s) {
  if (n_seqs == 0) return;
  const int width = dk > dv ? dk : dv;
  const int threads = ((width + 31) / 32) * 32;
  const size_t smem = (size_t(dk) * dv + 2 * dk) * sizeof(float);
  CUDA_CHECK(cudaFuncSetAttribute(gdn_recurrent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  gdn_recurrent_kernel<<<dim3(n_seqs, Hv), threads, smem, s>>>(qkv, g, beta, state, state_dtype, out, cu_seqlens,
                                                                n_past, slots, Hk, Hv, dk, dv);
  cuda_check_launch("gdn_recurrent", s);
}

}  // namespace ds::cuda
