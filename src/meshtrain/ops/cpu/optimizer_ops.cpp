// CPU kernels of the optimizer ops. AdamW follows torch.optim.AdamW's arithmetic: decoupled decay
// p *= 1 - lr·wd, m ← m + (1−β1)(g − m), v ← β2 v + (1−β2) g², p −= lr/(1−β1ᵗ) · m / (√v/√(1−β2ᵗ) +
// ε). A non-finite global norm (a NaN or Inf gradient anywhere) skips the update: parameters and
// moments stay as they were, the gradient is still reset (the trainer stops or skips the step).
#include "meshtrain/ops/optimizer_ops.h"

#include <cmath>
#include <cstring>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

template <typename T>
void adamw(T* p, T* g, T* m, T* v, int64_t n, double lr, double b1, double b2, double eps,
           double wd, double clip, int64_t step, bool reset_grad) {
  const double bc1 = 1.0 - std::pow(b1, double(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, double(step)));
  const T step_size = T(lr / bc1);
  const T decay = T(1.0 - lr * wd);
  const T tb1 = T(1.0 - b1), tb2 = T(b2), ob2 = T(1.0 - b2), teps = T(eps), tclip = T(clip);
  const T inv_bc2 = T(1.0 / bc2_sqrt);
  for (int64_t i = 0; i < n; ++i) {
    T gi = g[i] * tclip;
    p[i] *= decay;
    m[i] += (gi - m[i]) * tb1;
    v[i] = v[i] * tb2 + ob2 * gi * gi;
    T denom = std::sqrt(v[i]) * inv_bc2 + teps;
    p[i] -= step_size * m[i] / denom;
    if (reset_grad) g[i] = T(0);
  }
}

MT_REGISTER_OPS {
  add_cpu_kernel("sum_squares", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "sum_squares", [&] {
      const scalar_t* x = in_ptr<scalar_t>(c, 0);
      double acc = 0;
      for (int64_t i = 0, n = c.in[0].numel(); i < n; ++i) acc += double(x[i]) * double(x[i]);
      out_ptr<double>(c, 0)[0] = acc;
    });
  });
  add_cpu_kernel("adamw_update", [](KernelContext& c) {
    const Attrs& a = c.attrs();
    const double norm_sq = in_ptr<double>(c, 4)[0];
    if (!std::isfinite(norm_sq)) {
      if (a.b("reset_grad", true)) std::memset(c.in[1].raw(), 0, c.in[1].nbytes());
      return;
    }
    double norm = std::sqrt(norm_sq);
    double lr = c.scalar("lr_slot");
    int64_t step = int64_t(c.scalar("step_slot"));
    double clip = ops::clip_coefficient(norm, a.f("max_norm"));
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "adamw_update", [&] {
      adamw(inout_ptr<scalar_t>(c, 0), inout_ptr<scalar_t>(c, 1), inout_ptr<scalar_t>(c, 2),
            inout_ptr<scalar_t>(c, 3), c.in[0].numel(), lr, a.f("beta1"), a.f("beta2"), a.f("eps"),
            a.f("weight_decay"), clip, step, a.b("reset_grad", true));
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
