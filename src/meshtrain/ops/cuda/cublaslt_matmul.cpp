// cuBLASLt GEMM plans: the row-major -> column-major mapping (C^T = op(B)^T op(A)^T, so cuBLAS's
// "A" is our B), one algorithm per pointer alignment chosen by the heuristic and then fixed, and a
// classic-cuBLAS fallback for problems the Lt heuristic offers nothing for (odd leading dims).
#include "meshtrain/ops/cuda/cublaslt_matmul.h"

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>

#include "meshtrain/runtime/cuda/cuda_check.h"

namespace meshtrain::cuda {

std::string GemmProblem::to_string() const {
  return fmt::format("{} {}x{}x{} (m x n x k), A{} lda {}, B{} ldb {}, ldc {}, C {}{}",
                     dtype_name(dtype), m, n, k, ta ? "ᵀ" : "", lda, tb ? "ᵀ" : "", ldb, ldc,
                     dtype_name(out), accumulate ? " accumulated" : "");
}

GemmProblem gemm_problem(DType dtype, bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  return {dtype, ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, dtype, false};
}

namespace {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) CUDA_CHECK(cudaSetDevice(device));
    changed_ = prev_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool changed_ = false;
};

int log2_of(uint32_t pow2) {
  int l = 0;
  while ((1u << l) < pow2) ++l;
  return l;
}

}  // namespace

uint32_t pointer_alignment(const void* a, const void* b, const void* c) {
  const uintptr_t bits = uintptr_t(a) | uintptr_t(b) | uintptr_t(c) | uintptr_t(256);
  return uint32_t(bits & (~bits + 1));  // lowest set bit, at most 256
}

// One handle per device, created when the first plan is built (before step 1) and never destroyed:
// at process exit the CUDA context may be gone before static destructors run.
cublasLtHandle_t lt_handle(int device) {
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  DeviceGuard guard(device);
  cublasLtHandle_t h = nullptr;
  CUBLAS_CHECK(cublasLtCreate(&h));
  handles.emplace(device, h);
  return h;
}

cudaDataType_t element_type(DType d) {
  switch (d) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    case DType::kF64: return CUDA_R_64F;
    default:
      MT_THROW(ValueError, "matmul on CUDA: expected dtype bfloat16, float32 or float64, found {}",
               dtype_name(d));
  }
}

// fp32 stays exact fp32: CUBLAS_COMPUTE_32F never uses TF32 (that needs *_FAST_TF32).
cublasComputeType_t compute_type(DType d) {
  return d == DType::kF64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
}

LtChoice choose_lt_algorithm(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                             cublasLtMatrixLayout_t layout_a, cublasLtMatrixLayout_t layout_b,
                             cublasLtMatrixLayout_t layout_c, size_t max_workspace,
                             uint32_t alignment) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = max_workspace;
  // Split-K only with fp32 partials in workspace reduced in a fixed order (COMPUTE_TYPE), or no
  // split at all (NONE, which every mask admits). INPLACE and OUTPUT_TYPE round the partials to
  // the output type (bf16) and INPLACE orders them through counters: both are excluded.
  const uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                              &reduction, sizeof(reduction));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof(alignment));
  std::array<cublasLtMatmulHeuristicResult_t, 8> results{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(lt, desc, layout_a, layout_b, layout_c, layout_c, pref,
                                        int(results.size()), results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // NOT_SUPPORTED means "no algorithm for this problem": the classic path takes it.
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) CUBLAS_CHECK(st);
  LtChoice c;
  for (int i = 0; i < found; ++i)
    if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS &&
        results[size_t(i)].workspaceSize <= max_workspace) {
      c.lt = true;
      c.algo = results[size_t(i)].algo;
      c.workspace = results[size_t(i)].workspaceSize;
      break;
    }
  return c;
}

