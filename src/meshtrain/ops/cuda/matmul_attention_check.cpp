// Message formatting for the fallback CUDA_CHECK family of matmul_attention_check.h (compiled only
// while the runtime's own runtime/cuda/cuda_check.h is absent from the tree).
#if !__has_include("meshtrain/runtime/cuda/cuda_check.h")

#include "meshtrain/ops/cuda/matmul_attention_check.h"

#include <cublas_api.h>

#include "meshtrain/core/check.h"

namespace meshtrain::detail {

void mm_throw_cuda_error(const char* call, cudaError_t code, const char* file, int line) {
  throw CudaError(
      fmt::format("{} failed: {} ({})", call, cudaGetErrorString(code), cudaGetErrorName(code)),
      file, line);
}

void mm_throw_launch_error(const char* kernel, cudaError_t code, const char* file, int line) {
  throw CudaError(fmt::format("kernel {} (or an earlier asynchronous launch) failed: {} ({})",
                              kernel, cudaGetErrorString(code), cudaGetErrorName(code)),
                  file, line);
}

void mm_throw_cublas_error(const char* call, int status, const char* file, int line) {
  throw CudaError(fmt::format("{} failed: {} (status {})", call,
                              cublasGetStatusString(cublasStatus_t(status)), status),
                  file, line);
}

}  // namespace meshtrain::detail

#endif
