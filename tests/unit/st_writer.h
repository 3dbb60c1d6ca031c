// Test helper: writes safetensors images (valid or deliberately broken) and copies fixtures.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "test_data_dir.h"

namespace ds::test {

struct StEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// A safetensors image; `header_override` replaces the generated JSON header when non-empty.
inline std::string make_safetensors(const std::vector<StEntry>& entries, const std::string& header_override = "") {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}";
  std::string data;
  for (const auto& e : entries) {
    std::string shape;
    for (size_t i = 0; i < e.shape.size(); ++i) shape += (i ? "," : "") + std::to_string(e.shape[i]);
    header += ",\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(data.size()) + "," + std::to_string(data.size() + e.bytes.size()) + "]}";
    data.append(e.bytes.begin(), e.bytes.end());
  }
  header += "}";
  if (!header_override.empty()) header = header_override;
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A fresh copy of tests/data/<name> (test_data_dir) in a temporary folder.
inline std::filesystem::path copy_fixture(const std::string& name, const std::string& tag) {
  namespace fs = std::filesystem;
  fs::path dst = fs::temp_directory_path() / ("ds_test_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(dst);
  fs::copy(fs::path(test_data_dir()) / name, dst, fs::copy_options::recursive);
  return dst;
}

}  // namespace ds::test