cublasHandle_t blas_handle(int device) {
  static std::mutex mu;
  static std::map<int, cublasHandle_t> handles;
  std::lock_guard<std::mutex> lock(mu);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  DeviceGuard guard(device);
  cublasHandle_t h = nullptr;
  CUBLAS_CHECK(cublasCreate(&h));
  // Split-K partials stay in the accumulation type (accuracy, and parity with the Lt path).
  CUBLAS_CHECK(cublasSetMathMode(
      h, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  handles.emplace(device, h);
  return h;
}

struct GemmPlan::Impl {
  using Choice = LtChoice;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t layout_a = nullptr;  // cuBLAS's A: our B viewed column-major
  cublasLtMatrixLayout_t layout_b = nullptr;  // cuBLAS's B: our A viewed column-major
  cublasLtMatrixLayout_t layout_c = nullptr;
  mutable std::mutex mu;
  mutable std::array<std::optional<Choice>, 9> by_alignment;  // index: log2(alignment bytes)

  ~Impl() {
    if (layout_c) cublasLtMatrixLayoutDestroy(layout_c);
    if (layout_b) cublasLtMatrixLayoutDestroy(layout_b);
    if (layout_a) cublasLtMatrixLayoutDestroy(layout_a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }

  Choice choose(size_t max_workspace, uint32_t alignment) const {
    return choose_lt_algorithm(lt, desc, layout_a, layout_b, layout_c, max_workspace, alignment);
  }
};

GemmPlan::GemmPlan(int device, const GemmProblem& p, size_t max_workspace)
    : device_(device), problem_(p), max_workspace_(max_workspace), impl_(std::make_unique<Impl>()) {
  const cudaDataType_t elem = element_type(p.dtype), elem_c = element_type(p.out);
  MT_CHECK_T(ValueError, p.out == p.dtype || (p.dtype == DType::kBF16 && p.out == DType::kF32),
             "matmul on CUDA: a {} output for {} operands (expected theirs, or float32 for "
             "bfloat16)",
             dtype_name(p.out), dtype_name(p.dtype));
  MT_CHECK_T(ValueError, p.m >= 0 && p.n >= 0 && p.k >= 0, "matmul on CUDA: negative extent in {}",
             p.to_string());
  const int64_t a_rows = p.ta ? p.k : p.m, a_cols = p.ta ? p.m : p.k;
  const int64_t b_rows = p.tb ? p.n : p.k, b_cols = p.tb ? p.k : p.n;
  MT_CHECK(p.lda >= a_cols && p.ldb >= b_cols && p.ldc >= p.n,
           "GemmPlan: leading dims too small: {}", p.to_string());
  if (p.m == 0 || p.n == 0 || p.k == 0) return;  // run() writes zeros or nothing
  DeviceGuard guard(device);
  Impl& im = *impl_;
  im.lt = lt_handle(device);
  const cudaDataType_t scale = p.dtype == DType::kF64 ? CUDA_R_64F : CUDA_R_32F;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&im.desc, compute_type(p.dtype), scale));
  const cublasOperation_t op_a = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // applied to our B
  const cublasOperation_t op_b = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // applied to our A
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(im.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(im.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // A row-major [r, c] matrix with leading dim ld is the column-major [c, r] one with the same ld.
  CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&im.layout_a, elem, uint64_t(b_cols), uint64_t(b_rows), p.ldb));
  CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&im.layout_b, elem, uint64_t(a_cols), uint64_t(a_rows), p.lda));
  CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&im.layout_c, elem_c, uint64_t(p.n), uint64_t(p.m), p.ldc));
  // The memory plan aligns every buffer to 256 bytes: choose for that case now.
  Impl::Choice c = im.choose(max_workspace, 256);
  if (!c.lt) blas_handle(device);  // create the fallback's handle before the first step
  im.by_alignment[8] = c;
}

GemmPlan::~GemmPlan() = default;

