// CUDA SwiGLU kernels: y = silu(g) · u, and the fused backward (dg, du in one pass). Math in
// float (double for float64) with sigmoid written as 1 / (1 + exp(-g)), which saturates cleanly;
// 16-byte accesses when every pointer is aligned.
#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {
namespace {

template <typename A>
__device__ __forceinline__ A sigmoid(A g) {
  return A(1) / (A(1) + exp(-g));
}

template <int V, typename T>
__global__ void swiglu_forward_kernel(const T* __restrict__ g, const T* __restrict__ u,
                                      T* __restrict__ y, int64_t n) {
  using A = acc_t<T>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    Pack<T, V> pg = reinterpret_cast<const Pack<T, V>*>(g)[i];
    Pack<T, V> pu = reinterpret_cast<const Pack<T, V>*>(u)[i];
    Pack<T, V> py;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A gv = to_acc(pg.v[k]);
      py.v[k] = from_acc<T>(gv * sigmoid(gv) * to_acc(pu.v[k]));
    }
    reinterpret_cast<Pack<T, V>*>(y)[i] = py;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) {
    const A gv = to_acc(g[i]);
    y[i] = from_acc<T>(gv * sigmoid(gv) * to_acc(u[i]));
  }
}

// d silu(g)/dg = s + g s (1 - s), s = sigmoid(g).
template <typename A>
struct SwigluGrad {
  A dg, du;
};
template <typename A>
__device__ __forceinline__ SwigluGrad<A> swiglu_grad(A gv, A uv, A dyv) {
  const A s = sigmoid(gv);
  const A silu = gv * s;
  return {dyv * uv * (s + silu * (A(1) - s)), dyv * silu};
}

template <int V, typename T>
__global__ void swiglu_backward_kernel(const T* __restrict__ g, const T* __restrict__ u,
                                       const T* __restrict__ dy, T* __restrict__ dg,
                                       T* __restrict__ du, int64_t n) {
  using A = acc_t<T>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    Pack<T, V> pg = reinterpret_cast<const Pack<T, V>*>(g)[i];
    Pack<T, V> pu = reinterpret_cast<const Pack<T, V>*>(u)[i];
    Pack<T, V> pd = reinterpret_cast<const Pack<T, V>*>(dy)[i];
    Pack<T, V> og, ou;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      SwigluGrad<A> r = swiglu_grad(to_acc(pg.v[k]), to_acc(pu.v[k]), to_acc(pd.v[k]));
      og.v[k] = from_acc<T>(r.dg);
      ou.v[k] = from_acc<T>(r.du);
    }
    reinterpret_cast<Pack<T, V>*>(dg)[i] = og;
    reinterpret_cast<Pack<T, V>*>(du)[i] = ou;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) {
    SwigluGrad<A> r = swiglu_grad(to_acc(g[i]), to_acc(u[i]), to_acc(dy[i]));
    dg[i] = from_acc<T>(r.dg);
    du[i] = from_acc<T>(r.du);
  }
}

template <typename T>
void forward(const T* g, const T* u, T* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  constexpr int V = 16 / int(sizeof(T));
  if (aligned16(g) && aligned16(u) && aligned16(y))
    swiglu_forward_kernel<V><<<grid_for(n / V + 1, 256), 256, 0, s>>>(g, u, y, n);
  else
    swiglu_forward_kernel<1><<<grid_for(n, 256), 256, 0, s>>>(g, u, y, n);
  CUDA_CHECK_LAUNCH("swiglu_forward");
}

template <typename T>
void backward(const T* g, const T* u, const T* dy, T* dg, T* du, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  constexpr int V = 16 / int(sizeof(T));
  if (aligned16(g) && aligned16(u) && aligned16(dy) && aligned16(dg) && aligned16(du))
    swiglu_backward_kernel<V><<<grid_for(n / V + 1, 256), 256, 0, s>>>(g, u, dy, dg, du, n);
  else
    swiglu_backward_kernel<1><<<grid_for(n, 256), 256, 0, s>>>(g, u, dy, dg, du, n);
  CUDA_CHECK_LAUNCH("swiglu_backward");
}

MT_REGISTER_OPS {
  add_cuda_kernel("swiglu", [](KernelContext& c) {
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "swiglu", [&] {
      forward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
              c.out[0].numel(), stream_of(c));
    });
  });
  add_cuda_kernel("swiglu_backward", [](KernelContext& c) {
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "swiglu_backward", [&] {
      backward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<scalar_t>(c, 2),
               out_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 1), c.out[0].numel(), stream_of(c));
    });
  });
}

}  // namespace
}  // namespace meshtrain::cuda
