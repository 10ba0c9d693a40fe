// CPU embedding kernels. Backward zero-fills dweight, then adds token rows in token order, so
// the result is bitwise reproducible. Out-of-range ids raise ValueError naming the id and V.
#include <cstring>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

void check_id(int32_t id, int64_t token, int64_t v) {
  MT_CHECK_T(ValueError, id >= 0 && id < v,
             "embedding: token {} has id {}, expected an id in [0, {}) (V = {})", token, id, v, v);
}

template <typename T>
void embedding_forward(const int32_t* ids, const T* w, T* y, int64_t n, int64_t v, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    check_id(ids[t], t, v);
    std::memcpy(y + t * d, w + int64_t(ids[t]) * d, size_t(d) * sizeof(T));
  }
}

template <typename T>
void embedding_backward(const int32_t* ids, const T* dy, T* dw, int64_t n, int64_t v, int64_t d) {
  std::fill_n(dw, v * d, T(0));
  for (int64_t t = 0; t < n; ++t) {
    check_id(ids[t], t, v);
    T* row = dw + int64_t(ids[t]) * d;
    const T* g = dy + t * d;
    for (int64_t j = 0; j < d; ++j) row[j] += g[j];
  }
}

MT_REGISTER_OPS {
  add_cpu_kernel("embedding", [](KernelContext& c) {
    const Shape& ws = c.in[1].shape();
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "embedding", [&] {
      embedding_forward(in_ptr<int32_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                        c.in[0].numel(), ws[0], ws[1]);
    });
  });
  add_cpu_kernel("embedding_backward", [](KernelContext& c) {
    const Shape& os = c.out[0].shape();
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "embedding_backward", [&] {
      embedding_backward(in_ptr<int32_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                         c.in[0].numel(), os[0], os[1]);
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
