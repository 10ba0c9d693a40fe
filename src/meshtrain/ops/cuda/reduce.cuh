// Deterministic two-pass reductions to one value (sum, sum of squares, the cross-entropy loss):
// pass 1 has reduce_blocks(n) blocks each write one float64 partial; pass 2, one block, adds them
// in index order. Nothing depends on timing or on the device, so every run is bitwise identical.
#pragma once

#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/cuda_workspace.h"

namespace meshtrain::cuda {

struct SquareOp {
  __device__ __forceinline__ double operator()(double v) const { return v * v; }
};
struct IdentityOp {
  __device__ __forceinline__ double operator()(double v) const { return v; }
};

// partials[blockIdx.x] = Σ f(x[i]) over this block's grid-stride share, accumulated in double.
template <typename T, typename F>
__global__ void reduce_partials_kernel(const T* __restrict__ x, int64_t n,
                                       double* __restrict__ partials, F f) {
  double acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc += f(double(to_acc(x[i])));
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// out[0] = (Σ partials[0..count)) * scale, rounded once to Out. `scale_den` (optional, device
// int64) divides the total when non-null (the cross-entropy token count).
template <typename Out>
__global__ void reduce_finish_kernel(const double* __restrict__ partials, int64_t count,
                                     Out* __restrict__ out, const int64_t* __restrict__ scale_den) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    if (scale_den) {
      const int64_t den = scale_den[0];
      MT_DEVICE_CHECK(den > 0,
                      "cross_entropy: token_count must be positive (the number of labels that "
                      "are not ignore_index)");
      acc /= double(den);
    }
    out[0] = from_acc<Out>(acc);
  }
}

// Reduces n elements of x with f into out[0] using `partials` (reduce_workspace_bytes(n)).
template <typename T, typename Out, typename F>
void launch_reduce(const T* x, int64_t n, double* partials, Out* out, F f, cudaStream_t s,
                   const int64_t* scale_den = nullptr) {
  const int64_t blocks = reduce_blocks(n);
  if (n > 0) {
    reduce_partials_kernel<<<unsigned(blocks), kReduceThreads, 0, s>>>(x, n, partials, f);
    CUDA_CHECK_LAUNCH("reduce_partials");
  } else {
    CUDA_CHECK(cudaMemsetAsync(partials, 0, sizeof(double), s));
  }
  reduce_finish_kernel<Out>
      <<<1, kReduceThreads, 0, s>>>(partials, n > 0 ? blocks : 1, out, scale_den);
  CUDA_CHECK_LAUNCH("reduce_finish");
}

}  // namespace meshtrain::cuda
