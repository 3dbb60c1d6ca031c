// Int8 group-128 row quantisation of the vocabulary tables (embedding, lm_head): the host
// definition both backends follow exactly (the CUDA kernel in backend/cuda/int8_rows.cu computes
// the same scales and codes bit for bit; CpuOps applies it as its twin); and the values of int8
// rows, quantised so or published so (Ops::upload_int8_rows).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ds {

constexpr int kInt8Group = 128;  // input columns per scale

// Per row and group of 128 columns: scale = max|w| / 127 (fp32 division), q = rint(w / scale)
// (0 where the group is all zeros). w f32 [rows, cols]; q i8 [rows, cols];
// scales f32 [rows, cols / 128]; cols % 128 == 0.
inline void quantize_int8_rows(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scales) {
  const int64_t groups = cols / kInt8Group;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* src = w + r * cols + g * kInt8Group;
      float m = 0.f;
      for (int i = 0; i < kInt8Group; ++i) m = std::max(m, std::fabs(src[i]));
      const float scale = m / 127.f;
      scales[r * groups + g] = scale;
      for (int i = 0; i < kInt8Group; ++i) {
        const float v = m > 0.f ? std::nearbyint(src[i] / scale) : 0.f;
        q[r * cols + g * kInt8Group + i] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
      }
    }
}

// out f32 [n] = q * its group's scale: the values of n codes of quantize_int8_rows' layout
// (n a whole number of rows).
inline void dequantise_int8_rows(const int8_t* q, const float* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = float(q[i]) * scales[i / kInt8Group];
}

}  // namespace ds
