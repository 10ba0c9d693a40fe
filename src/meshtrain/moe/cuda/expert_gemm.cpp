// ExpertGemm (see header): one matmul descriptor and three layouts per instance, the varying
// extent written into the layouts per launch, and per-bucket algorithms chosen once per
// (device, shape, workspace) and shared.
#include "meshtrain/moe/cuda/expert_gemm.h"

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <tuple>

#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda {
namespace {

// Bucket algorithms assume this pointer alignment; a launch with less runs classic cuBLAS.
constexpr uint32_t kMinAlignment = 16;

void set_u64(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, int64_t v) {
  const uint64_t x = uint64_t(v);
  CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, attr, &x, sizeof(x)));
}

}  // namespace

std::vector<int64_t> ExpertGemm::bucket_bounds(int64_t max_extent) {
  std::vector<int64_t> b;
  for (int64_t x = 16; x < max_extent;) {
    b.push_back(x);
    x = x < 128 ? 2 * x : (x + x / 8 + 31) / 32 * 32;
  }
  if (max_extent > 0) b.push_back(max_extent);
  return b;
}

ExpertGemm::ExpertGemm(int device, const ExpertGemmShape& s, size_t max_workspace)
    : shape_(s), max_workspace_(max_workspace) {
  const int64_t varying = s.vary_k ? s.k : s.n;
  MT_CHECK_T(ValueError,
             s.m > 0 && s.n > 0 && s.k > 0 && s.m <= INT_MAX && s.n <= INT_MAX && s.k <= INT_MAX &&
                 s.lda <= INT_MAX && s.ldb <= INT_MAX && s.ldc <= INT_MAX,
             "expert GEMM on CUDA: extents must be positive and fit int, found m {} n {} k {} "
             "(lda {} ldb {} ldc {})",
             s.m, s.n, s.k, s.lda, s.ldb, s.ldc);
  bounds_ = bucket_bounds(varying);
  lt_ = lt_handle(device);
  const cudaDataType_t elem = element_type(s.dtype);
  const cudaDataType_t scale = s.dtype == DType::kF64 ? CUDA_R_64F : CUDA_R_32F;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, compute_type(s.dtype), scale));
  const cublasOperation_t op_a = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_a_, elem, uint64_t(s.ta ? s.k : s.m),
                                          uint64_t(s.ta ? s.m : s.k), s.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_b_, elem, uint64_t(s.tb ? s.n : s.k),
                                          uint64_t(s.tb ? s.k : s.n), s.ldb));
  MT_CHECK_T(ValueError, !s.f32_out || s.dtype == DType::kBF16,
             "expert GEMM on CUDA: a float32 output is for bfloat16 operands, found {}",
             dtype_name(s.dtype));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_c_, s.f32_out ? CUDA_R_32F : elem, uint64_t(s.m),
                                          uint64_t(s.n), s.ldc));

  static std::mutex mu;
  static std::map<std::tuple<int, ExpertGemmShape, size_t>,
                  std::shared_ptr<const std::vector<LtChoice>>>
      cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(device, s, max_workspace);
  if (auto it = cache.find(key); it != cache.end()) {
    choice_ = it->second;
    return;
  }
  auto choices = std::make_shared<std::vector<LtChoice>>();
  int64_t lower = 1;
  for (int64_t bound : bounds_) {
    // An algorithm chosen for one end of the bucket that also runs the other end: the largest
    // extent's choice first, else the smallest's.
    LtChoice c = choose_for(bound, lower, max_workspace);
    if (!c.lt && lower < bound) c = choose_for(lower, bound, max_workspace);
    choices->push_back(c);
    lower = bound + 1;
  }
  choice_ = choices;
  cache.emplace(key, choice_);
}

LtChoice ExpertGemm::choose_for(int64_t extent, int64_t other, size_t max_workspace) {
  set_extent(extent);
  LtChoice c = choose_lt_algorithm(lt_, desc_, layout_a_, layout_b_, layout_c_, max_workspace,
                                   kMinAlignment);
  if (!c.lt || other == extent) return c;
  set_extent(other);
  cublasLtMatmulHeuristicResult_t check{};
  const cublasStatus_t st = cublasLtMatmulAlgoCheck(lt_, desc_, layout_a_, layout_b_, layout_c_,
                                                    layout_c_, &c.algo, &check);
  if (st != CUBLAS_STATUS_SUCCESS || check.workspaceSize > max_workspace) c.lt = false;
  return c;
}

