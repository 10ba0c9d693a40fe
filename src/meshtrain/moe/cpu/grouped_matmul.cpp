// CPU grouped GEMM: one OpenBLAS call per expert on its group's rows (row-major cblas_?gemm);
// groups are validated against the buffer first, since their counts are data. The accumulating
// wgrad sums bf16 operands in float32 straight into the float32 gradient (no bf16 rounding).
#include "meshtrain/moe/grouped_matmul.h"

#include <algorithm>
#include <vector>

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

// dst[e] (+)= a_eᵀ b_e in T; experts with no rows are zeroed when overwriting, else untouched.
template <typename T>
void wgrad_into(const T* a, const T* b, const int32_t* g, T* dst, int64_t e, int64_t p, int64_t q,
                bool overwrite) {
  for (int64_t ex = 0; ex < e; ++ex) {
    const int64_t start = g[ex], count = g[e + ex];
    T* de = dst + ex * p * q;
    if (count == 0) {
      if (overwrite) std::fill_n(de, p * q, T(0));
      continue;
    }
    gemm<T>(true, false, p, q, count, T(1), a + start * p, p, b + start * q, q,
            overwrite ? T(0) : T(1), de, q);
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
  add_cpu_kernel(ops::kGroupedWgradAccumulateOp, [](KernelContext& c) {
    const Shape& as = c.in[1].shape();
    const Shape& bs = c.in[2].shape();
    const int64_t e = c.in[3].shape()[1], p = as[1], q = bs[1];
    const bool overwrite = c.attrs().b("overwrite");
    const int32_t* g = in_ptr<int32_t>(c, 3);
    ops::check_group_rows(g, e, as[0], ops::kGroupedWgradAccumulateOp);
    if (p == 0 || q == 0) return;
    if (c.in[1].dtype() == DType::kBF16) {
      const std::vector<float> a = widened_bf16(c.in[1]), b = widened_bf16(c.in[2]);
      wgrad_into(a.data(), b.data(), g, inout_ptr<float>(c, 0), e, p, q, overwrite);
      return;
    }
    MT_DISPATCH_FLOAT(c.in[1].dtype(), ops::kGroupedWgradAccumulateOp, [&] {
      wgrad_into(in_ptr<scalar_t>(c, 1), in_ptr<scalar_t>(c, 2), g, inout_ptr<scalar_t>(c, 0), e, p,
                 q, overwrite);
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
