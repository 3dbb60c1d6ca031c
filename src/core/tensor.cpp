// Tensor helpers that need no hot path.
#include "core/tensor.h"

namespace ds {
std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace ds