void GemmPlan::run(const void* a, const void* b, void* c, void* workspace, size_t workspace_bytes,
                   cudaStream_t stream) const {
  const GemmProblem& p = problem_;
  if (p.m == 0 || p.n == 0) return;
  if (p.k == 0) {  // an empty sum: C = 0, or C unchanged
    if (!p.accumulate)
      CUDA_CHECK(cudaMemsetAsync(c, 0, size_t(p.m * p.ldc) * dtype_size(p.out), stream));
    return;
  }
  MT_CHECK(workspace_bytes >= max_workspace_ && uintptr_t(workspace) % 256 == 0,
           "matmul on CUDA: workspace of {} bytes at {} (expected >= {}, 256-byte aligned)",
           workspace_bytes, workspace, max_workspace_);
  const uint32_t alignment = pointer_alignment(a, b, c);
  Impl::Choice choice;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto& slot = impl_->by_alignment[size_t(log2_of(alignment))];
    if (!slot) {
      DeviceGuard guard(device_);
      slot = impl_->choose(max_workspace_, alignment);
    }
    choice = *slot;
  }
  const float alpha32 = 1.0f, beta32 = p.accumulate ? 1.0f : 0.0f;
  const double alpha64 = 1.0, beta64 = p.accumulate ? 1.0 : 0.0;
  const bool f64 = p.dtype == DType::kF64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  if (choice.lt) {
    CUBLAS_CHECK(cublasLtMatmul(impl_->lt, impl_->desc, alpha, b, impl_->layout_a, a,
                                impl_->layout_b, beta, c, impl_->layout_c, c, impl_->layout_c,
                                &choice.algo, workspace, workspace_bytes, stream));
    return;
  }
  // Classic cuBLAS: same column-major mapping. It takes int extents.
  MT_CHECK_T(ValueError,
             p.m <= INT_MAX && p.n <= INT_MAX && p.k <= INT_MAX && p.lda <= INT_MAX &&
                 p.ldb <= INT_MAX && p.ldc <= INT_MAX,
             "matmul on CUDA: no cuBLASLt algorithm for {} and the extents exceed the fallback's "
             "int range",
             p.to_string());
  cublasHandle_t h = blas_handle(device_);
  // cublasSetStream resets the workspace to cuBLAS's own pool; set ours after it.
  CUBLAS_CHECK(cublasSetStream(h, stream));
  CUBLAS_CHECK(cublasSetWorkspace(h, workspace, workspace_bytes));
  const cudaDataType_t elem = element_type(p.dtype);
  CUBLAS_CHECK(cublasGemmEx(h, p.tb ? CUBLAS_OP_T : CUBLAS_OP_N, p.ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                            int(p.n), int(p.m), int(p.k), alpha, b, elem, int(p.ldb), a, elem,
                            int(p.lda), beta, c, element_type(p.out), int(p.ldc),
                            compute_type(p.dtype), CUBLAS_GEMM_DEFAULT));
}

std::string GemmPlan::describe() const {
  if (problem_.m == 0 || problem_.n == 0 || problem_.k == 0) return "empty (memset or nothing)";
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto& slot = impl_->by_alignment[8];
  if (!slot || !slot->lt) return "cublas fallback (cublasGemmEx)";
  const cublasLtMatmulAlgo_t& algo = slot->algo;
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
    return v;
  };
  return fmt::format("cublasLt algo {} tile {} stages {} splitK {} reduction {} ws {}",
                     get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID),
                     get(CUBLASLT_ALGO_CONFIG_STAGES_ID), get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                     get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), slot->workspace);
}

std::shared_ptr<const GemmPlan> gemm_plan(int device, const GemmProblem& problem,
                                          size_t max_workspace) {
  static std::mutex mu;
  static std::map<std::tuple<int, GemmProblem, size_t>, std::shared_ptr<const GemmPlan>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_tuple(device, problem, max_workspace);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto plan = std::make_shared<const GemmPlan>(device, problem, max_workspace);
  cache.emplace(key, plan);
  return plan;
}

}  // namespace meshtrain::cuda
