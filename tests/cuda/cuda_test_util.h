// Helpers shared by the CUDA op tests: the relative RMS error they report, and random inputs
// already rounded to bf16 so both backends see identical values.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"

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

}  // namespace ds::cuda_test
