// CPU kernels of the combine: gather each token's k rows from the expert-major buffer (reading
// only rows the row map names), weight and sum them in a fixed order (j = 0..k-1), so runs are
// bitwise reproducible; and the per-choice row dot products that are the gate weights' gradient.
#include <algorithm>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

void check_rows(const int32_t* row_map, int64_t n, int64_t capacity, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    MT_CHECK_T(ValueError, row_map[i] >= 0 && row_map[i] < capacity,
               "{}: row_map[{}] = {} is outside the buffer's {} rows", op, i, row_map[i], capacity);
}

template <typename T>
void combine(const T* y, const int32_t* row_map, const T* w, T* out, int64_t tokens, int64_t k,
             int64_t d) {
  for (int64_t t = 0; t < tokens; ++t) {
    T* dst = out + t * d;
    std::fill_n(dst, d, T(0));
    for (int64_t j = 0; j < k; ++j) {
      const T* src = y + int64_t(row_map[t * k + j]) * d;
      const T s = w ? w[t * k + j] : T(1);
      for (int64_t c = 0; c < d; ++c) dst[c] += s * src[c];
    }
  }
}

template <typename T>
void row_dot(const T* perm, const T* rows, const int32_t* row_map, T* out, int64_t tokens,
             int64_t k, int64_t d) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const T* p = perm + int64_t(row_map[t * k + j]) * d;
      const T* x = rows + t * d;
      double acc = 0;
      for (int64_t c = 0; c < d; ++c) acc += double(p[c]) * double(x[c]);
      out[t * k + j] = T(acc);
    }
}

MT_REGISTER_OPS {
  add_cpu_kernel("moe_combine", [](KernelContext& c) {
    const Shape& ys = c.in[0].shape();
    const Shape& ms = c.in[1].shape();
    check_rows(in_ptr<int32_t>(c, 1), ms.numel(), ys[0], "moe_combine");
    const bool weighted = c.in.size() == 3;
    MT_CHECK_T(ValueError, !weighted || c.in[2].dtype() == c.in[0].dtype(),
               "moe_combine: the cpu backend needs weights of the rows' dtype {}, found {}",
               c.in[0].dtype(), c.in[2].dtype());
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "moe_combine", [&] {
      combine(in_ptr<scalar_t>(c, 0), in_ptr<int32_t>(c, 1),
              weighted ? in_ptr<scalar_t>(c, 2) : nullptr, out_ptr<scalar_t>(c, 0), ms[0], ms[1],
              ys[1]);
    });
  });
  add_cpu_kernel("moe_row_dot", [](KernelContext& c) {
    const Shape& ps = c.in[0].shape();
    const Shape& ms = c.in[2].shape();
    check_rows(in_ptr<int32_t>(c, 2), ms.numel(), ps[0], "moe_row_dot");
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "moe_row_dot", [&] {
      row_dot(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<int32_t>(c, 2),
              out_ptr<scalar_t>(c, 0), ms[0], ms[1], ps[1]);
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
