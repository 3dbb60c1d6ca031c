// Helpers shared by the CUDA op tests: the relative RMS error they report, random inputs already
// rounded to bf16 so both backends see identical values, a NaN-filled buffer for a producer's fp16
// copy and the check of that copy, and bytes written over a device tensor.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/ops.h"

namespace ds::cuda_test {

// Relative RMS error of a against the reference b (inf when a has a non-finite value); bf16
// storage alone costs about 2e-3.
inline double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// n normal values of standard deviation `scale`, rounded to bf16.
inline std::vector<float> random_bf16(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(nd(rng)));
  return v;
}

// The values of a producer's fp16 copy half (f16 [T, D], for the W4A16 GEMV's F16 inputs) that
// are not h / 16 (h act [T, D]): exact, but for fp16's subnormal steps (2^-24).
inline int sixteenth_misses(Ops& ops, Tensor h, Tensor half) {
  std::vector<float> hv(h.numel()), cv(half.numel());
  ops.download_f32(h, hv.data());
  ops.download_f32(half, cv.data());
  int off = 0;
  for (size_t i = 0; i < hv.size(); ++i) {
    const float want = hv[i] / 16.f;
    off += std::fabs(want) >= 0x1p-14f ? cv[i] != want : !(std::fabs(cv[i] - want) <= 0x1p-25f);  // NaN too
  }
  return off;
}

// Every byte of the device tensor t set to `value` (0xFF: fp16 and f32 NaN, for values a kernel must
// write; 0: zeros over a copy, to see whether a consumer reads it), between device-wide
// synchronisations: the ops run on a non-blocking stream, which cudaMemset does not wait for.
inline bool set_bytes(Tensor t, int value) {
  return cudaDeviceSynchronize() == cudaSuccess && cudaMemset(t.data, value, t.nbytes()) == cudaSuccess &&
         cudaDeviceSynchronize() == cudaSuccess;
}

// A scratch buffer f16 [T, D] for a producer's fp16 copy, every value NaN (so that a value the
// producer did not write fails sixteenth_misses), where `want` and ops makes a copy for that shape;
// else an empty tensor, which asks for none.
inline Tensor nan_half_copy(Ops& ops, bool want, int64_t T, int64_t D) {
  if (!want || !ops.makes_half_copy(T, D)) return {};
  Tensor half = ops.scratch(DType::kF16, {T, D});
  EXPECT_TRUE(set_bytes(half, 0xFF));
  return half;
}

}  // namespace ds::cuda_test
