// .npy v1.0 float32 reader/writer: magic, header length, a Python-dict header padded to 64.
#include "io/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

namespace ds {

Status write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
    n *= shape[i];
  }
  dict += "), }";
  const size_t unpadded = 10 + dict.size() + 1;
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) return io_error("cannot write " + path);
  const uint16_t hlen = static_cast<uint16_t>(dict.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(hlen & 0xff));
  out.put(static_cast<char>(hlen >> 8));
  out.write(dict.data(), static_cast<std::streamsize>(dict.size()));
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
  if (!out) return io_error("write to " + path + " failed");
  return Status();
}

Result<NpyArray> read_npy_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot read " + path);
  char magic[10];
  in.read(magic, 10);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0 || magic[6] != 1)
    return invalid_argument(path + ": not a version-1 .npy file");
  const size_t hlen = static_cast<uint8_t>(magic[8]) | (static_cast<uint8_t>(magic[9]) << 8);
  std::string header(hlen, '\0');
  in.read(header.data(), static_cast<std::streamsize>(hlen));
  if (header.find("'descr': '<f4'") == std::string::npos || header.find("'fortran_order': False") == std::string::npos)
    return invalid_argument(path + ": only little-endian float32 C-order arrays are supported");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'shape': \\(([0-9, ]*)\\)")))
    return invalid_argument(path + ": header has no shape");
  NpyArray a;
  int64_t n = 1;
  std::string dims = m[1];
  for (size_t pos = 0; pos < dims.size();) {
    size_t end = dims.find(',', pos);
    std::string tok = dims.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (tok.find_first_of("0123456789") != std::string::npos) {
      a.shape.push_back(std::stoll(tok));
      n *= a.shape.back();
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  a.data.resize(static_cast<size_t>(n));
  in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(n * sizeof(float)));
  if (!in) return invalid_argument(path + ": data shorter than its shape");
  return a;
}

}  // namespace ds
