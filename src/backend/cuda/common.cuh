// Device helpers shared by the CUDA kernels: conversions, activations, block reductions, GDN
// state elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ds::cuda {

// Whether p may be read and written 16 bytes at a time (uint4).
__host__ __device__ inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The paged KV cache's blocks hold a power of two keys (CudaOps::alloc_caches): 2^block_shift.
__device__ __forceinline__ int block_shift_of(int block_size) { return __ffs(block_size) - 1; }
// The cache row of a sequence's key i, which block `block` (its table entry) holds.
__device__ __forceinline__ int64_t block_row(int32_t block, int i, int block_shift) {
  return (int64_t(block) << block_shift) | (i & ((1 << block_shift) - 1));
}
// The cache row of a sequence's key i, through the sequence's block table (i32 [max_blocks]).
__device__ __forceinline__ int64_t cache_row(const int32_t* table, int i, int block_shift) {
  return block_row(table[i >> block_shift], i, block_shift);
}

__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 to_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
// The MLP's gate: bf16(silu(gate) * up) in fp32, the one rounding every kernel that applies it
// shares (silu_mul, paired_rows, the GEMV's staged input and its swiglu epilogue).
__device__ __forceinline__ __nv_bfloat16 swiglu_bf16(float gate, float up) { return to_bf16(silu_f(gate) * up); }

// Two bf16 inputs as fp16 x / 16, the inputs of the TMA GEMV's F16 form (qgemv_tma.cuh) and the
// fp16 copies its producers make: exact for |x| from 2^-10 to 2^20 (bf16's 8 significant bits fit
// fp16's 11); larger ones saturate to fp16's largest, smaller ones round to its subnormal steps,
// 2^-20 of x.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2_16th(uint32_t v) {
  const float lo = __uint_as_float(v << 16) * 0.0625f, hi = __uint_as_float(v & 0xFFFF0000u) * 0.0625f;
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The 8 bf16 values packed in raw, in fp32.
__device__ __forceinline__ void unpack8(const uint4& raw, float* f) {
  const auto* b = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = to_f32(b[e]);
}

// The 4 bf16 values packed in raw, in fp32.
__device__ __forceinline__ void unpack4(const uint2& raw, float* f) {
  const auto* b = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
  for (int e = 0; e < 4; ++e) f[e] = to_f32(b[e]);
}

// op(a_i, b_i) for the 8 bf16 values packed in each of a and b, in fp32: op takes two floats and
// returns the bf16 to store (its own rounding).
template <class Op>
__device__ __forceinline__ uint4 map_bf16x8(uint4 a, uint4 b, Op op) {
  const auto* pa = reinterpret_cast<const __nv_bfloat16*>(&a);
  const auto* pb = reinterpret_cast<const __nv_bfloat16*>(&b);
  uint4 r;
  auto* pr = reinterpret_cast<__nv_bfloat16*>(&r);
#pragma unroll
  for (int i = 0; i < 8; ++i) pr[i] = op(to_f32(pa[i]), to_f32(pb[i]));
  return r;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.f;
    t = warp_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

// The GDN gates of one (token, v-head) from its projections a, b and the head's a_log, dt_bias:
// g = -exp(a_log) * softplus(a + dt_bias) (the log-decay), beta = sigmoid(b).
__device__ __forceinline__ void gdn_gate(float a, float b, float a_log, float dt_bias, float& g, float& beta) {
  const float x = a + dt_bias;
  const float softplus = x > 20.f ? x : log1pf(expf(x));
  g = -expf(a_log) * softplus;
  beta = sigmoid_f(b);
}

// One element of a GDN recurrent state pool stored as float, __half or __nv_bfloat16, to fp32 and
// back (rounded to nearest): the element type known at compile time.
__device__ __forceinline__ float state_to_f32(float v) { return v; }
__device__ __forceinline__ float state_to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float state_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class S>
__device__ __forceinline__ S state_from_f32(float v) {
  if constexpr (std::is_same_v<S, float>) return v;
  else if constexpr (std::is_same_v<S, __half>) return __float2half_rn(v);
  else return __float2bfloat16_rn(v);
}

// The same, the element type chosen at run time: fp32 (dtype 0), fp16 (1) or bf16 (2).
__device__ __forceinline__ float load_state(const void* p, int64_t i, int dtype) {
  if (dtype == 0) return state_to_f32(static_cast<const float*>(p)[i]);
  if (dtype == 1) return state_to_f32(static_cast<const __half*>(p)[i]);
  return state_to_f32(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void store_state(void* p, int64_t i, float v, int dtype) {
  if (dtype == 0) static_cast<float*>(p)[i] = state_from_f32<float>(v);
  else if (dtype == 1) static_cast<__half*>(p)[i] = state_from_f32<__half>(v);
  else static_cast<__nv_bfloat16*>(p)[i] = state_from_f32<__nv_bfloat16>(v);
}

}  // namespace ds::cuda
