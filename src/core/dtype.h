// Element types and the scalar conversions every module shares (bf16/fp16 <-> fp32).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace ds {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

size_t dtype_size(DType t);
const char* dtype_name(DType t);                            // safetensors spelling: "BF16", "F32", ...
std::optional<DType> dtype_from_name(std::string_view name);  // inverse of dtype_name
inline bool dtype_is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, NaN kept quiet (what torch does).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of a float dtype (F32/F16/BF16) to fp32.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);

}  // namespace ds
