// Backend-neutral communicator helpers: reduce_op_name, accumulate dtypes, bf16 staging
// conversions and argument checks. Conversions round to nearest even exactly like BFloat16.
#include "meshtrain/comm/comm_dtype.h"

#include <functional>

namespace meshtrain {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "unknown";
}

DType comm_accumulate_dtype(DType d) { return d == DType::kBF16 ? DType::kF32 : d; }
bool comm_needs_staging(DType d) { return comm_accumulate_dtype(d) != d; }

void bf16_to_f32(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16::to_float(src[i].bits);
}

void f32_to_bf16(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = BFloat16::from_float(src[i]);
}

void check_comm_tensor(const Tensor& t, Device want, const std::string& comm_name,
                       const char* collective, const char* which) {
  MT_CHECK_T(ValueError, t.defined(), "communicator '{}': {} got an undefined {} tensor", comm_name,
             collective, which);
  MT_CHECK_T(ValueError, t.device() == want,
             "communicator '{}': {} expects {} tensors on {}, found {} tensor on {}", comm_name,
             collective, which, want.to_string(), which, t.device().to_string());
}

int64_t comm_row_elems(const Tensor& t) {
  int64_t row = 1;
  const auto& d = t.shape().dims();
  for (size_t i = 1; i < d.size(); ++i) row *= d[i];
  return row;
}

bool comm_ranges_overlap(const void* a, size_t na, const void* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  // std::less gives a total order on unrelated pointers, unlike the built-in operator.
  std::less<const char*> lt;
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return lt(pa, pb + nb) && lt(pb, pa + na);
}

}  // namespace meshtrain
