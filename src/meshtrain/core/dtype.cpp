// DType names, sizes and parsing.
#include "meshtrain/core/dtype.h"

namespace meshtrain {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kF32: return 4;
    case DType::kF64: return 8;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kBF16: return "bfloat16";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
  }
  return "?";
}

DType parse_dtype(std::string_view n) {
  if (n == "float32" || n == "fp32" || n == "f32") return DType::kF32;
  if (n == "float64" || n == "fp64" || n == "f64") return DType::kF64;
  if (n == "bfloat16" || n == "bf16") return DType::kBF16;
  if (n == "int32") return DType::kI32;
  if (n == "int64") return DType::kI64;
  MT_THROW(ConfigError, "unknown dtype '{}': expected one of float32, float64, bfloat16", n);
}

}  // namespace meshtrain
