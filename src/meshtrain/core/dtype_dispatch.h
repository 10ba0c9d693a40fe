// The one dtype switch of the kernels: runs a body with `scalar_t` bound to the C++ type of a
// floating DType. CPU reference kernels take float32 and float64 (bf16 enters through cast ops);
// CUDA kernels add bfloat16 as their device type (MT_DISPATCH_CUDA_FLOAT in
// ops/cuda/cuda_kernel.h).
#pragma once

#include <type_traits>

#include "meshtrain/core/check.h"
#include "meshtrain/core/dtype.h"

namespace meshtrain::detail {

template <typename T>
struct ScalarTag {
  using type = T;
};

// Calls body(ScalarTag<T>{}) with T float, double or, where BF16 is not void, BF16; any other
// dtype is a ValueError that names `what`.
template <typename BF16, typename Body>
decltype(auto) dispatch_float(DType dtype, const char* what, Body&& body) {
  constexpr bool with_bf16 = !std::is_void_v<BF16>;
  switch (dtype) {
    case DType::kF32: return body(ScalarTag<float>{});
    case DType::kF64: return body(ScalarTag<double>{});
    case DType::kBF16:
      if constexpr (with_bf16) return body(ScalarTag<BF16>{});
      break;
    default: break;
  }
  MT_THROW(ValueError, "{}: expected dtype {}, found {}", what,
           with_bf16 ? "float32, float64 or bfloat16" : "float32 or float64", dtype_name(dtype));
}

}  // namespace meshtrain::detail

// MT_DISPATCH_FLOAT_TYPES(dtype, what, BF16, [&] { ... scalar_t ... }): BF16 is the type bf16
// tensors compute in, or void where they are refused. The body runs once, for the dtype found.
#define MT_DISPATCH_FLOAT_TYPES(dtype, what, BF16, ...)                       \
  ::meshtrain::detail::dispatch_float<BF16>((dtype), (what), [&](auto tag_) { \
    using scalar_t = typename decltype(tag_)::type;                           \
    return (__VA_ARGS__)();                                                   \
  })

// CPU reference kernels: float32 and float64.
#define MT_DISPATCH_FLOAT(dtype, what, ...) MT_DISPATCH_FLOAT_TYPES(dtype, what, void, __VA_ARGS__)
