// File dtypes: names, sizes, and element conversions. Floats pass through double (every file
// float is exact in double), integers through int64 with a range check on the way out; F64 into
// BF16/F16 rounds via float32 (the one double rounding, noted where it happens).
#include "meshtrain/checkpoint/file_dtype.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace meshtrain {

namespace {
struct Row {
  FileDType d;
  const char* name;
  size_t size;
  bool floating;
};
constexpr Row kRows[] = {
    {FileDType::kF64, "F64", 8, true},        {FileDType::kF32, "F32", 4, true},
    {FileDType::kF16, "F16", 2, true},        {FileDType::kBF16, "BF16", 2, true},
    {FileDType::kF8E4M3, "F8_E4M3", 1, true}, {FileDType::kI64, "I64", 8, false},
    {FileDType::kI32, "I32", 4, false},       {FileDType::kI16, "I16", 2, false},
    {FileDType::kI8, "I8", 1, false},         {FileDType::kU8, "U8", 1, false},
    {FileDType::kBool, "BOOL", 1, false},
};
const Row& row(FileDType d) { return kRows[size_t(d)]; }

template <typename T>
T load(const void* p, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + size_t(i) * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store(void* p, int64_t i, T v) {
  std::memcpy(static_cast<char*>(p) + size_t(i) * sizeof(T), &v, sizeof(T));
}

double load_file_float(FileDType d, const void* p, int64_t i) {
  switch (d) {
    case FileDType::kF64: return load<double>(p, i);
    case FileDType::kF32: return load<float>(p, i);
    case FileDType::kF16: return half_to_float(load<uint16_t>(p, i));
    case FileDType::kBF16: return BFloat16::to_float(load<uint16_t>(p, i));
    case FileDType::kF8E4M3: return e4m3_to_float(load<uint8_t>(p, i));
    default: break;
  }
  MT_CHECK(false, "{} is not a float dtype", file_dtype_name(d));
  return 0;
}

int64_t load_file_int(FileDType d, const void* p, int64_t i) {
  switch (d) {
    case FileDType::kI64: return load<int64_t>(p, i);
    case FileDType::kI32: return load<int32_t>(p, i);
    case FileDType::kI16: return load<int16_t>(p, i);
    case FileDType::kI8: return load<int8_t>(p, i);
    case FileDType::kU8: return load<uint8_t>(p, i);
    case FileDType::kBool: return load<uint8_t>(p, i) != 0 ? 1 : 0;
    default: break;
  }
  MT_CHECK(false, "{} is not an integer dtype", file_dtype_name(d));
  return 0;
}

void store_int32(void* p, int64_t i, int64_t v, std::string_view what, const char* from) {
  MT_CHECK_T(ValueError,
             v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
             "{}: element {} of the {} data is {}, which does not fit in int32", what, i, from, v);
  store<int32_t>(p, i, int32_t(v));
}
}  // namespace

const char* file_dtype_name(FileDType d) { return row(d).name; }
size_t file_dtype_size(FileDType d) { return row(d).size; }
bool is_floating(FileDType d) { return row(d).floating; }

std::optional<FileDType> parse_file_dtype(std::string_view name) {
  for (const Row& r : kRows)
    if (name == r.name) return r.d;
  return std::nullopt;
}

FileDType file_dtype_of(DType d) {
  switch (d) {
    case DType::kF32: return FileDType::kF32;
    case DType::kF64: return FileDType::kF64;
    case DType::kBF16: return FileDType::kBF16;
    case DType::kI32: return FileDType::kI32;
    case DType::kI64: return FileDType::kI64;
  }
  return FileDType::kF32;
}

std::optional<DType> dtype_of_file(FileDType d) {
  switch (d) {
    case FileDType::kF32: return DType::kF32;
    case FileDType::kF64: return DType::kF64;
    case FileDType::kBF16: return DType::kBF16;
    case FileDType::kI32: return DType::kI32;
    case FileDType::kI64: return DType::kI64;
    default: return std::nullopt;
  }
}

bool can_convert_from_file(FileDType from, DType to) {
  return is_floating(from) == is_floating(to);
}

bool can_convert_to_file(DType from, FileDType to) {
  return to != FileDType::kF8E4M3 && is_floating(from) == is_floating(to);
}

void convert_from_file(FileDType from, const void* src, DType to, void* dst, int64_t n,
                       std::string_view what) {
  MT_CHECK_T(ValueError, can_convert_from_file(from, to),
             "{}: cannot convert the file's {} data to {} (floats convert to floats, integers to "
             "integers)",
             what, file_dtype_name(from), dtype_name(to));
  if (dtype_of_file(from) == to) {
    std::memcpy(dst, src, size_t(n) * dtype_size(to));
    return;
  }
  if (is_floating(from)) {
    for (int64_t i = 0; i < n; ++i) {
      const double v = load_file_float(from, src, i);
      switch (to) {
        case DType::kF64: store<double>(dst, i, v); break;
        case DType::kF32: store<float>(dst, i, float(v)); break;
        // F64 -> BF16 rounds through float32 (the double rounding noted at the top).
        case DType::kBF16: store<uint16_t>(dst, i, BFloat16::from_float(float(v))); break;
        default: MT_CHECK(false, "unreachable");
      }
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = load_file_int(from, src, i);
    if (to == DType::kI64)
      store<int64_t>(dst, i, v);
    else
      store_int32(dst, i, v, what, file_dtype_name(from));
  }
}

void convert_to_file(DType from, const void* src, FileDType to, void* dst, int64_t n,
                     std::string_view what) {
  MT_CHECK_T(ValueError, can_convert_to_file(from, to),
             "{}: cannot write {} data as {} (floats convert to F64/F32/F16/BF16, integers to "
             "integer dtypes)",
             what, dtype_name(from), file_dtype_name(to));
  if (dtype_of_file(to) == from) {
    std::memcpy(dst, src, size_t(n) * dtype_size(from));
    return;
  }
  if (is_floating(from)) {
    for (int64_t i = 0; i < n; ++i) {
      const double v = from == DType::kF64   ? load<double>(src, i)
                       : from == DType::kF32 ? double(load<float>(src, i))
                                             : double(BFloat16::to_float(load<uint16_t>(src, i)));
      switch (to) {
        case FileDType::kF64: store<double>(dst, i, v); break;
        case FileDType::kF32: store<float>(dst, i, float(v)); break;
        // From F64 these two round through float32 (the double rounding noted at the top).
        case FileDType::kF16: store<uint16_t>(dst, i, float_to_half(float(v))); break;
        case FileDType::kBF16: store<uint16_t>(dst, i, BFloat16::from_float(float(v))); break;
        default: MT_CHECK(false, "unreachable");
      }
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = from == DType::kI64 ? load<int64_t>(src, i) : load<int32_t>(src, i);
    auto fits = [&](int64_t lo, int64_t hi) {
      MT_CHECK_T(ValueError, v >= lo && v <= hi,
                 "{}: element {} is {}, which does not fit in the file's {}", what, i, v,
                 file_dtype_name(to));
    };
    switch (to) {
      case FileDType::kI64: store<int64_t>(dst, i, v); break;
      case FileDType::kI32: fits(INT32_MIN, INT32_MAX), store<int32_t>(dst, i, int32_t(v)); break;
      case FileDType::kI16: fits(INT16_MIN, INT16_MAX), store<int16_t>(dst, i, int16_t(v)); break;
      case FileDType::kI8: fits(INT8_MIN, INT8_MAX), store<int8_t>(dst, i, int8_t(v)); break;
      case FileDType::kU8: fits(0, UINT8_MAX), store<uint8_t>(dst, i, uint8_t(v)); break;
      case FileDType::kBool: fits(0, 1), store<uint8_t>(dst, i, uint8_t(v)); break;
      default: MT_CHECK(false, "unreachable");
    }
  }
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t bits;
  if (e == 0) {
    // Zero or subnormal: m * 2^-24, exact in float.
    float f = std::ldexp(float(m), -24);
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else if (e == 31) {
    bits = sign | 0x7f800000u | (m << 13);
  } else {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf, or NaN (kept quiet, payload truncated)
    return uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded to nearest even by
    // rint in the default rounding mode (1024 is the smallest normal, whose encoding it is).
    float v;
    std::memcpy(&v, &a, 4);
    return uint16_t(sign | uint16_t(std::rint(std::ldexp(v, 24))));
  }
  uint32_t h = (a >> 13) - (112u << 10);
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves the exponent up
  return uint16_t(sign | h);
}

float e4m3_to_float(uint8_t x) {
  const bool negative = x & 0x80u;
  const int e = (x >> 3) & 0xf, m = x & 0x7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float v = e == 0 ? std::ldexp(float(m), -9) : std::ldexp(1.0f + float(m) / 8.0f, e - 7);
  return negative ? -v : v;
}

}  // namespace meshtrain
