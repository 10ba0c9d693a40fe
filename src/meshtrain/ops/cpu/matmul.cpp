// CPU matmul and matmul_accumulate through OpenBLAS (row-major cblas_?gemm); the reference
// every GPU GEMM is tested against.
#include "meshtrain/ops/matmul.h"

#include <vector>

#include "meshtrain/ops/cpu/cpu_blas.h"
#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

MT_REGISTER_OPS {
  add_cpu_kernel(ops::kMatmulOp, [](KernelContext& c) {
    bool ta = c.attrs().b("transpose_a"), tb = c.attrs().b("transpose_b");
    TensorMeta am{c.in[0].shape(), c.in[0].dtype()}, bm{c.in[1].shape(), c.in[1].dtype()};
    ops::MatmulDims d = ops::matmul_dims(am, bm, ta, tb);
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "matmul", [&] {
      if (d.m == 0 || d.n == 0) return;
      if (d.k == 0) {
        std::fill_n(out_ptr<scalar_t>(c, 0), d.m * d.n, scalar_t(0));
        return;
      }
      gemm<scalar_t>(ta, tb, d.m, d.n, d.k, in_ptr<scalar_t>(c, 0), am.shape.last(),
                     in_ptr<scalar_t>(c, 1), bm.shape.last(), out_ptr<scalar_t>(c, 0), d.n);
    });
  });
  add_cpu_kernel(ops::kMatmulAccumulateOp, [](KernelContext& c) {
    const bool ta = c.attrs().b("transpose_a"), tb = c.attrs().b("transpose_b");
    const bool overwrite = c.attrs().b("overwrite");
    const TensorMeta dm{c.in[0].shape(), c.in[0].dtype()};
    const TensorMeta am{c.in[1].shape(), c.in[1].dtype()}, bm{c.in[2].shape(), c.in[2].dtype()};
    const ops::MatmulDims d = ops::matmul_accumulate_dims(dm, am, bm, ta, tb);
    if (d.m == 0 || d.n == 0) return;
    if (am.dtype == DType::kBF16) {
      float* dst = inout_ptr<float>(c, 0);
      if (d.k == 0) {
        if (overwrite) std::fill_n(dst, d.m * d.n, 0.0f);
        return;
      }
      const std::vector<float> a = widened_bf16(c.in[1]), b = widened_bf16(c.in[2]);
      gemm<float>(ta, tb, d.m, d.n, d.k, 1.0f, a.data(), am.shape.last(), b.data(), bm.shape.last(),
                  overwrite ? 0.0f : 1.0f, dst, d.n);
      return;
    }
    MT_DISPATCH_FLOAT(dm.dtype, "matmul_accumulate", [&] {
      scalar_t* dst = inout_ptr<scalar_t>(c, 0);
      if (d.k == 0) {
        if (overwrite) std::fill_n(dst, d.m * d.n, scalar_t(0));
        return;
      }
      gemm<scalar_t>(ta, tb, d.m, d.n, d.k, scalar_t(1), in_ptr<scalar_t>(c, 1), am.shape.last(),
                     in_ptr<scalar_t>(c, 2), bm.shape.last(), overwrite ? scalar_t(0) : scalar_t(1),
                     dst, d.n);
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
