// Device-side random fill for the kernel benchmarks: bf16 uniform in [-scale, scale) from a
// counter-based hash, so multi-GB operands cost no host time and never hold zeros by construction.
#include <cuda_bf16.h>

#include "bench_common.h"

namespace meshtrain::bench {
namespace {

__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    // 24 random bits -> (0, 1): the +0.5 keeps the value off zero.
    const float u = (float(uint32_t(x >> 40)) + 0.5f) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

}  // namespace

void fill_random_bf16(void* p, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  fill_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed, scale);
  CUDA_CHECK_LAUNCH("fill_random_bf16");
}

}  // namespace meshtrain::bench
