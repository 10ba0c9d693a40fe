// CPU kernels of the token permutation: the dispatch plan (counts, padded group starts, and each
// choice's row in token order) and the row scatter into the expert-major buffer, which writes
// zeros into every row no choice maps to (padding and slack).
#include "meshtrain/moe/dispatch.h"

#include <algorithm>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

// groups row 1 first holds the counts, row 0 the padded starts; row 0 then serves as the fill
// cursor of each group and is wound back to the starts at the end (no scratch needed).
void dispatch_plan(const int32_t* ids, int64_t n, int64_t e, int64_t align, int64_t capacity,
                   int32_t* row_map, int32_t* groups) {
  int32_t* start = groups;
  int32_t* count = groups + e;
  std::fill_n(count, e, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t x = ids[i];
    MT_CHECK_T(ValueError, x >= 0 && x < e,
               "moe_dispatch_plan: expert id {} at choice {} is outside [0, {})", x, i, e);
    ++count[x];
  }
  int64_t row = 0;
  for (int64_t x = 0; x < e; ++x) {
    start[x] = int32_t(row);
    row += (count[x] + align - 1) / align * align;
  }
  MT_CHECK(row <= capacity, "moe_dispatch_plan: {} padded rows exceed the capacity {}", row,
           capacity);
  for (int64_t i = 0; i < n; ++i) row_map[i] = start[ids[i]]++;
  for (int64_t x = 0; x < e; ++x) start[x] -= count[x];
}

void check_rows(const int32_t* row_map, int64_t n, int64_t capacity, const char* op) {
  for (int64_t i = 0; i < n; ++i)
    MT_CHECK_T(ValueError, row_map[i] >= 0 && row_map[i] < capacity,
               "{}: row_map[{}] = {} is outside the buffer's {} rows", op, i, row_map[i], capacity);
}

template <typename T>
void permute(const T* x, const int32_t* row_map, const T* w, T* out, int64_t tokens, int64_t k,
             int64_t d, int64_t capacity) {
  std::fill_n(out, capacity * d, T(0));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      T* dst = out + int64_t(row_map[t * k + j]) * d;
      const T* src = x + t * d;
      if (w) {
        const T s = w[t * k + j];
        for (int64_t c = 0; c < d; ++c) dst[c] = src[c] * s;
      } else {
        std::copy_n(src, d, dst);
      }
    }
}

MT_REGISTER_OPS {
  add_cpu_kernel("moe_dispatch_plan", [](KernelContext& c) {
    const Attrs& a = c.attrs();
    const int64_t n = c.in[0].numel(), e = a.i("num_experts"), align = a.i("alignment");
    dispatch_plan(in_ptr<int32_t>(c, 0), n, e, align, ops::moe_capacity(n, e, align),
                  out_ptr<int32_t>(c, 0), out_ptr<int32_t>(c, 1));
  });
  add_cpu_kernel("moe_permute", [](KernelContext& c) {
    const Shape& xs = c.in[0].shape();
    const Shape& ms = c.in[1].shape();
    const int64_t capacity = c.out[0].shape()[0];
    check_rows(in_ptr<int32_t>(c, 1), ms.numel(), capacity, "moe_permute");
    const bool weighted = c.in.size() == 3;
    MT_CHECK_T(ValueError, !weighted || c.in[2].dtype() == c.in[0].dtype(),
               "moe_permute: the cpu backend needs weights of the rows' dtype {}, found {}",
               c.in[0].dtype(), c.in[2].dtype());
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "moe_permute", [&] {
      permute(in_ptr<scalar_t>(c, 0), in_ptr<int32_t>(c, 1),
              weighted ? in_ptr<scalar_t>(c, 2) : nullptr, out_ptr<scalar_t>(c, 0), xs[0], ms[1],
              xs[1], capacity);
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
