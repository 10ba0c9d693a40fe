// Element types as files name them (safetensors "dtype" strings) and the one place that converts
// between them and meshtrain's DTypes. Rule: a conversion is exact or rounds to nearest even; one
// that would lose meaning (float <-> int, an out-of-range integer) is a ValueError, never a guess.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "meshtrain/core/dtype.h"

namespace meshtrain {

enum class FileDType : uint8_t {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8 e4m3fn (no infinities, NaN = S.1111.111), as DeepSeek-V3 ships its weights
  kI64,
  kI32,
  kI16,
  kI8,
  kU8,
  kBool,
};

const char* file_dtype_name(FileDType d);  // "F32", "BF16", "F8_E4M3", ...
size_t file_dtype_size(FileDType d);
// nullopt for a name safetensors does not define (or meshtrain does not read).
std::optional<FileDType> parse_file_dtype(std::string_view name);
bool is_floating(FileDType d);
// The file dtype that stores a meshtrain dtype exactly.
FileDType file_dtype_of(DType d);
// The meshtrain dtype a file dtype is exactly, if any (F32 -> kF32; F16 -> nullopt).
std::optional<DType> dtype_of_file(FileDType d);

// Whether convert_from_file / convert_to_file accept the pair: floats to floats, integers (and
// BOOL) to integers. F8_E4M3 is read only.
bool can_convert_from_file(FileDType from, DType to);
bool can_convert_to_file(DType from, FileDType to);

// Converts n elements. `what` names the tensor in errors (ValueError: a pair it cannot convert,
// an integer that does not fit). src and dst must not overlap.
void convert_from_file(FileDType from, const void* src, DType to, void* dst, int64_t n,
                       std::string_view what);
void convert_to_file(DType from, const void* src, FileDType to, void* dst, int64_t n,
                     std::string_view what);

// IEEE binary16 and float8 e4m3fn, element by element (exposed for tests and FP8 dequantisation).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);  // round to nearest even; overflow -> inf; NaN stays NaN
float e4m3_to_float(uint8_t x);

}  // namespace meshtrain
