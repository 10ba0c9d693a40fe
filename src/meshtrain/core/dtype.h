// Element types (the dtype switch of the kernels is core/dtype_dispatch.h). bfloat16 is stored as
// its upper 16 bits of a float32; float->bf16 rounds to nearest even (NaN stays NaN), bf16->float
// is exact.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "meshtrain/core/check.h"

namespace meshtrain {

enum class DType : uint8_t { kF32, kF64, kBF16, kI32, kI64 };

size_t dtype_size(DType d);
const char* dtype_name(DType d);
// Accepts "float32"/"fp32"/"f32", "float64", "bfloat16"/"bf16", "int32", "int64".
DType parse_dtype(std::string_view name);
inline bool is_floating(DType d) {
  return d == DType::kF32 || d == DType::kF64 || d == DType::kBF16;
}

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return uint16_t((u >> 16) | 0x40);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return uint16_t((u + rounding) >> 16);
  }
  static float to_float(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
static_assert(sizeof(BFloat16) == 2);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kF64;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::kBF16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kI64;
}

}  // namespace meshtrain

template <>
struct fmt::formatter<meshtrain::DType> : fmt::formatter<std::string_view> {
  auto format(meshtrain::DType d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(meshtrain::dtype_name(d), ctx);
  }
};
