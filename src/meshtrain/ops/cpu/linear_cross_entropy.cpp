// CPU linear_cross_entropy (the oracle of the CUDA kernel) and scale_by / scale_by_accumulate.
// Rows go through in chunks: logits of one chunk = h_c wᵀ into the workspace, turned in place into
// (softmax - onehot) / count, then dh_c = g w and dw (+)= gᵀ h_c (dw overwritten by the first
// chunk). Row order everywhere, so the loss sums as cross_entropy's kernel does.
#include "meshtrain/ops/linear_cross_entropy.h"

#include <algorithm>

#include "meshtrain/ops/cpu/cpu_blas.h"
#include "meshtrain/ops/cpu/cpu_kernel.h"
#include "meshtrain/ops/cpu/cross_entropy_rows.h"

namespace meshtrain::cpu {
namespace {

struct LceDims {
  int64_t n, d, v, chunk;
};

LceDims lce_dims(const Shape& h, const Shape& w, int64_t chunk_rows) {
  return {h[0], h[1], w[0], std::max<int64_t>(1, std::min(chunk_rows, h[0]))};
}

// dh and dw are null without grads. `logits` holds chunk · v elements.
template <typename T>
void lce(const T* h, const T* w, const int32_t* labels, int64_t count, T* loss, T* dh, T* dw,
         T* logits, const LceDims& s, int64_t ignore) {
  const bool grads = dh != nullptr;
  const double f = 1.0 / double(count);  // the gradient of the loss for dloss = 1
  double total = 0;
  if (grads && (s.n == 0 || s.d == 0)) std::fill_n(dw, s.v * s.d, T(0));
  for (int64_t r0 = 0; r0 < s.n; r0 += s.chunk) {
    const int64_t rows = std::min(s.chunk, s.n - r0);
    if (s.d == 0)
      std::fill_n(logits, rows * s.v, T(0));
    else
      gemm<T>(false, true, rows, s.v, s.d, h + r0 * s.d, s.d, w, s.d, logits, s.v);
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = r0 + i;
      T* x = logits + i * s.v;
      if (labels[r] == ignore) {
        if (grads) std::fill_n(x, s.v, T(0));
        continue;
      }
      check_label(labels[r], r, s.v, ignore);
      total += row_logsumexp(x, s.v) - double(x[labels[r]]);
      if (grads) row_softmax_grad(x, x, s.v, labels[r], f);
    }
    if (!grads || s.d == 0) continue;
    gemm<T>(false, false, rows, s.d, s.v, logits, s.v, w, s.d, dh + r0 * s.d, s.d);
    gemm<T>(true, false, s.v, s.d, rows, T(1), logits, s.v, h + r0 * s.d, s.d, T(r0 > 0 ? 1 : 0),
            dw, s.d);
  }
  loss[0] = T(total / double(count));
}

template <typename T>
void scale(const T* x, const T* s, T* out, int64_t n, bool accumulate) {
  const T k = s[0];
  if (accumulate)
    for (int64_t i = 0; i < n; ++i) out[i] += x[i] * k;
  else
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * k;
}

// CPU kernels run float32 and float64 only: scale_by's input, scale and output share one dtype.
void check_same(const KernelContext& c, DType out, const char* op) {
  MT_CHECK_T(ValueError, c.in[0].dtype() == out && c.in[1].dtype() == out,
             "{} (cpu): x {}, scale {} and output {} must share a dtype", op, c.in[0].dtype(),
             c.in[1].dtype(), out);
}

MT_REGISTER_OPS {
  // Scratch: one chunk of logits, [min(chunk_rows, N), V] in the operands' dtype.
  add_cpu_kernel(
      ops::kLinearCrossEntropyOp,
      [](KernelContext& c) {
        const LceDims s = lce_dims(c.in[0].shape(), c.in[1].shape(), c.attrs().i("chunk_rows"));
        const int64_t count = checked_count(in_ptr<int64_t>(c, 3)[0]);
        const bool grads = c.attrs().b("grads");
        MT_DISPATCH_FLOAT(c.in[0].dtype(), "linear_cross_entropy", [&] {
          lce(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<int32_t>(c, 2), count,
              out_ptr<scalar_t>(c, 0), grads ? out_ptr<scalar_t>(c, 1) : nullptr,
              grads ? out_ptr<scalar_t>(c, 2) : nullptr, static_cast<scalar_t*>(c.workspace.raw()),
              s, c.attrs().i("ignore_index"));
        });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs& at) {
        const LceDims s = lce_dims(in.at(0).shape, in.at(1).shape, at.i("chunk_rows"));
        return size_t(s.chunk * s.v) * dtype_size(in[0].dtype);
      });
  add_cpu_kernel(ops::kScaleByOp, [](KernelContext& c) {
    check_same(c, c.out[0].dtype(), "scale_by");
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "scale_by", [&] {
      scale(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
            c.out[0].numel(), false);
    });
  });
  add_cpu_kernel(ops::kScaleByAccumulateOp, [](KernelContext& c) {
    const DType dt = c.in[0].dtype();
    MT_CHECK_T(ValueError, c.in[1].dtype() == dt && c.in[2].dtype() == dt,
               "scale_by_accumulate (cpu): destination {}, x {} and scale {} must share a dtype",
               dt, c.in[1].dtype(), c.in[2].dtype());
    MT_DISPATCH_FLOAT(dt, "scale_by_accumulate", [&] {
      scale(in_ptr<scalar_t>(c, 1), in_ptr<scalar_t>(c, 2), inout_ptr<scalar_t>(c, 0),
            c.in[0].numel(), !c.attrs().b("overwrite"));
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
