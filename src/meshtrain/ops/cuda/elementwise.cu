// CUDA kernels of the elementwise and structural ops: fill, add, mul, scale, cast and cast_into
// (every dtype pair, rounding like the CPU's BFloat16), reshape and grad_cast (views: nothing to
// do), sum and expand_scalar, and accumulate (float32/float64 += float32/float64/bf16).
// Elementwise, cast and accumulate run in elementwise_loop.cuh's vectorised loop.
#include <cstring>

#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/elementwise_loop.cuh"
#include "meshtrain/ops/cuda/reduce.cuh"

namespace meshtrain::cuda {
namespace {

// out = op(a, b) / op(a) in the accumulation type, rounded once.
template <typename Op>
struct Map2 {
  Op op;
  template <typename T>
  __device__ __forceinline__ void operator()(T& out, T a, T b) const {
    out = from_acc<T>(op(to_acc(a), to_acc(b)));
  }
};
template <typename Op>
struct Map1 {
  Op op;
  template <typename T>
  __device__ __forceinline__ void operator()(T& out, T a) const {
    out = from_acc<T>(op(to_acc(a)));
  }
};

struct AddOp {
  template <typename A>
  __device__ A operator()(A x, A y) const {
    return x + y;
  }
};
struct MulOp {
  template <typename A>
  __device__ A operator()(A x, A y) const {
    return x * y;
  }
};
// Scales in the accumulation type: the factor is double for float64 tensors, float otherwise
// (the CPU kernel multiplies by scalar_t(factor) in the tensor's own type).
struct ScaleOp {
  double f;
  __device__ float operator()(float x) const { return x * float(f); }
  __device__ double operator()(double x) const { return x * f; }
};

template <typename T, typename Op>
void launch_map2(const T* a, const T* b, T* out, int64_t n, Op op, cudaStream_t s) {
  launch_elementwise("elementwise map2", n, s, Map2<Op>{op}, Out<T>{out}, In<T>{a}, In<T>{b});
}

template <typename T, typename Op>
void launch_map1(const T* a, T* out, int64_t n, Op op, cudaStream_t s) {
  launch_elementwise("elementwise map1", n, s, Map1<Op>{op}, Out<T>{out}, In<T>{a});
}

// ---- cast: C++ conversions as the CPU kernel does them (convert, elementwise_loop.cuh) --------
struct CastOp {
  template <typename D, typename S>
  __device__ __forceinline__ void operator()(D& d, S s) const {
    d = convert<D>(s);
  }
};

template <typename S, typename D>
void launch_cast(const void* src, void* dst, int64_t n, cudaStream_t s) {
  launch_elementwise("cast", n, s, CastOp{}, Out<D>{static_cast<D*>(dst)},
                     In<S>{static_cast<const S*>(src)});
}

template <typename S>
void cast_from(const Tensor& src, const Tensor& dst, cudaStream_t s) {
  const int64_t n = src.numel();
  switch (dst.dtype()) {
    case DType::kF32: return launch_cast<S, float>(src.raw(), dst.raw(), n, s);
    case DType::kF64: return launch_cast<S, double>(src.raw(), dst.raw(), n, s);
    case DType::kBF16: return launch_cast<S, bf16>(src.raw(), dst.raw(), n, s);
    case DType::kI32: return launch_cast<S, int32_t>(src.raw(), dst.raw(), n, s);
    case DType::kI64: return launch_cast<S, int64_t>(src.raw(), dst.raw(), n, s);
  }
}

void cast_any(const Tensor& src, const Tensor& dst, cudaStream_t s) {
  if (src.numel() == 0) return;
  switch (src.dtype()) {
    case DType::kF32: return cast_from<float>(src, dst, s);
    case DType::kF64: return cast_from<double>(src, dst, s);
    case DType::kBF16: return cast_from<bf16>(src, dst, s);
    case DType::kI32: return cast_from<int32_t>(src, dst, s);
    case DType::kI64: return cast_from<int64_t>(src, dst, s);
  }
}

// ---- fill: the element's bit pattern is computed on the host exactly as the CPU kernel does ----
template <typename U>
__global__ void fill_bits_kernel(U* __restrict__ out, U bits, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = bits;
}

template <typename U>
void launch_fill_bits(void* out, U bits, int64_t n, cudaStream_t s) {
  fill_bits_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<U*>(out), bits, n);
  CUDA_CHECK_LAUNCH("fill");
}

void fill_any(const Tensor& out, double v, cudaStream_t s) {
  const int64_t n = out.numel();
  if (n == 0) return;
  switch (out.dtype()) {
    case DType::kF32: {
      float f = float(v);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      return launch_fill_bits<uint32_t>(out.raw(), b, n, s);
    }
    case DType::kF64: {
      uint64_t b;
      std::memcpy(&b, &v, 8);
      return launch_fill_bits<uint64_t>(out.raw(), b, n, s);
    }
    case DType::kBF16:
      return launch_fill_bits<uint16_t>(out.raw(), BFloat16::from_float(float(v)), n, s);
    case DType::kI32: return launch_fill_bits<uint32_t>(out.raw(), uint32_t(int32_t(v)), n, s);
    case DType::kI64: return launch_fill_bits<uint64_t>(out.raw(), uint64_t(int64_t(v)), n, s);
  }
}

// ---- expand_scalar and accumulate ---------------------------------------------------------
template <typename T>
__global__ void expand_scalar_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t n) {
  const T v = x[0];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = v;
}

