// CUDA SwiGLU kernels: y = silu(g) · u, and the fused backward (dg, du in one pass). Math in
// float (double for float64) with sigmoid written as 1 / (1 + exp(-g)), which saturates cleanly;
// in elementwise_loop.cuh's vectorised loop.
#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/elementwise_loop.cuh"

namespace meshtrain::cuda {
namespace {

template <typename A>
__device__ __forceinline__ A sigmoid(A g) {
  return A(1) / (A(1) + exp(-g));
}

// y = silu(g) · u.
struct SwigluForward {
  template <typename T>
  __device__ __forceinline__ void operator()(T& y, T g, T u) const {
    const acc_t<T> gv = to_acc(g);
    y = from_acc<T>(gv * sigmoid(gv) * to_acc(u));
  }
};

// d silu(g)/dg = s + g s (1 - s), s = sigmoid(g).
struct SwigluBackward {
  template <typename T>
  __device__ __forceinline__ void operator()(T& dg, T& du, T g, T u, T dy) const {
    using A = acc_t<T>;
    const A gv = to_acc(g), uv = to_acc(u), dyv = to_acc(dy);
    const A s = sigmoid(gv);
    const A silu = gv * s;
    dg = from_acc<T>(dyv * uv * (s + silu * (A(1) - s)));
    du = from_acc<T>(dyv * silu);
  }
};

template <typename T>
void forward(const T* g, const T* u, T* y, int64_t n, cudaStream_t s) {
  launch_elementwise("swiglu_forward", n, s, SwigluForward{}, Out<T>{y}, In<T>{g}, In<T>{u});
}

template <typename T>
void backward(const T* g, const T* u, const T* dy, T* dg, T* du, int64_t n, cudaStream_t s) {
  launch_elementwise("swiglu_backward", n, s, SwigluBackward{}, Out<T>{dg}, Out<T>{du}, In<T>{g},
                     In<T>{u}, In<T>{dy});
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
