// Formats failed CUDA, cuBLAS and NCCL calls as typed errors with the library's own text.
#include "meshtrain/runtime/cuda/cuda_check.h"

#include <cublas_api.h>
#include <nccl.h>

#include "meshtrain/core/check.h"

namespace meshtrain::detail {

void throw_cuda_error(const char* call, cudaError_t code, const char* file, int line) {
  throw CudaError(
      fmt::format("{} failed: {} ({})", call, cudaGetErrorString(code), cudaGetErrorName(code)),
      file, line);
}

void throw_launch_error(const char* kernel, cudaError_t code, const char* file, int line) {
  // Launch-configuration errors are this launch's; anything else is sticky and may come from an
  // earlier kernel (a device-side check, an illegal address), which the hint helps to place.
  throw CudaError(
      fmt::format("kernel {}: {} ({}){}", kernel, cudaGetErrorString(code), cudaGetErrorName(code),
                  code == cudaErrorInvalidConfiguration || code == cudaErrorInvalidValue ||
                          code == cudaErrorLaunchOutOfResources
                      ? ""
                      : "; this can be an asynchronous error of an earlier kernel: "
                        "rerun with CUDA_LAUNCH_BLOCKING=1 to find the one that "
                        "failed"),
      file, line);
}

void throw_cublas_error(const char* call, int status, const char* file, int line) {
  throw CudaError(fmt::format("{} failed: cuBLAS status {} ({})", call, status,
                              cublasGetStatusString(cublasStatus_t(status))),
                  file, line);
}

void throw_nccl_error(const char* call, int result, const char* comm_name, const char* file,
                      int line) {
  const char* last = ncclGetLastError(nullptr);
  throw CommError(fmt::format("{}{} failed: {} (ncclResult {}){}{}",
                              comm_name ? fmt::format("communicator '{}': ", comm_name) : "", call,
                              ncclGetErrorString(ncclResult_t(result)), result,
                              last && *last ? "; NCCL says: " : "", last ? last : ""),
                  file, line);
}

}  // namespace meshtrain::detail
