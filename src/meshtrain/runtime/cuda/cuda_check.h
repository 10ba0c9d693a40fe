// CUDA_CHECK / CUDA_CHECK_LAUNCH / CUBLAS_CHECK / NCCL_CHECK: every CUDA, cuBLAS and NCCL return
// in meshtrain goes through one of these. A failure throws CudaError (CUDA, cuBLAS) or CommError
// (NCCL) naming the call, the library's own error text, file:line and the rank (core/check.h
// prefixes the rank). Kept out of core/ so that core never includes a CUDA header.
#pragma once

#include <cuda_runtime_api.h>

namespace meshtrain::detail {
[[noreturn]] void throw_cuda_error(const char* call, cudaError_t code, const char* file, int line);
// `kernel` names the launch; the error may belong to an earlier asynchronous kernel.
[[noreturn]] void throw_launch_error(const char* kernel, cudaError_t code, const char* file,
                                     int line);
[[noreturn]] void throw_cublas_error(const char* call, int status, const char* file, int line);
// `comm_name` may be null when the call has no communicator yet (ncclGetUniqueId).
[[noreturn]] void throw_nccl_error(const char* call, int result, const char* comm_name,
                                   const char* file, int line);
}  // namespace meshtrain::detail

#define CUDA_CHECK(call)                                                             \
  do {                                                                               \
    cudaError_t mt_cuda_rc_ = (call);                                                \
    if (mt_cuda_rc_ != cudaSuccess) [[unlikely]]                                     \
      ::meshtrain::detail::throw_cuda_error(#call, mt_cuda_rc_, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: CUDA_CHECK_LAUNCH("rmsnorm_forward").
#define CUDA_CHECK_LAUNCH(kernel_name)                                                       \
  do {                                                                                       \
    cudaError_t mt_cuda_rc_ = cudaGetLastError();                                            \
    if (mt_cuda_rc_ != cudaSuccess) [[unlikely]]                                             \
      ::meshtrain::detail::throw_launch_error(kernel_name, mt_cuda_rc_, __FILE__, __LINE__); \
  } while (0)

// cuBLAS / cuBLASLt statuses are compared as ints (CUBLAS_STATUS_SUCCESS == 0) so this header
// needs no cuBLAS include.
#define CUBLAS_CHECK(call)                                                               \
  do {                                                                                   \
    int mt_cublas_rc_ = int(call);                                                       \
    if (mt_cublas_rc_ != 0) [[unlikely]]                                                 \
      ::meshtrain::detail::throw_cublas_error(#call, mt_cublas_rc_, __FILE__, __LINE__); \
  } while (0)

// NCCL results as ints (ncclSuccess == 0). ncclInProgress (7) is not an error for communicators
// in non-blocking mode; comm/nccl handles it before it reaches this macro (NCCL_CHECK_ON).
#define NCCL_CHECK(call)                                                                      \
  do {                                                                                        \
    int mt_nccl_rc_ = int(call);                                                              \
    if (mt_nccl_rc_ != 0) [[unlikely]]                                                        \
      ::meshtrain::detail::throw_nccl_error(#call, mt_nccl_rc_, nullptr, __FILE__, __LINE__); \
  } while (0)
