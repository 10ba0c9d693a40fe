// CPU SwiGLU kernels: y = silu(g) * u with silu(g) = g * sigmoid(g). The sigmoid is written as
// 1 / (1 + exp(-g)), which saturates cleanly to 0 or 1 for large |g| (no inf/inf).
#include <cmath>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

template <typename T>
T sigmoid(T g) {
  return T(1) / (T(1) + std::exp(-g));
}

template <typename T>
void swiglu_forward(const T* g, const T* u, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] * sigmoid(g[i]) * u[i];
}

// d silu(g)/dg = s + g s (1 - s), s = sigmoid(g).
template <typename T>
void swiglu_backward(const T* g, const T* u, const T* dy, T* dg, T* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = sigmoid(g[i]);
    const T silu = g[i] * s;
    dg[i] = dy[i] * u[i] * (s + silu * (T(1) - s));
    du[i] = dy[i] * silu;
  }
}

MT_REGISTER_OPS {
  add_cpu_kernel("swiglu", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "swiglu", [&] {
      swiglu_forward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                     c.out[0].numel());
    });
  });
  add_cpu_kernel("swiglu_backward", [](KernelContext& c) {
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "swiglu_backward", [&] {
      swiglu_backward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<scalar_t>(c, 2),
                      out_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 1), c.out[0].numel());
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
