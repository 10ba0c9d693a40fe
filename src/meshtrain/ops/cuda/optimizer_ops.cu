// CUDA optimizer kernels. sum_squares: the deterministic two-pass reduction, in float64.
// adamw_update: one fused pass over a flat parameter group (clip, decoupled decay, moments,
// bias correction, gradient reset, and the compute copy of the updated weights) with the CPU
// kernel's arithmetic in the tensor's dtype; the squared norm is read on the device, the learning
// rate and step arrive as launch arguments.
#include <cmath>
#include <type_traits>

#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/elementwise_loop.cuh"
#include "meshtrain/ops/cuda/reduce.cuh"
#include "meshtrain/ops/optimizer_ops.h"

namespace meshtrain::cuda {
namespace {

// Per-step constants, computed on the host in float64 exactly as the CPU kernel does.
template <typename T>
struct AdamWArgs {
  T step_size, decay, one_minus_b1, b2, one_minus_b2, eps, inv_bc2;
  double max_norm;
  bool reset_grad;
};

// torchtitan / torch.nn.utils.clip_grad_norm_: min(1, max_norm / (norm + 1e-6)).
__device__ __forceinline__ double clip_coefficient(double norm_sq, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double c = max_norm / (sqrt(norm_sq) + 1e-6);
  return c < 1.0 ? c : 1.0;
}

template <typename T>
__device__ __forceinline__ void adamw_one(T& p, T& g, T& m, T& v, T clip, const AdamWArgs<T>& a) {
  const T gi = g * clip;
  p *= a.decay;
  m += (gi - m) * a.one_minus_b1;
  v = v * a.b2 + a.one_minus_b2 * gi * gi;
  const T denom = sqrt(v) * a.inv_bc2 + a.eps;
  p -= a.step_size * m / denom;
  if (a.reset_grad) g = T(0);
}

// The per-element update with the clip coefficient, which every thread computes once from the
// squared norm on the device (bind, see elementwise_loop.cuh). Without a gradient reset the
// gradient is an input stream (read, never stored).
// A non-finite squared norm (a NaN or Inf gradient anywhere) skips the update, as the CPU kernel
// does: parameters and moments stay, the gradient is still reset.
// With a compute copy c (a fifth stream, written only): c = convert(p) after the update, the cast
// op's conversion. A skipped step writes it too, from the unchanged p: the copy already equals
// cast(p), so its bits stay, and the copy is never read here (2 bytes of traffic, not 4).
template <typename T, bool kResetGrad>
struct AdamWStep {
  T clip;
  bool skip;
  AdamWArgs<T> a;
  using Grad = std::conditional_t<kResetGrad, T&, T>;
  __device__ __forceinline__ void operator()(T& p, Grad g, T& m, T& v) const {
    if (skip) {
      if constexpr (kResetGrad) g = T(0);
      return;
    }
    adamw_one(p, g, m, v, clip, a);
  }
  template <typename C>
  __device__ __forceinline__ void operator()(T& p, Grad g, T& m, T& v, C& c) const {
    (*this)(p, g, m, v);
    c = convert<C>(p);
  }
};
template <typename T, bool kResetGrad>
struct AdamWOp {
  const double* norm_sq;
  AdamWArgs<T> a;
  __device__ __forceinline__ AdamWStep<T, kResetGrad> bind() const {
    const double nsq = norm_sq[0];
    return {T(clip_coefficient(nsq, a.max_norm)), !isfinite(nsq), a};
  }
};

// The launch over the four streams of the update and, if given, the compute copy's.
template <typename T, bool kResetGrad, typename G, typename... Copy>
void launch_adamw(int64_t n, cudaStream_t s, const AdamWOp<T, kResetGrad>& op, T* p, const G& g,
                  T* m, T* v, const Copy&... copy) {
  launch_elementwise("adamw_update", n, s, op, InOut<T>{p}, g, InOut<T>{m}, InOut<T>{v}, copy...);
}

// `o`: the slice's first element (p, g, m and v already point at it; the copy does not).
template <typename T, bool kResetGrad, typename G>
void adamw_with_copy(KernelContext& c, int64_t o, int64_t n, cudaStream_t s,
                     const AdamWOp<T, kResetGrad>& op, T* p, const G& g, T* m, T* v) {
  if (c.in.size() < 6) return launch_adamw(n, s, op, p, g, m, v);
  void* copy = c.in[5].raw();
  switch (c.in[5].dtype()) {
    case DType::kBF16:
      return launch_adamw(n, s, op, p, g, m, v, Out<bf16>{static_cast<bf16*>(copy) + o});
    case DType::kF32:
      return launch_adamw(n, s, op, p, g, m, v, Out<float>{static_cast<float*>(copy) + o});
    case DType::kF64:
      return launch_adamw(n, s, op, p, g, m, v, Out<double>{static_cast<double*>(copy) + o});
    default:
      MT_THROW(ValueError, "adamw_update (cuda): the compute copy must be a float dtype, found {}",
               c.in[5].dtype());
  }
}

template <typename T>
void adamw(KernelContext& c) {
  const Attrs& at = c.attrs();
  const ops::ElementRange r = ops::adamw_range(at, c.in[0].numel());
  const int64_t o = r.begin, n = r.count;
  if (n == 0) return;
  const double lr = c.scalar("lr_slot");
  const int64_t step = int64_t(c.scalar("step_slot"));
  const double b1 = at.f("beta1"), b2 = at.f("beta2");
  const double bc1 = 1.0 - std::pow(b1, double(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, double(step)));
  AdamWArgs<T> a{T(lr / bc1),
                 T(1.0 - lr * at.f("weight_decay")),
                 T(1.0 - b1),
                 T(b2),
                 T(1.0 - b2),
                 T(at.f("eps")),
                 T(1.0 / bc2_sqrt),
                 at.f("max_norm"),
                 at.b("reset_grad", true)};
  T* p = inout_ptr<T>(c, 0) + o;
  T* g = inout_ptr<T>(c, 1) + o;
  T* m = inout_ptr<T>(c, 2) + o;
  T* v = inout_ptr<T>(c, 3) + o;
  const double* norm_sq = in_ptr<double>(c, 4);
  const cudaStream_t s = stream_of(c);
  if (a.reset_grad)
    adamw_with_copy(c, o, n, s, AdamWOp<T, true>{norm_sq, a}, p, InOut<T>{g}, m, v);
  else
    adamw_with_copy(c, o, n, s, AdamWOp<T, false>{norm_sq, a}, p, In<T>{g}, m, v);
}

MT_REGISTER_OPS {
  // Scratch: the float64 partials of the deterministic two-pass reduction.
  add_cuda_kernel(
      "sum_squares",
      [](KernelContext& c) {
        MT_DISPATCH_CUDA_FLOAT(c.in[0].dtype(), "sum_squares", [&] {
          launch_reduce(in_ptr<scalar_t>(c, 0), c.in[0].numel(),
                        static_cast<double*>(c.workspace.raw()), out_ptr<double>(c, 0), SquareOp{},
                        stream_of(c));
        });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs&) {
        return reduce_workspace_bytes(in[0].numel());
      });
  add_cuda_kernel("adamw_update", [](KernelContext& c) {
    switch (c.in[0].dtype()) {
      case DType::kF32: return adamw<float>(c);
      case DType::kF64: return adamw<double>(c);
      default:
        MT_THROW(ValueError,
                 "adamw_update (cuda): master weights must be float32 or float64, found {}",
                 c.in[0].dtype());
    }
  });
}

}  // namespace
}  // namespace meshtrain::cuda
