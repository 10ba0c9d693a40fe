// CPU grouped GEMM: one OpenBLAS call per expert on its group's rows (row-major cblas_?gemm);
// groups are validated against the buffer first, since their counts are data.
#include "meshtrain/moe/grouped_matmul.h"

#include <algorithm>

#include "meshtrain/ops/cpu/cpu_blas.h"
#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

template <typename T>
void grouped(const T* x, const T* w, const int32_t* g, T* y, int64_t e, int64_t rows, int64_t k,
             int64_t n, bool tw) {
  std::fill_n(y, rows * n, T(0));
  for (int64_t ex = 0; ex < e; ++ex) {
    const int64_t start = g[ex], count = g[e + ex];
    if (count == 0 || n == 0 || k == 0) continue;
    // w[ex] is [N, K] (ldb K, transposed) or [K, N] (ldb N).
    gemm<T>(false, tw, count, n, k, x + start * k, k, w + ex * n * k, tw ? k : n, y + start * n, n);
  }
}

template <typename T>
void wgrad(const T* a, const T* b, const int32_t* g, T* out, int64_t e, int64_t p, int64_t q) {
  std::fill_n(out, e * p * q, T(0));
  for (int64_t ex = 0; ex < e; ++ex) {
    const int64_t start = g[ex], count = g[e + ex];
    if (count == 0 || p == 0 || q == 0) continue;
    gemm<T>(true, false, p, q, count, a + start * p, p, b + start * q, q, out + ex * p * q, q);
  }
}

MT_REGISTER_OPS {
  add_cpu_kernel("grouped_matmul", [](KernelContext& c) {
    const Shape& xs = c.in[0].shape();
    const Shape& ws = c.in[1].shape();
    const bool tw = c.attrs().b("transpose_w");
    const int64_t e = ws[0], n = c.out[0].shape()[1];
    ops::check_group_rows(in_ptr<int32_t>(c, 2), e, xs[0], "grouped_matmul");
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "grouped_matmul", [&] {
      grouped(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<int32_t>(c, 2),
              out_ptr<scalar_t>(c, 0), e, xs[0], xs[1], n, tw);
    });
  });
  add_cpu_kernel("grouped_matmul_wgrad", [](KernelContext& c) {
    const Shape& as = c.in[0].shape();
    const Shape& bs = c.in[1].shape();
    const int64_t e = c.in[2].shape()[1];
    ops::check_group_rows(in_ptr<int32_t>(c, 2), e, as[0], "grouped_matmul_wgrad");
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "grouped_matmul_wgrad", [&] {
      wgrad(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<int32_t>(c, 2),
            out_ptr<scalar_t>(c, 0), e, as[1], bs[1]);
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