// dst = src (overwrite: dst is not read) or dst += src, in dst's type.
struct AssignOp {
  template <typename D, typename S>
  __device__ __forceinline__ void operator()(D& d, S s) const {
    d = D(to_acc(s));
  }
};
struct AddToOp {
  template <typename D, typename S>
  __device__ __forceinline__ void operator()(D& d, S s) const {
    d += D(to_acc(s));
  }
};

template <typename D, typename S>
void launch_accumulate_from(D* d, const void* src, int64_t n, bool overwrite, cudaStream_t s) {
  const In<S> from{static_cast<const S*>(src)};
  if (overwrite)
    launch_elementwise("accumulate", n, s, AssignOp{}, Out<D>{d}, from);
  else
    launch_elementwise("accumulate", n, s, AddToOp{}, InOut<D>{d}, from);
}

template <typename D>
void launch_accumulate(const Tensor& dst, const Tensor& src, bool overwrite, cudaStream_t s) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  D* d = static_cast<D*>(dst.raw());
  switch (src.dtype()) {
    case DType::kF32: launch_accumulate_from<D, float>(d, src.raw(), n, overwrite, s); break;
    case DType::kF64: launch_accumulate_from<D, double>(d, src.raw(), n, overwrite, s); break;
    case DType::kBF16: launch_accumulate_from<D, bf16>(d, src.raw(), n, overwrite, s); break;
    default:
      MT_THROW(ValueError, "accumulate (cuda): source must be floating, found {}", src.dtype());
  }
}

MT_REGISTER_OPS {
  add_cuda_kernel("fill",
                  [](KernelContext& c) { fill_any(c.out[0], c.attrs().f("value"), stream_of(c)); });
  add_cuda_kernel("add", [](KernelContext& c) {
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "add", [&] {
      launch_map2(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                  c.out[0].numel(), AddOp{}, stream_of(c));
    });
  });
  add_cuda_kernel("mul", [](KernelContext& c) {
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "mul", [&] {
      launch_map2(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0),
                  c.out[0].numel(), MulOp{}, stream_of(c));
    });
  });
  add_cuda_kernel("scale", [](KernelContext& c) {
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "scale", [&] {
      launch_map1(in_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 0), c.out[0].numel(),
                  ScaleOp{c.attrs().f("factor")}, stream_of(c));
    });
  });
  add_cuda_kernel("cast", [](KernelContext& c) { cast_any(c.in[0], c.out[0], stream_of(c)); });
  // Into a persistent destination (a master's compute copy): the same launch as cast.
  add_cuda_kernel("cast_into", [](KernelContext& c) { cast_any(c.in[1], c.in[0], stream_of(c)); });
  add_cuda_kernel("reshape", [](KernelContext&) {});    // a view: shares its input's bytes
  add_cuda_kernel("grad_cast", [](KernelContext&) {});  // a view in forward
  // Scratch: the float64 partials of the deterministic two-pass reduction.
  add_cuda_kernel(
      "sum",
      [](KernelContext& c) {
        MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "sum", [&] {
          launch_reduce(in_ptr<scalar_t>(c, 0), c.in[0].numel(),
                        static_cast<double*>(c.workspace.raw()), out_ptr<scalar_t>(c, 0),
                        IdentityOp{}, stream_of(c));
        });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs&) {
        return reduce_workspace_bytes(in[0].numel());
      });
  add_cuda_kernel("expand_scalar", [](KernelContext& c) {
    const int64_t n = c.out[0].numel();
    if (n == 0) return;
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "expand_scalar", [&] {
      expand_scalar_kernel<<<grid_for(n, 256), 256, 0, stream_of(c)>>>(in_ptr<scalar_t>(c, 0),
                                                                       out_ptr<scalar_t>(c, 0), n);
      CUDA_CHECK_LAUNCH("expand_scalar");
    });
  });
  add_cuda_kernel("accumulate", [](KernelContext& c) {
    switch (c.in[0].dtype()) {
      case DType::kF32:
        return launch_accumulate<float>(c.in[0], c.in[1], c.attrs().b("overwrite"), stream_of(c));
      case DType::kF64:
        return launch_accumulate<double>(c.in[0], c.in[1], c.attrs().b("overwrite"), stream_of(c));
      default:
        MT_THROW(ValueError, "accumulate (cuda): destination must be float32 or float64, found {}",
                 c.in[0].dtype());
    }
  });
}

}  // namespace
}  // namespace meshtrain::cuda
