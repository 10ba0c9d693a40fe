// Helpers shared by the CUDA kernels (included by the .cu files of ops/cuda/ and moe/cuda/ only):
// the stream, launch sizing, the device scalar types behind DType, float conversions, block
// reductions, and a device-side check that survives NDEBUG (typed pointers from a KernelContext
// are ir/op_registry.h's). Rule: kernels compute in float (double for float64 tensors) and round
// once, when they store.
#pragma once

// MT_DEVICE_CHECK calls __assert_fail, which glibc's <assert.h> declares only without NDEBUG
// (and CUDA then provides in device code): include it once with NDEBUG lifted; assert() itself
// keeps the build's NDEBUG setting.
#ifdef NDEBUG
#undef NDEBUG
#include <assert.h>
#define NDEBUG
#include <assert.h>
#else
#include <assert.h>
#endif

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "meshtrain/core/dtype_dispatch.h"
#include "meshtrain/ir/op_registry.h"
#include "meshtrain/runtime/cuda/cuda_backend.h"
#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda {

using bf16 = __nv_bfloat16;

inline cudaStream_t stream_of(const KernelContext& c) { return native_stream(*c.stream); }

// `workspace` sizes the scratch the kernel reads as KernelContext::workspace (empty: none).
inline void add_cuda_kernel(const std::string& op, KernelFn fn, WorkspaceFn workspace = {}) {
  OpRegistry::instance().add_kernel(op, DeviceType::kCUDA, std::move(fn), std::move(workspace));
}

// Grid for a grid-stride loop over n items: enough blocks to fill the GPU several times over,
// never more than needed.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 132 * 16) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return unsigned(blocks);
}

// V consecutive elements moved as one access (16 bytes for V = 16 / sizeof(T)).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The accumulation type of a storage type: float for float and bf16, double for double.
template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
template <typename T>
using acc_t = typename Acc<T>::type;

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(bf16 x) { return __bfloat162float(x); }

// An accumulator (float or double) rounded once to the storage type T (float, double or bf16).
template <typename T, typename A>
__device__ __forceinline__ T from_acc(A x) {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>,
                "accumulators are float or double");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>,
                "storage types are float, double or bf16");
  if constexpr (std::is_same_v<T, bf16>)
    return __float2bfloat16_rn(float(x));
  else
    return T(x);
}

// Sum over a block whose size is a multiple of 32 (at most 1024). Every thread gets the result.
// The order of additions is fixed by the thread layout, so results are bitwise reproducible.
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <typename A>
__device__ A block_sum(A v) {
  __shared__ A partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = int(blockDim.x >> 5);
  A t = lane < warps ? partial[lane] : A(0);
  return warp_sum(t);
}

// A device-side check that stays on in release builds: a failing thread reports `msg` through
// the CUDA assert machinery (printed with block and thread), and the next CUDA call on the host
// fails with cudaErrorAssert, which CUDA_CHECK turns into a CudaError.
#define MT_DEVICE_CHECK(cond, msg)                                 \
  do {                                                             \
    if (!(cond)) __assert_fail(msg, __FILE__, __LINE__, __func__); \
  } while (0)

// Runs BODY with scalar_t bound to the device type of a floating DType (float, double, bf16):
// the one dtype switch (core/dtype_dispatch.h) with bf16 allowed; `what` is a string literal.
#define MT_DISPATCH_CUDA_FLOAT(dtype, what, ...) \
  MT_DISPATCH_FLOAT_TYPES(dtype, what " (cuda)", ::meshtrain::cuda::bf16, __VA_ARGS__)

}  // namespace meshtrain::cuda
