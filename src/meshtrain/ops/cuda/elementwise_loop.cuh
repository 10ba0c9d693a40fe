// The vectorised grid-stride loop of the element-wise CUDA kernels (arithmetic, cast, accumulate,
// SwiGLU, AdamW): each step of a thread moves V consecutive elements of every stream as one
// access (16 bytes of the narrowest stream's type) when every pointer is aligned for it, else one
// element. Rule: the per-element function is the same on both paths and elements never interact,
// so the vector width never changes a result.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {

// One element converted as the cast op converts it, as the CPU kernel does (to bf16 through float,
// rounding to nearest even); AdamW's compute copy uses the same conversion.
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

// A read-only load through the non-coherent path (ld.global.nc, as the `const __restrict__`
// pointers of the per-kernel loops got): an In stream is never written while the kernel runs.
template <typename P>
__device__ __forceinline__ P load_nc(const P* p) {
  P v;
  if constexpr (sizeof(P) % 16 == 0) {  // a wider stream of a cast or accumulate: 16 bytes a load
    uint4 b[sizeof(P) / 16];
#pragma unroll
    for (size_t j = 0; j < sizeof(P) / 16; ++j) b[j] = __ldg(reinterpret_cast<const uint4*>(p) + j);
    memcpy(&v, b, sizeof(P));
  } else if constexpr (sizeof(P) == 8) {
    const unsigned long long b = __ldg(reinterpret_cast<const unsigned long long*>(p));
    memcpy(&v, &b, sizeof(P));
  } else if constexpr (sizeof(P) == 4) {
    const unsigned int b = __ldg(reinterpret_cast<const unsigned int*>(p));
    memcpy(&v, &b, sizeof(P));
  } else {
    static_assert(sizeof(P) == 2, "load_nc: 2, 4, 8 or a multiple of 16 bytes");
    const unsigned short b = __ldg(reinterpret_cast<const unsigned short*>(p));
    memcpy(&v, &b, sizeof(P));
  }
  return v;
}

// The streams of a kernel, by what the per-element function does with them: In (reads), Out
// (writes) and InOut (reads and writes). The function takes one argument per stream, in the
// launch's order: a value for In, a reference for Out and InOut.
template <typename T>
struct In {
  using type = T;
  const T* p;
  bool aligned(int v) const { return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * v) == 0; }
  template <int V>
  __device__ __forceinline__ Pack<T, V> load(int64_t i) const {
    return load_nc(reinterpret_cast<const Pack<T, V>*>(p) + i);
  }
  template <int V>
  __device__ __forceinline__ void store(int64_t, const Pack<T, V>&) const {}
  __device__ __forceinline__ T at(int64_t i) const { return load_nc(p + i); }
};

template <typename T>
struct Out {
  using type = T;
  T* p;
  bool aligned(int v) const { return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * v) == 0; }
  template <int V>
  __device__ __forceinline__ Pack<T, V> load(int64_t) const {
    return {};  // the function writes every element before the store (the zeros compile away)
  }
  template <int V>
  __device__ __forceinline__ void store(int64_t i, const Pack<T, V>& v) const {
    reinterpret_cast<Pack<T, V>*>(p)[i] = v;
  }
  __device__ __forceinline__ T& at(int64_t i) const { return p[i]; }
};

template <typename T>
struct InOut {
  using type = T;
  T* p;
  bool aligned(int v) const { return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * v) == 0; }
  template <int V>
  __device__ __forceinline__ Pack<T, V> load(int64_t i) const {
    return reinterpret_cast<const Pack<T, V>*>(p)[i];
  }
  template <int V>
  __device__ __forceinline__ void store(int64_t i, const Pack<T, V>& v) const {
    reinterpret_cast<Pack<T, V>*>(p)[i] = v;
  }
  __device__ __forceinline__ T& at(int64_t i) const { return p[i]; }
};

// A function with per-thread set-up has `bind()`, called once per thread before the loop, which
// returns the per-element function (AdamW reads the global norm there).
template <typename Op>
__device__ __forceinline__ auto bind_op(const Op& op) {
  if constexpr (requires { op.bind(); })
    return op.bind();
  else
    return op;
}

template <int V, typename Op, typename... S>
__global__ void elementwise_kernel(int64_t n, Op op, S... s) {
  const auto f = bind_op(op);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / V;
  for (int64_t i = tid; i < nvec; i += stride) {
    [&](auto... pack) {
#pragma unroll
      for (int k = 0; k < V; ++k) f(pack.v[k]...);
      (s.template store<V>(i, pack), ...);
    }(s.template load<V>(i)...);
  }
  for (int64_t i = nvec * V + tid; i < n; i += stride) f(s.at(i)...);
}

// Runs `op` over the n elements of the streams on `stream`; `name` is the launch's name in errors.
template <typename Op, typename... S>
void launch_elementwise(const char* name, int64_t n, cudaStream_t stream, const Op& op,
                        const S&... s) {
  if (n == 0) return;
  constexpr int V = int(16 / std::min({sizeof(typename S::type)...}));
  constexpr int threads = 256;
  if ((s.aligned(V) && ...))
    elementwise_kernel<V><<<grid_for(n / V + 1, threads), threads, 0, stream>>>(n, op, s...);
  else
    elementwise_kernel<1><<<grid_for(n, threads), threads, 0, stream>>>(n, op, s...);
  CUDA_CHECK_LAUNCH(name);
}

}  // namespace meshtrain::cuda
