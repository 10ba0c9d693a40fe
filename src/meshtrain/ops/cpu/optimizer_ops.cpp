// CPU kernels of the optimizer ops. AdamW follows torch.optim.AdamW's arithmetic: decoupled decay
// p *= 1 - lr·wd, m ← m + (1−β1)(g − m), v ← β2 v + (1−β2) g², p −= lr/(1−β1ᵗ) · m / (√v/√(1−β2ᵗ) +
// ε), then the compute copy (if any) = cast(p) as the cast kernel converts. A non-finite global
// norm (a NaN or Inf gradient anywhere) skips the update: parameters, moments and the copy stay
// as they were, the gradient is still reset (the trainer stops or skips the step).
#include "meshtrain/ops/optimizer_ops.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

// The compute copy's element: the cast kernel's conversion (to bfloat16 through float).
template <typename C, typename T>
C to_compute(T x) {
  if constexpr (std::is_same_v<C, BFloat16>)
    return BFloat16(float(x));
  else
    return C(x);
}

// C = void: no compute copy.
template <typename T, typename C>
void adamw(T* p, T* g, T* m, T* v, C* copy, int64_t n, double lr, double b1, double b2, double eps,
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
    if constexpr (!std::is_void_v<C>) copy[i] = to_compute<C>(p[i]);
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
    const ops::ElementRange r = ops::adamw_range(a, c.in[0].numel());
    const size_t elem = dtype_size(c.in[0].dtype());
    const double norm_sq = in_ptr<double>(c, 4)[0];
    if (!std::isfinite(norm_sq)) {
      if (a.b("reset_grad", true))
        std::memset(static_cast<char*>(c.in[1].raw()) + size_t(r.begin) * elem, 0,
                    size_t(r.count) * elem);
      return;
    }
    double norm = std::sqrt(norm_sq);
    double lr = c.scalar("lr_slot");
    int64_t step = int64_t(c.scalar("step_slot"));
    double clip = ops::clip_coefficient(norm, a.f("max_norm"));
    MT_DISPATCH_FLOAT(c.in[0].dtype(), "adamw_update", [&] {
      auto run = [&](auto* copy) {
        const int64_t o = r.begin;
        adamw(inout_ptr<scalar_t>(c, 0) + o, inout_ptr<scalar_t>(c, 1) + o,
              inout_ptr<scalar_t>(c, 2) + o, inout_ptr<scalar_t>(c, 3) + o, copy, r.count, lr,
              a.f("beta1"), a.f("beta2"), a.f("eps"), a.f("weight_decay"), clip, step,
              a.b("reset_grad", true));
      };
      if (c.in.size() < 6) return run(static_cast<void*>(nullptr));
      switch (c.in[5].dtype()) {
        case DType::kF32: return run(static_cast<float*>(c.in[5].raw()) + r.begin);
        case DType::kF64: return run(static_cast<double*>(c.in[5].raw()) + r.begin);
        case DType::kBF16: return run(static_cast<BFloat16*>(c.in[5].raw()) + r.begin);
        default:
          MT_THROW(ValueError, "adamw_update: the compute copy must be a float dtype, found {}",
                   c.in[5].dtype());
      }
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
