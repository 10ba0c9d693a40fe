// CUDA kernels of the elementwise and structural ops: fill, add, mul, scale, cast (every dtype
// pair, rounding like the CPU's BFloat16), reshape and grad_cast (views: nothing to do), sum and
// expand_scalar, and accumulate (float32/float64 += float32/float64/bf16). Elementwise, cast and
// accumulate kernels use vector accesses (16 bytes of the narrower type) when the pointers allow.
#include <cstring>

#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/reduce.cuh"

namespace meshtrain::cuda {
namespace {

// out[i] = op(a[i], b[i]) in the accumulation type, rounded once.
template <int V, typename T, typename Op>
__global__ void map2_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                            int64_t n, Op op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    Pack<T, V> pa = reinterpret_cast<const Pack<T, V>*>(a)[i];
    Pack<T, V> pb = reinterpret_cast<const Pack<T, V>*>(b)[i];
    Pack<T, V> po;
#pragma unroll
    for (int k = 0; k < V; ++k) po.v[k] = from_acc<T>(op(to_acc(pa.v[k]), to_acc(pb.v[k])));
    reinterpret_cast<Pack<T, V>*>(out)[i] = po;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride)
    out[i] = from_acc<T>(op(to_acc(a[i]), to_acc(b[i])));
}

template <int V, typename T, typename Op>
__global__ void map1_kernel(const T* __restrict__ a, T* __restrict__ out, int64_t n, Op op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    Pack<T, V> pa = reinterpret_cast<const Pack<T, V>*>(a)[i];
    Pack<T, V> po;
#pragma unroll
    for (int k = 0; k < V; ++k) po.v[k] = from_acc<T>(op(to_acc(pa.v[k])));
    reinterpret_cast<Pack<T, V>*>(out)[i] = po;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) out[i] = from_acc<T>(op(to_acc(a[i])));
}

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
  if (n == 0) return;
  constexpr int V = 16 / int(sizeof(T));
  const int threads = 256;
  if (aligned16(a) && aligned16(b) && aligned16(out))
    map2_kernel<V><<<grid_for(n / V + 1, threads), threads, 0, s>>>(a, b, out, n, op);
  else
    map2_kernel<1><<<grid_for(n, threads), threads, 0, s>>>(a, b, out, n, op);
  CUDA_CHECK_LAUNCH("elementwise map2");
}

template <typename T, typename Op>
void launch_map1(const T* a, T* out, int64_t n, Op op, cudaStream_t s) {
  if (n == 0) return;
  constexpr int V = 16 / int(sizeof(T));
  const int threads = 256;
  if (aligned16(a) && aligned16(out))
    map1_kernel<V><<<grid_for(n / V + 1, threads), threads, 0, s>>>(a, out, n, op);
  else
    map1_kernel<1><<<grid_for(n, threads), threads, 0, s>>>(a, out, n, op);
  CUDA_CHECK_LAUNCH("elementwise map1");
}

// ---- cast: C++ conversions as the CPU kernel does them (to bf16 through float) --------------
template <typename D, typename S>
__device__ __forceinline__ D convert(S s) {
  if constexpr (std::is_same_v<D, bf16> && std::is_same_v<S, bf16>) {
    return s;
  } else if constexpr (std::is_same_v<D, bf16>) {
    return __float2bfloat16_rn(float(s));
  } else if constexpr (std::is_same_v<S, bf16>) {
    return D(__bfloat162float(s));
  } else {
    return D(s);
  }
}

// Elements per vector access of a kernel reading S and writing D: 16 bytes of the narrower type
// (a bf16 -> fp32 pass moves 16 bytes in and 32 out per step).
template <typename S, typename D>
constexpr int kPairVec = 16 / int(sizeof(S) < sizeof(D) ? sizeof(S) : sizeof(D));

template <int V, typename S, typename D>
bool pair_aligned(const void* src, const void* dst) {
  return V > 1 && reinterpret_cast<uintptr_t>(src) % (sizeof(S) * V) == 0 &&
         reinterpret_cast<uintptr_t>(dst) % (sizeof(D) * V) == 0;
}

template <int V, typename S, typename D>
__global__ void cast_kernel(const S* __restrict__ src, D* __restrict__ dst, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    const Pack<S, V> ps = reinterpret_cast<const Pack<S, V>*>(src)[i];
    Pack<D, V> pd;
#pragma unroll
    for (int k = 0; k < V; ++k) pd.v[k] = convert<D>(ps.v[k]);
    reinterpret_cast<Pack<D, V>*>(dst)[i] = pd;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) dst[i] = convert<D>(src[i]);
}

template <typename S, typename D>
void launch_cast(const void* src, void* dst, int64_t n, cudaStream_t s) {
  constexpr int V = kPairVec<S, D>;
  const S* a = static_cast<const S*>(src);
  D* b = static_cast<D*>(dst);
  if (pair_aligned<V, S, D>(src, dst))
    cast_kernel<V><<<grid_for(n / V + 1, 256), 256, 0, s>>>(a, b, n);
  else
    cast_kernel<1><<<grid_for(n, 256), 256, 0, s>>>(a, b, n);
  CUDA_CHECK_LAUNCH("cast");
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

template <int V, typename D, typename S>
__global__ void accumulate_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n,
                                  bool overwrite) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    const Pack<S, V> ps = reinterpret_cast<const Pack<S, V>*>(src)[i];
    Pack<D, V> pd;
    if (overwrite) {
#pragma unroll
      for (int k = 0; k < V; ++k) pd.v[k] = D(to_acc(ps.v[k]));
    } else {
      pd = reinterpret_cast<const Pack<D, V>*>(dst)[i];
#pragma unroll
      for (int k = 0; k < V; ++k) pd.v[k] += D(to_acc(ps.v[k]));
    }
    reinterpret_cast<Pack<D, V>*>(dst)[i] = pd;
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride)
    dst[i] = overwrite ? D(to_acc(src[i])) : dst[i] + D(to_acc(src[i]));
}

template <typename D, typename S>
void launch_accumulate_from(D* d, const void* src, int64_t n, bool overwrite, cudaStream_t s) {
  constexpr int V = kPairVec<S, D>;
  const S* a = static_cast<const S*>(src);
  if (pair_aligned<V, S, D>(src, d))
    accumulate_kernel<V><<<grid_for(n / V + 1, 256), 256, 0, s>>>(d, a, n, overwrite);
  else
    accumulate_kernel<1><<<grid_for(n, 256), 256, 0, s>>>(d, a, n, overwrite);
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
  CUDA_CHECK_LAUNCH("accumulate");
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
