// The row math of the CUDA cross-entropy kernels (cross_entropy and linear_cross_entropy): an
// online logsumexp over one row per block, each thread keeping a running (max, Σexp) and the block
// combining them in a fixed tree order, so the result is bitwise repeatable.
#pragma once

#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {

constexpr int kRowThreads = 256;

// Online logsumexp state: m is the running max, s = Σ exp(x - m).
template <typename A>
struct MaxSum {
  A m, s;
};

template <typename A>
__device__ __forceinline__ MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b) {
  if (a.s == A(0)) return b;
  if (b.s == A(0)) return a;
  const A m = max(a.m, b.m);
  return {m, a.s * exp(a.m - m) + b.s * exp(b.m - m)};
}

template <typename A>
__device__ __forceinline__ void push(MaxSum<A>& st, A x) {
  if (st.s == A(0)) {
    st = {x, A(1)};
  } else if (x > st.m) {
    st.s = st.s * exp(st.m - x) + A(1);
    st.m = x;
  } else {
    st.s += exp(x - st.m);
  }
}

// The row's (max, Σexp) reduced over the block in a fixed tree order; every thread gets it.
template <int V, typename T>
__device__ MaxSum<acc_t<T>> row_max_sum(const T* __restrict__ xr, int64_t v) {
  using A = acc_t<T>;
  MaxSum<A> st{A(0), A(0)};
  for (int64_t j = int64_t(threadIdx.x) * V; j < v; j += int64_t(blockDim.x) * V) {
    Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(xr + j);
#pragma unroll
    for (int k = 0; k < V; ++k) push(st, A(to_acc(p.v[k])));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum<A> other{__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o)};
    st = combine(st, other);
  }
  __shared__ A sm[32], ss[32];
  __shared__ MaxSum<A> result;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = st.m;
    ss[warp] = st.s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum<A> total{sm[0], ss[0]};
    for (int w = 1; w < int(blockDim.x >> 5); ++w) total = combine(total, MaxSum<A>{sm[w], ss[w]});
    result = total;
  }
  __syncthreads();
  return result;
}

}  // namespace meshtrain::cuda
