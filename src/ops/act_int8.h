// W4A8 inputs (LinearWeight::act_int8): the rounding of a linear's input to int8, each token's
// 64-column chunk with its own scale, max |x| / 127 (q = x * (127 / max |x|) rounded to nearest
// even). The CUDA GEMV quantises its staged inputs this way (qgemv_tma.cuh, stage_inputs8); this
// is its CPU twin, which gives back the values q * scale the int8 sums stand for.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ds {

constexpr int kActInt8Chunk = 64;  // columns sharing one input scale

// x f32 [T, K] (K a multiple of kActInt8Chunk) in place: each value replaced by q * scale.
inline void round_act_int8(float* x, int64_t T, int64_t K) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < K; c += kActInt8Chunk) {
      float* v = x + t * K + c;
      float amax = 0.f;
      for (int k = 0; k < kActInt8Chunk; ++k) amax = std::max(amax, std::fabs(v[k]));
      const float inv = amax > 0.f ? 127.f / amax : 0.f, scale = amax / 127.f;
      for (int k = 0; k < kActInt8Chunk; ++k) v[k] = std::nearbyint(v[k] * inv) * scale;
    }
}

}  // namespace ds
