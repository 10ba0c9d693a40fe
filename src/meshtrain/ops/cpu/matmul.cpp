// CPU matmul through OpenBLAS (row-major cblas_?gemm); the reference every GPU GEMM is tested
// against.
#include "meshtrain/ops/matmul.h"

#include "meshtrain/ops/cpu/cpu_blas.h"
#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

MT_REGISTER_OPS {
  add_cpu_kernel("matmul", [](KernelContext& c) {
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
}

}  // namespace
}  // namespace meshtrain::cpu
