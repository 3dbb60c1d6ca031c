// One safetensors file: mmap'd read-only, header parsed and validated up front so no tensor
// access can read out of bounds. Knows nothing about models.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace ds {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Opens and validates `path`; every error names the file.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Validates an in-memory image (the fuzz target and tests use this); `bytes` must outlive it.
  static Result<std::unique_ptr<SafetensorsFile>> parse(const uint8_t* bytes, size_t size, const std::string& label);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  const void* data(const TensorInfo& info) const { return data_ + info.begin; }

 private:
  SafetensorsFile() = default;
  Status parse_header(const uint8_t* bytes, size_t size);

  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace ds
