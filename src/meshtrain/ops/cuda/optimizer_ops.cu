// CUDA optimizer kernels. sum_squares: the deterministic two-pass reduction, in float64.
// adamw_update: one fused pass over a flat parameter group (clip, decoupled decay, moments,
// bias correction, gradient reset) with the CPU kernel's arithmetic in the tensor's dtype; the
// squared norm is read on the device, the learning rate and step arrive as launch arguments.
#include <cmath>

#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/reduce.cuh"

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

template <int V, typename T>
__global__ void adamw_kernel(T* __restrict__ p, T* __restrict__ g, T* __restrict__ m,
                             T* __restrict__ v, int64_t n, const double* __restrict__ norm_sq,
                             const AdamWArgs<T> a) {
  const T clip = T(clip_coefficient(norm_sq[0], a.max_norm));
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    Pack<T, V> pp = reinterpret_cast<Pack<T, V>*>(p)[i];
    Pack<T, V> pg = reinterpret_cast<Pack<T, V>*>(g)[i];
    Pack<T, V> pm = reinterpret_cast<Pack<T, V>*>(m)[i];
    Pack<T, V> pv = reinterpret_cast<Pack<T, V>*>(v)[i];
#pragma unroll
    for (int k = 0; k < V; ++k) adamw_one(pp.v[k], pg.v[k], pm.v[k], pv.v[k], clip, a);
    reinterpret_cast<Pack<T, V>*>(p)[i] = pp;
    if (a.reset_grad) reinterpret_cast<Pack<T, V>*>(g)[i] = pg;
    reinterpret_cast<Pack<T, V>*>(m)[i] = pm;
    reinterpret_cast<Pack<T, V>*>(v)[i] = pv;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) adamw_one(p[i], g[i], m[i], v[i], clip, a);
}

template <typename T>
void adamw(KernelContext& c) {
  const Attrs& at = c.attrs();
  const int64_t n = c.in[0].numel();
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
  T* p = inout_ptr<T>(c, 0);
  T* g = inout_ptr<T>(c, 1);
  T* m = inout_ptr<T>(c, 2);
  T* v = inout_ptr<T>(c, 3);
  const double* norm_sq = in_ptr<double>(c, 4);
  constexpr int V = 16 / int(sizeof(T));
  const cudaStream_t s = stream_of(c);
  if (aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v))
    adamw_kernel<V><<<grid_for(n / V + 1, 256), 256, 0, s>>>(p, g, m, v, n, norm_sq, a);
  else
    adamw_kernel<1><<<grid_for(n, 256), 256, 0, s>>>(p, g, m, v, n, norm_sq, a);
  CUDA_CHECK_LAUNCH("adamw_update");
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
