// Error checks for the compute-bound CUDA ops (matmul, attention): CUDA_CHECK, CUDA_CHECK_LAUNCH
// and CUBLAS_CHECK. The runtime's runtime/cuda/cuda_check.h is the one family of these macros;
// until it is in the tree this header defines the same macros itself, with the same behaviour
// (throw CudaError naming the call, the library's error text and file:line).
#pragma once

#if __has_include("meshtrain/runtime/cuda/cuda_check.h")
#include "meshtrain/runtime/cuda/cuda_check.h"
#else

#include <cuda_runtime_api.h>

// Defined in matmul_attention_check.cpp: nvcc cannot compile fmt's consteval format strings, so
// the formatting stays in host-compiled code and .cu files only call these.
namespace meshtrain::detail {
[[noreturn]] void mm_throw_cuda_error(const char* call, cudaError_t code, const char* file,
                                      int line);
[[noreturn]] void mm_throw_launch_error(const char* kernel, cudaError_t code, const char* file,
                                        int line);
[[noreturn]] void mm_throw_cublas_error(const char* call, int status, const char* file, int line);
}  // namespace meshtrain::detail

#define CUDA_CHECK(call)                                                                \
  do {                                                                                  \
    cudaError_t mt_cuda_rc_ = (call);                                                   \
    if (mt_cuda_rc_ != cudaSuccess) [[unlikely]]                                        \
      ::meshtrain::detail::mm_throw_cuda_error(#call, mt_cuda_rc_, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK_LAUNCH(kernel_name)                                                          \
  do {                                                                                          \
    cudaError_t mt_cuda_rc_ = cudaGetLastError();                                               \
    if (mt_cuda_rc_ != cudaSuccess) [[unlikely]]                                                \
      ::meshtrain::detail::mm_throw_launch_error(kernel_name, mt_cuda_rc_, __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    int mt_cublas_rc_ = int(call);                                                          \
    if (mt_cublas_rc_ != 0) [[unlikely]]                                                    \
      ::meshtrain::detail::mm_throw_cublas_error(#call, mt_cublas_rc_, __FILE__, __LINE__); \
  } while (0)

#endif
