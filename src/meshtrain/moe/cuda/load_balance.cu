// CUDA kernels of the load-balancing ops. Token counts: one block builds a shared-memory integer
// histogram (integer atomics commute, so the result is exact and the same every run) and writes
// it once as float. Bias update: one block; the two float64 sums run sequentially in index order
// on thread 0 (E is at most a few hundred), the elementwise parts on all threads.
#include "meshtrain/moe/cuda/load_balance_kernels.h"
#include "meshtrain/ops/cuda/cuda_kernel.h"

namespace meshtrain::cuda {
namespace {

constexpr int kCountThreads = 1024;

template <typename T>
__global__ void __launch_bounds__(kCountThreads)
    token_counts_kernel(const int32_t* __restrict__ ids, int64_t n, int64_t experts,
                        T* __restrict__ counts) {
  extern __shared__ int hist[];
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t id = ids[i];
    MT_DEVICE_CHECK(id >= 0 && id < experts,
                    "moe_token_counts: an expert id is outside [0, num_experts)");
    atomicAdd(&hist[id], 1);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) counts[e] = T(hist[e]);
}

__device__ __forceinline__ double sign_of(double x) { return double((x > 0) - (x < 0)); }

template <typename T>
__global__ void bias_update_kernel(T* __restrict__ bias, T* counter, T* __restrict__ load,
                                   const T* counts, int64_t e, double coeff) {
  __shared__ double s_mean, s_delta_mean;
  if (threadIdx.x == 0) {
    double mean = 0;
    for (int64_t i = 0; i < e; ++i) mean += double(counts[i]);
    mean /= double(e);
    double delta_mean = 0;
    for (int64_t i = 0; i < e; ++i) delta_mean += coeff * sign_of(mean - double(counts[i]));
    s_mean = mean;
    s_delta_mean = delta_mean / double(e);
  }
  __syncthreads();
  const double mean = s_mean, delta_mean = s_delta_mean;
  for (int64_t i = threadIdx.x; i < e; i += blockDim.x) {
    const T c = counts[i];
    if (coeff > 0) bias[i] = T(double(bias[i]) + coeff * sign_of(mean - double(c)) - delta_mean);
    load[i] = c;
  }
  // counts may be the counter itself: every thread has read its counts before any is cleared.
  __syncthreads();
  for (int64_t i = threadIdx.x; i < e; i += blockDim.x) counter[i] = T(0);
}

template <typename T>
void launch_counts(const int32_t* ids, int64_t n, int64_t experts, T* counts, cudaStream_t s) {
  const size_t smem = size_t(experts) * sizeof(int);
  token_counts_kernel<T><<<1, kCountThreads, smem, s>>>(ids, n, experts, counts);
  CUDA_CHECK_LAUNCH("moe_token_counts");
}

template <typename T>
void launch_bias_update(T* bias, T* counter, T* load, const T* counts, int64_t e, double coeff,
                        cudaStream_t s) {
  bias_update_kernel<T><<<1, 256, 0, s>>>(bias, counter, load, counts, e, coeff);
  CUDA_CHECK_LAUNCH("expert_bias_update");
}

}  // namespace

void moe_token_counts(DType dtype, const int32_t* ids, int64_t n, int64_t experts, void* counts,
                      cudaStream_t stream) {
  if (dtype == DType::kF64)
    launch_counts(ids, n, experts, static_cast<double*>(counts), stream);
  else
    launch_counts(ids, n, experts, static_cast<float*>(counts), stream);
}

void expert_bias_update(DType dtype, void* bias, void* counter, void* last_load, const void* counts,
                        int64_t experts, double coeff, cudaStream_t stream) {
  if (experts == 0) return;
  if (dtype == DType::kF64)
    launch_bias_update(static_cast<double*>(bias), static_cast<double*>(counter),
                       static_cast<double*>(last_load), static_cast<const double*>(counts), experts,
                       coeff, stream);
  else
    launch_bias_update(static_cast<float*>(bias), static_cast<float*>(counter),
                       static_cast<float*>(last_load), static_cast<const float*>(counts), experts,
                       coeff, stream);
}

}  // namespace meshtrain::cuda