ExpertGemm::~ExpertGemm() {
  if (layout_c_) cublasLtMatrixLayoutDestroy(layout_c_);
  if (layout_b_) cublasLtMatrixLayoutDestroy(layout_b_);
  if (layout_a_) cublasLtMatrixLayoutDestroy(layout_a_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
}

bool ExpertGemm::bucket_uses_lt(int bucket) const { return (*choice_).at(size_t(bucket)).lt; }

// Writes the varying extent into the two layouts that carry it.
void ExpertGemm::set_extent(int64_t extent) {
  const ExpertGemmShape& s = shape_;
  if (s.vary_k) {
    set_u64(layout_a_, s.ta ? CUBLASLT_MATRIX_LAYOUT_ROWS : CUBLASLT_MATRIX_LAYOUT_COLS, extent);
    set_u64(layout_b_, s.tb ? CUBLASLT_MATRIX_LAYOUT_COLS : CUBLASLT_MATRIX_LAYOUT_ROWS, extent);
  } else {
    set_u64(layout_b_, s.tb ? CUBLASLT_MATRIX_LAYOUT_ROWS : CUBLASLT_MATRIX_LAYOUT_COLS, extent);
    set_u64(layout_c_, CUBLASLT_MATRIX_LAYOUT_COLS, extent);
  }
}

void ExpertGemm::run(int64_t extent, const void* a, const void* b, void* c, void* workspace,
                     size_t workspace_bytes, cudaStream_t stream, cublasHandle_t blas) {
  const int64_t max_extent = shape_.vary_k ? shape_.k : shape_.n;
  MT_CHECK(extent >= 1, "expert GEMM: extent {} must be >= 1", extent);
  // More rows than the plan chose algorithms for: an expert-parallel exchange that overflowed
  // its planned capacity (graph/row_capacity.h). Classic cuBLAS takes any extent.
  if (extent > max_extent) return classic(extent, a, b, c, blas);
  const size_t bucket =
      size_t(std::lower_bound(bounds_.begin(), bounds_.end(), extent) - bounds_.begin());
  const LtChoice& choice = (*choice_)[bucket];
  if (!choice.lt || pointer_alignment(a, b, c) < kMinAlignment ||
      workspace_bytes < max_workspace_ || uintptr_t(workspace) % 256 != 0)
    return classic(extent, a, b, c, blas);
  set_extent(extent);
  const float alpha32 = 1.0f, beta32 = shape_.accumulate ? 1.0f : 0.0f;
  const double alpha64 = 1.0, beta64 = shape_.accumulate ? 1.0 : 0.0;
  const bool f64 = shape_.dtype == DType::kF64;
  CUBLAS_CHECK(cublasLtMatmul(lt_, desc_, f64 ? static_cast<const void*>(&alpha64) : &alpha32, a,
                              layout_a_, b, layout_b_,
                              f64 ? static_cast<const void*>(&beta64) : &beta32, c, layout_c_, c,
                              layout_c_, &choice.algo, workspace, max_workspace_, stream));
}

void ExpertGemm::classic(int64_t extent, const void* a, const void* b, void* c,
                         cublasHandle_t blas) const {
  const ExpertGemmShape& s = shape_;
  const float alpha32 = 1.0f, beta32 = s.accumulate ? 1.0f : 0.0f;
  const double alpha64 = 1.0, beta64 = s.accumulate ? 1.0 : 0.0;
  const bool f64 = s.dtype == DType::kF64;
  const cudaDataType_t t = element_type(s.dtype);
  const cudaDataType_t tc = s.f32_out ? CUDA_R_32F : t;
  const int n = int(s.vary_k ? s.n : extent), k = int(s.vary_k ? extent : s.k);
  CUBLAS_CHECK(cublasGemmEx(blas, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, int(s.m), n, k,
                            f64 ? static_cast<const void*>(&alpha64) : &alpha32, a, t, int(s.lda),
                            b, t, int(s.ldb), f64 ? static_cast<const void*>(&beta64) : &beta32, c,
                            tc, int(s.ldc), compute_type(s.dtype), CUBLAS_GEMM_DEFAULT));
}

}  // namespace meshtrain::cuda
