// CPU RMSNorm kernels. Row reductions and the dw sum over rows accumulate in float64, in row
// order, so float32 results are accurate and every run is bitwise identical.
#include <cmath>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

template <typename T>
double inv_rms(const T* x, int64_t d, double eps) {
  double ss = 0;
  for (int64_t j = 0; j < d; ++j) ss += double(x[j]) * double(x[j]);
  return 1.0 / std::sqrt(ss / double(d) + eps);
}

template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    T* yr = y + r * d;
    const T rstd = T(inv_rms(xr, d, eps));
    for (int64_t j = 0; j < d; ++j) yr[j] = xr[j] * rstd * w[j];
  }
}

// dx = rstd * (w*dy - xhat * mean(xhat * w * dy)),  dw = sum_rows(dy * xhat),  xhat = x * rstd.
template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* dy, T* dx, T* dw, double* dw_acc,
                      int64_t rows, int64_t d, double eps) {
  std::fill_n(dw_acc, d, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;
    const T* gr = dy + r * d;
    T* dxr = dx + r * d;
    const double rstd = inv_rms(xr, d, eps);
    double dot = 0;
    for (int64_t j = 0; j < d; ++j) dot += double(gr[j]) * double(w[j]) * double(xr[j]);
    const double c = dot * rstd / double(d);  // mean(xhat * w * dy)
    for (int64_t j = 0; j < d; ++j) {
      const double xhat = double(xr[j]) * rstd;
      dxr[j] = T(rstd * (double(gr[j]) * double(w[j]) - xhat * c));
      dw_acc[j] += double(gr[j]) * xhat;
    }
  }
  for (int64_t j = 0; j < d; ++j) dw[j] = T(dw_acc[j]);
}

MT_REGISTER_OPS {
  add_cpu_kernel("rmsnorm", [](KernelContext& c) {
    const Shape& s = c.in[0].shape();
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "rmsnorm", [&] {
      rmsnorm_forward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                      s.rows(), s.last(), c.attrs().f("eps"));
    });
  });
  // Scratch: the dw row-sum accumulates in float64, D elements (none when D == 0).
  add_cpu_kernel(
      "rmsnorm_backward",
      [](KernelContext& c) {
        const Shape& s = c.in[0].shape();
        double* acc = c.workspace.defined() ? static_cast<double*>(c.workspace.raw()) : nullptr;
        MT_DISPATCH_FLOAT(c.out[0].dtype(), "rmsnorm_backward", [&] {
          rmsnorm_backward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<scalar_t>(c, 2),
                           out_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 1), acc, s.rows(),
                           s.last(), c.attrs().f("eps"));
        });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs&) {
        return size_t(in[1].numel()) * sizeof(double);
      });
}

}  // namespace
}  // namespace meshtrain::cpu
