// Tensor: a non-owning view (pointer, dtype, shape up to 4-D, contiguous row-major).
// Who owns the memory (mmap, a backend arena, a device pool) is the creator's business.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace ds {

constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
    DS_ASSERT(dims.size() <= kMaxDims, "at most %d dims", kMaxDims);
    for (int64_t s : dims) shape[ndim++] = s;
  }

  int64_t dim(int i) const {
    DS_ASSERT(i >= 0 && i < ndim, "dim %d of a %d-d tensor", i, ndim);
    return shape[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  float* f32() const {
    DS_ASSERT(dtype == DType::kF32, "expected F32, tensor is %s", dtype_name(dtype));
    return static_cast<float*>(data);
  }

  // Same memory, new shape (element count must match).
  Tensor view(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, dims);
    DS_ASSERT(t.numel() == numel(), "view changes element count %lld -> %lld", (long long)numel(), (long long)t.numel());
    return t;
  }
  // Rows [begin, begin+count) of the outermost dimension.
  Tensor rows(int64_t begin, int64_t count) const {
    DS_ASSERT(ndim >= 1 && begin >= 0 && begin + count <= shape[0], "rows out of range");
    Tensor t = *this;
    t.shape[0] = count;
    t.data = static_cast<char*>(data) + begin * (nbytes() / (shape[0] ? shape[0] : 1));
    return t;
  }
  std::string shape_str() const;
};

}  // namespace ds
