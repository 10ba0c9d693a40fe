// GEMM plans on cuBLASLt for row-major operands: C[m, n] = op(A) · op(B) (+ C). A plan owns
// the descriptors and the chosen algorithm for one fixed problem; it is built before the first step
// (never inside one) and is deterministic: a fixed algorithm and no split-K scheme whose partial
// sums are rounded to the output type or ordered through counters.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "meshtrain/core/dtype.h"

namespace meshtrain::cuda {

// cuBLAS's recommended workspace on Hopper; what the CUDA `matmul` and grouped GEMM kernels
// register as their scratch.
constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;

// Row-major problem. A is stored [ta ? k : m, lda], B [tb ? n : k, ldb], C [m, ldc].
// bfloat16: bf16 operands, fp32 accumulation and scale, bf16 output. float32: exact fp32
// (CUBLAS_COMPUTE_32F; TF32 is never enabled, so CPU parity holds to fp32 rounding).
// float64: fp64 throughout. `out`: C's dtype (the operands' own, or float32 for bf16 operands);
// `accumulate`: C += product (beta 1) instead of C = product.
struct GemmProblem {
  DType dtype = DType::kBF16;
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  DType out = DType::kBF16;
  bool accumulate = false;
  auto operator<=>(const GemmProblem&) const = default;
  std::string to_string() const;
};
// Contiguous operands: lda, ldb, ldc are the stored rows' lengths; C of the operands' dtype,
// overwritten.
GemmProblem gemm_problem(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k);

class GemmPlan {
 public:
  // Creates the matmul descriptor and layouts on `device` and asks cuBLASLt's heuristic for an
  // algorithm that fits `max_workspace` bytes, assuming 256-byte aligned pointers (what the
  // memory plan hands out). Throws ValueError for a dtype other than bf16/f32/f64.
  GemmPlan(int device, const GemmProblem& problem, size_t max_workspace);
  ~GemmPlan();
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  // C = op(A) op(B) (+ C when accumulating) on `stream`. `workspace` must hold max_workspace bytes,
  // 256-byte aligned. Pointers less aligned than 256 bytes get an algorithm chosen for their
  // alignment the first time they are seen (in a static graph: the first step, which may allocate).
  void run(const void* a, const void* b, void* c, void* workspace, size_t workspace_bytes,
           cudaStream_t stream) const;

  const GemmProblem& problem() const { return problem_; }
  size_t max_workspace() const { return max_workspace_; }
  // "cublasLt algo <id> tile <t> splitK <s> reduction <r> ws <bytes>" or "cublas fallback".
  std::string describe() const;

  struct Impl;

 private:
  int device_;
  GemmProblem problem_;
  size_t max_workspace_;
  std::unique_ptr<Impl> impl_;
};

// Plans are cached per (device, problem, workspace): nodes with equal shapes share one.
std::shared_ptr<const GemmPlan> gemm_plan(int device, const GemmProblem& problem,
                                          size_t max_workspace);

// ---- shared by the plans here and the expert GEMMs (expert_gemm.h) ------------------------------
// The cuBLASLt handle of `device` (created on first use, never destroyed).
cublasLtHandle_t lt_handle(int device);
cudaDataType_t element_type(DType d);       // bf16 / f32 / f64; ValueError otherwise
cublasComputeType_t compute_type(DType d);  // 32F (never TF32) or 64F
// Largest power of two (at most 256) that divides all three addresses.
uint32_t pointer_alignment(const void* a, const void* b, const void* c);

struct LtChoice {
  bool lt = false;  // false: no cuBLASLt algorithm; the caller runs classic cuBLAS
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};
// The heuristic's first algorithm for the problem the descriptors describe (D = C in place) that
// fits `max_workspace` and `alignment`-byte aligned pointers, under the deterministic preference:
// split-K only with partials in the compute type reduced in a fixed order.
LtChoice choose_lt_algorithm(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                             cublasLtMatrixLayout_t layout_a, cublasLtMatrixLayout_t layout_b,
                             cublasLtMatrixLayout_t layout_c, size_t max_workspace,
                             uint32_t alignment);

// The classic cuBLAS handle of `device` (created on first use, never destroyed; math mode keeps
// split-K partials in the accumulation type). Callers set its stream and workspace per call.
cublasHandle_t blas_handle(int device);

}  // namespace meshtrain::cuda
