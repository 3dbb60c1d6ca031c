// safetensors parsing: 8-byte little-endian header length, a JSON header, then the data.
// Every size and offset is checked before use (this parser is fuzzed: fuzz/fuzz_safetensors.cpp).
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace ds {

namespace {
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return io_error("cannot stat " + path + ": " + std::strerror(errno));
  }
  size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      ::close(fd);
      return io_error("cannot mmap " + path + ": " + std::strerror(errno));
    }
  }
  ::close(fd);
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->map_ = map;
  f->map_size_ = size;
  DS_RETURN_IF_ERROR(f->parse_header(static_cast<const uint8_t*>(map), size));
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(const uint8_t* bytes, size_t size,
                                                                const std::string& label) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = label;
  DS_RETURN_IF_ERROR(f->parse_header(bytes, size));
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status SafetensorsFile::parse_header(const uint8_t* bytes, size_t size) {
  auto bad = [&](const std::string& why) { return invalid_argument("malformed safetensors file " + path_ + ": " + why); };
  if (size < 8) return bad("file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeaderBytes) return bad("header length " + std::to_string(header_len) + " exceeds 100 MB");
  if (header_len > size - 8)
    return bad("header length " + std::to_string(header_len) + " runs past the end of the file (" +
               std::to_string(size) + " bytes; truncated?)");
  const char* hdr = reinterpret_cast<const char*>(bytes + 8);
  nlohmann::json j = nlohmann::json::parse(hdr, hdr + header_len, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("header is not valid JSON");
  if (!j.is_object()) return bad("header is not a JSON object");
  data_ = bytes + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) return bad("__metadata__ value '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object()) return bad(where + " is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad(where + " has no string 'dtype'");
    if (sh == v.end() || !sh->is_array()) return bad(where + " has no array 'shape'");
    if (off == v.end() || !off->is_array() || off->size() != 2) return bad(where + " has no 2-element 'data_offsets'");
    TensorInfo info;
    info.name = name;
    auto dtype = dtype_from_name(dt->get<std::string>());
    if (!dtype) return bad(where + " has unknown dtype '" + dt->get<std::string>() + "'");
    info.dtype = *dtype;
    uint64_t numel = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) return bad(where + " has a shape entry that is not a non-negative integer");
      uint64_t s = d.get<uint64_t>();
      if (s > (1ull << 40) || (s && numel > (1ull << 50) / s)) return bad(where + " has an absurd shape");
      numel *= s;
      info.shape.push_back(static_cast<int64_t>(s));
    }
    if ((*off)[0].is_number_unsigned() == false || (*off)[1].is_number_unsigned() == false)
      return bad(where + " has data_offsets that are not non-negative integers");
    info.begin = (*off)[0].get<uint64_t>();
    info.end = (*off)[1].get<uint64_t>();
    if (info.begin > info.end) return bad(where + " has data_offsets begin > end");
    if (info.end > data_size)
      return bad(where + " ends at byte " + std::to_string(info.end) + " of a " + std::to_string(data_size) +
                 "-byte data section (truncated file?)");
    if (info.end - info.begin != numel * dtype_size(info.dtype))
      return bad(where + " has " + std::to_string(info.end - info.begin) + " bytes but shape " +
                 shape_to_string(info.shape) + " of " + dtype_name(info.dtype) + " needs " +
                 std::to_string(numel * dtype_size(info.dtype)));
    if (info.end > info.begin) ranges.emplace_back(info.begin, info.end);
    tensors_.emplace(name, std::move(info));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return bad("two tensors' data ranges overlap");
  return Status();
}

}  // namespace ds
