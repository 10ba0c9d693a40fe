// cuBLASLt GEMMs of the routed experts, whose one extent (an expert's rows) is data and changes
// every step. Classic cuBLAS looks its heuristic up again for every new extent (tens of
// microseconds of host time per call), which left the GPU waiting on the host for the forward
// expert GEMMs that follow a dispatch plan's host wait. Here the algorithms are chosen before the
// first step, one per bucket of the extent; a launch writes the extent into its layouts and calls
// cublasLtMatmul with the bucket's algorithm.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/ops/cuda/cublaslt_matmul.h"

namespace meshtrain::cuda {

// Column-major C[m, n] = op(A) op(B) (+ C with `accumulate`; cuBLAS's convention): A is stored
// [ta ? k : m] x [ta ? m : k] with leading dim lda, B [tb ? n : k] x [tb ? k : n] with ldb, C
// [m, n] with ldc. Either n (the rows of an expert's input) or k (wgrad's sum over an expert's
// rows) varies per launch from 1 to the value given here.
struct ExpertGemmShape {
  DType dtype = DType::kBF16;
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool vary_k = false;      // false: n varies; true: k varies
  bool f32_out = false;     // C is float32 for bf16 operands (the wgrad into its fp32 gradient)
  bool accumulate = false;  // beta 1: C += product
  auto operator<=>(const ExpertGemmShape&) const = default;
};

class ExpertGemm {
 public:
  // Chooses an algorithm per extent bucket (on `device`, the current one) that fits `max_workspace`
  // bytes and 16-byte aligned pointers and runs both ends of the bucket; a bucket without one
  // falls back to classic cuBLAS.
  ExpertGemm(int device, const ExpertGemmShape& shape, size_t max_workspace);
  ~ExpertGemm();
  ExpertGemm(const ExpertGemm&) = delete;
  ExpertGemm& operator=(const ExpertGemm&) = delete;

  // One GEMM with the varying extent set to `extent` (1 .. its maximum) on `stream`. `workspace`
  // holds at least max_workspace bytes. The classic fallback runs on `blas`, whose stream and
  // workspace the caller has set to these. Rewrites the layouts: calls must not overlap in time
  // on the host (the executor runs a rank's nodes from one thread).
  void run(int64_t extent, const void* a, const void* b, void* c, void* workspace,
           size_t workspace_bytes, cudaStream_t stream, cublasHandle_t blas);

  const std::vector<int64_t>& bounds() const { return bounds_; }  // bucket upper bounds
  bool bucket_uses_lt(int bucket) const;  // false: that bucket runs classic cuBLAS
  // Bucket upper bounds: 16, 32, 64, 128, then steps of about 1/8 (multiples of 32), then the max.
  static std::vector<int64_t> bucket_bounds(int64_t max_extent);

 private:
  void set_extent(int64_t extent);
  // The heuristic's algorithm for `extent`, kept only if it also runs `other` (AlgoCheck).
  LtChoice choose_for(int64_t extent, int64_t other, size_t max_workspace);
  void classic(int64_t extent, const void* a, const void* b, void* c, cublasHandle_t blas) const;

  ExpertGemmShape shape_;
  size_t max_workspace_ = 0;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_a_ = nullptr, layout_b_ = nullptr, layout_c_ = nullptr;
  std::vector<int64_t> bounds_;
  // Per bucket; shared by every ExpertGemm of the same shape (nodes of equal shapes, layers).
  std::shared_ptr<const std::vector<LtChoice>> choice_;
};

}  // namespace meshtrain::cuda
