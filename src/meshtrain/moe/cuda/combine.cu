// CUDA kernels of the combine and its weight gradient, with the CPU kernels' fixed order.
// moe_combine: one block per token gathers the token's k rows of the expert-major buffer (only
// rows the row map names), weights them and sums them in order j = 0..k-1 in the accumulation
// type, rounding once; 16-byte accesses where rows allow. moe_row_dot: one warp per choice, the
// dot product of its buffer row with the token's row (float accumulation, double for float64),
// a fixed shuffle tree, so results are reproducible bit for bit.
#include <algorithm>

#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {
namespace {

constexpr int kMaxTopK = 64;  // the row indices and weights of a token are staged in registers

template <int V, typename T, typename W>
__global__ void combine_kernel(const T* __restrict__ y, const int32_t* __restrict__ row_map,
                               const W* __restrict__ w, T* __restrict__ out, int64_t k, int64_t d,
                               int64_t capacity) {
  using A = acc_t<T>;
  const int64_t t = blockIdx.x;
  __shared__ int32_t rows[kMaxTopK];
  __shared__ A scale[kMaxTopK];
  for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
    const int32_t r = row_map[t * k + j];
    MT_DEVICE_CHECK(r >= 0 && r < capacity, "moe_combine: a row_map entry is outside the buffer");
    rows[j] = r;
    scale[j] = w ? A(to_acc(w[t * k + j])) : A(1);
  }
  __syncthreads();
  const int64_t nv = d / V;
  Pack<T, V>* dst = reinterpret_cast<Pack<T, V>*>(out + t * d);
  for (int64_t c = threadIdx.x; c < nv; c += blockDim.x) {
    A acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = A(0);
    for (int64_t j = 0; j < k; ++j) {
      const Pack<T, V> p = reinterpret_cast<const Pack<T, V>*>(y + int64_t(rows[j]) * d)[c];
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += scale[j] * A(to_acc(p.v[i]));
    }
    Pack<T, V> o;
#pragma unroll
    for (int i = 0; i < V; ++i) o.v[i] = from_acc<T>(acc[i]);
    dst[c] = o;
  }
}

template <typename T, typename W>
void combine(const T* y, const int32_t* row_map, const W* w, T* out, int64_t tokens, int64_t k,
             int64_t d, int64_t capacity, cudaStream_t s) {
  if (tokens == 0 || d == 0) return;
  MT_CHECK_T(ValueError, k <= kMaxTopK, "moe_combine (cuda): top-k {} exceeds {}", k, kMaxTopK);
  constexpr int V = 16 / int(sizeof(T));
  auto threads_for = [](int64_t items) {
    return int(std::clamp<int64_t>((items + 31) / 32 * 32, 32, 256));
  };
  if (d % V == 0 && aligned16(y) && aligned16(out))
    combine_kernel<V>
        <<<unsigned(tokens), threads_for(d / V), 0, s>>>(y, row_map, w, out, k, d, capacity);
  else
    combine_kernel<1>
        <<<unsigned(tokens), threads_for(d), 0, s>>>(y, row_map, w, out, k, d, capacity);
  CUDA_CHECK_LAUNCH("moe_combine");
}

// out[t, j] = <perm[row_map[t, j]], rows[t]>; O is float for bf16 rows.
template <typename T, typename O>
__global__ void row_dot_kernel(const T* __restrict__ perm, const T* __restrict__ rows,
                               const int32_t* __restrict__ row_map, O* __restrict__ out, int64_t n,
                               int64_t k, int64_t d, int64_t capacity) {
  using A = acc_t<T>;
  const int64_t warps = int64_t(blockDim.x / 32) * gridDim.x;
  const int lane = threadIdx.x & 31;
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; i < n; i += warps) {
    const int32_t r = row_map[i];
    MT_DEVICE_CHECK(r >= 0 && r < capacity, "moe_row_dot: a row_map entry is outside the buffer");
    const T* p = perm + int64_t(r) * d;
    const T* x = rows + (i / k) * d;
    A acc = A(0);
    for (int64_t c = lane; c < d; c += 32) acc += A(to_acc(p[c])) * A(to_acc(x[c]));
    acc = warp_sum(acc);
    if (lane == 0) out[i] = O(acc);
  }
}

template <typename T, typename O>
void row_dot(const T* perm, const T* rows, const int32_t* row_map, O* out, int64_t n, int64_t k,
             int64_t d, int64_t capacity, cudaStream_t s) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  row_dot_kernel<<<grid_for(n * 32, kThreads), kThreads, 0, s>>>(perm, rows, row_map, out, n, k, d,
                                                                 capacity);
  CUDA_CHECK_LAUNCH("moe_row_dot");
}

MT_REGISTER_OPS {
  add_cuda_kernel("moe_combine", [](KernelContext& c) {
    const int64_t capacity = c.in[0].shape()[0], d = c.in[0].shape()[1];
    const int64_t tokens = c.in[1].shape()[0], k = c.in[1].shape()[1];
    const bool weighted = c.in.size() == 3;
    cudaStream_t s = stream_of(c);
    MT_DISPATCH_CUDA_FLOAT(c.in[0].dtype(), "moe_combine", [&] {
      const scalar_t* y = in_ptr<scalar_t>(c, 0);
      const int32_t* map = in_ptr<int32_t>(c, 1);
      scalar_t* out = out_ptr<scalar_t>(c, 0);
      if (!weighted)
        combine<scalar_t, scalar_t>(y, map, nullptr, out, tokens, k, d, capacity, s);
      else if (c.in[2].dtype() == c.in[0].dtype())
        combine(y, map, in_ptr<scalar_t>(c, 2), out, tokens, k, d, capacity, s);
      else
        combine(y, map, in_ptr<float>(c, 2), out, tokens, k, d, capacity, s);  // bf16 rows
    });
  });
  add_cuda_kernel("moe_row_dot", [](KernelContext& c) {
    const int64_t capacity = c.in[0].shape()[0], d = c.in[0].shape()[1];
    const int64_t n = c.in[2].numel(), k = c.in[2].shape()[1];
    cudaStream_t s = stream_of(c);
    MT_DISPATCH_CUDA_FLOAT(c.in[0].dtype(), "moe_row_dot", [&] {
      const scalar_t* p = in_ptr<scalar_t>(c, 0);
      const scalar_t* x = in_ptr<scalar_t>(c, 1);
      const int32_t* map = in_ptr<int32_t>(c, 2);
      if constexpr (std::is_same_v<scalar_t, bf16>)
        row_dot(p, x, map, out_ptr<float>(c, 0), n, k, d, capacity, s);
      else
        row_dot(p, x, map, out_ptr<scalar_t>(c, 0), n, k, d, capacity, s);
    });
  });
}

}  // namespace
}  // namespace meshtrain::cuda
