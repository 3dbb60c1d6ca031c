// The value fill_random puts at element i: a counter-based hash (splitmix64), so CPU and CUDA
// backends draw identical synthetic weights for the same seed.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DS_HOST_DEVICE __host__ __device__
#else
#define DS_HOST_DEVICE
#endif

namespace ds {

DS_HOST_DEVICE inline float random_uniform(uint64_t seed, uint64_t i, float mean, float half_range) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E5ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  return mean + half_range * (2.0f * u - 1.0f);
}

}  // namespace ds
