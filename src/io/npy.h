// NumPy .npy files of float32 (version 1.0, little-endian, C order): what `deltaserve logits`
// writes and the tests read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

Status write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
Result<NpyArray> read_npy_f32(const std::string& path);

}  // namespace ds
