// CUDA grouped GEMMs of the routed experts: one cuBLAS GEMM per non-empty expert on its group's
// rows (bf16 operands with fp32 accumulation, exact fp32 with CUBLAS_COMPUTE_32F — never TF32 —,
// fp64), then one small kernel that writes zeros into the rows outside every group (padding and
// slack), so no memset of the whole buffer. grouped_matmul_wgrad zeroes only the experts that
// received no rows.
//
// Host sync: cuBLAS takes each GEMM's extents on the host, and the group counts are data (the
// router's choices of this step). Each launch copies the [2, E] groups into a pinned host buffer
// made once per node when the executor prepares the graph, and synchronises the node's stream
// before issuing the per-expert GEMMs — the same reason expert parallelism reads its split sizes
// on the host. The GPU idles only for the copy and the first launch after it (tens of µs against
// milliseconds of expert GEMMs). A device-side grouped kernel that reads the groups itself is the
// way to remove it.
#include <cublas_v2.h>

#include <algorithm>
#include <memory>

#include "meshtrain/ops/cuda/cublaslt_matmul.h"
#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/grouped_matmul.h"

namespace meshtrain::cuda {
namespace {

// Zeroes the rows of y [rows, n] outside every group: blocks (b < E, ·) clear the gap between the
// end of expert b − 1's group and the start of expert b's, blocks (E, ·) the slack after the last
// group; the grid's y dimension splits a long gap.
template <typename T>
__global__ void zero_outside_groups_kernel(const int32_t* __restrict__ g, int64_t e, int64_t rows,
                                           int64_t n, T* __restrict__ y) {
  const int64_t b = blockIdx.x;
  const int64_t from = b == 0 ? 0 : int64_t(g[b - 1]) + int64_t(g[e + b - 1]);
  const int64_t to = b == e ? rows : int64_t(g[b]);
  const int64_t stride = int64_t(blockDim.x) * gridDim.y;
  for (int64_t i = from * n + blockIdx.y * blockDim.x + threadIdx.x; i < to * n; i += stride)
    y[i] = T(0);
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF32: return CUDA_R_32F;
    case DType::kF64: return CUDA_R_64F;
    default:
      MT_THROW(ValueError, "grouped GEMM on CUDA: expected bfloat16, float32 or float64, found {}",
               dtype_name(d));
  }
}

// The groups must lie inside the buffer and not overlap, as the CPU kernel checks.
void check_host_groups(const int32_t* g, int64_t e, int64_t rows, const char* op) {
  int64_t end = 0;
  for (int64_t x = 0; x < e; ++x) {
    const int64_t start = g[x], count = g[e + x];
    MT_CHECK_T(ValueError, count >= 0 && start >= end && start + count <= rows,
               "{}: expert {} group [{}, {}) is not inside the buffer's {} rows after the previous "
               "group's end {}",
               op, x, start, start + count, rows, end);
    end = start + count;
  }
}

// Per-node state made at prepare time: the pinned copy of the groups and the cuBLAS handle.
struct GroupedState {
  int device = 0;
  int64_t experts = 0;
  int32_t* host_groups = nullptr;  // pinned, [2, E]
  cublasHandle_t handle = nullptr;
  DType dtype = DType::kF32;
  GroupedState(int64_t e, DType dt) : experts(e), dtype(dt) {
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaMallocHost(&host_groups, size_t(2 * std::max<int64_t>(e, 1)) * 4));
    handle = blas_handle(device);
  }
  ~GroupedState() { cudaFreeHost(host_groups); }
  GroupedState(const GroupedState&) = delete;
  GroupedState& operator=(const GroupedState&) = delete;

  // Copies the groups to the host and binds the handle to the node's stream and workspace.
  void begin(KernelContext& c, const Tensor& groups, int64_t rows, const char* op) {
    cudaStream_t s = stream_of(c);
    CUDA_CHECK(cudaMemcpyAsync(host_groups, groups.raw(), size_t(2 * experts) * 4,
                               cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));  // see the header comment
    check_host_groups(host_groups, experts, rows, op);
    CUBLAS_CHECK(cublasSetStream(handle, s));
    // cublasSetStream resets the workspace to cuBLAS's own pool: set the plan's after it.
    CUBLAS_CHECK(cublasSetWorkspace(handle, c.workspace.defined() ? c.workspace.raw() : nullptr,
                                    c.workspace.defined() ? c.workspace.nbytes() : 0));
  }

  // Column-major C[m, n] = op(A) op(B) with beta 0.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
            const void* a, int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc) const {
    const float alpha32 = 1.0f, beta32 = 0.0f;
    const double alpha64 = 1.0, beta64 = 0.0;
    const bool f64 = dtype == DType::kF64;
    const cudaDataType_t t = cuda_type(dtype);
    CUBLAS_CHECK(cublasGemmEx(
        handle, ta, tb, int(m), int(n), int(k), f64 ? static_cast<const void*>(&alpha64) : &alpha32,
        a, t, int(lda), b, t, int(ldb), f64 ? static_cast<const void*>(&beta64) : &beta32, c, t,
        int(ldc), f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
};

template <typename T>
void zero_outside(const Tensor& groups, int64_t e, int64_t rows, int64_t n, void* y,
                  cudaStream_t s) {
  zero_outside_groups_kernel<T><<<dim3(unsigned(e + 1), 16), 256, 0, s>>>(
      static_cast<const int32_t*>(groups.raw()), e, rows, n, static_cast<T*>(y));
  CUDA_CHECK_LAUNCH("grouped_matmul_zero_outside_groups");
}

void launch_zero_outside(DType dt, const Tensor& groups, int64_t e, int64_t rows, int64_t n,
                         void* y, cudaStream_t s) {
  switch (dt) {
    case DType::kBF16: return zero_outside<bf16>(groups, e, rows, n, y, s);
    case DType::kF32: return zero_outside<float>(groups, e, rows, n, y, s);
    case DType::kF64: return zero_outside<double>(groups, e, rows, n, y, s);
    default: cuda_type(dt);  // throws
  }
}

KernelFn make_grouped_matmul(const Node& node, const Graph& graph) {
  const TensorMeta& xm = graph.value(node.inputs.at(0)).meta;
  const TensorMeta& wm = graph.value(node.inputs.at(1)).meta;
  cuda_type(xm.dtype);
  auto st = std::make_shared<GroupedState>(wm.shape[0], xm.dtype);
  const bool tw = node.attrs.b("transpose_w");
  return [st, tw](KernelContext& c) {
    const int64_t rows = c.in[0].shape()[0], k = c.in[0].shape()[1];
    const int64_t e = st->experts, n = c.out[0].shape()[1];
    const size_t elem = dtype_size(st->dtype);
    st->begin(c, c.in[2], rows, "grouped_matmul");
    const char* x = static_cast<const char*>(c.in[0].raw());
    const char* w = static_cast<const char*>(c.in[1].raw());
    char* y = static_cast<char*>(c.out[0].raw());
    for (int64_t ex = 0; ex < e; ++ex) {
      const int64_t start = st->host_groups[ex], count = st->host_groups[e + ex];
      if (count == 0 || n == 0) continue;
      // Row-major y_e[count, n] = x_e[count, k] · op(w_e); column-major: y_eᵀ = op(w_e)ᵀ x_eᵀ.
      // w_e is [n, k] (tw: y = x wᵀ, cuBLAS A = w_e transposed, lda k) or [k, n] (lda n).
      const char* we = w + size_t(ex * n * k) * elem;
      if (k == 0) {
        CUDA_CHECK(cudaMemsetAsync(y + size_t(start * n) * elem, 0, size_t(count * n) * elem,
                                   stream_of(c)));
        continue;
      }
      st->gemm(tw ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, n, count, k, we, tw ? k : n,
               x + size_t(start * k) * elem, k, y + size_t(start * n) * elem, n);
    }
    if (n > 0) launch_zero_outside(st->dtype, c.in[2], e, rows, n, y, stream_of(c));
  };
}

KernelFn make_grouped_wgrad(const Node& node, const Graph& graph) {
  const TensorMeta& am = graph.value(node.inputs.at(0)).meta;
  const TensorMeta& gm = graph.value(node.inputs.at(2)).meta;
  cuda_type(am.dtype);
  auto st = std::make_shared<GroupedState>(gm.shape[1], am.dtype);
  return [st](KernelContext& c) {
    const int64_t rows = c.in[0].shape()[0], p = c.in[0].shape()[1], q = c.in[1].shape()[1];
    const int64_t e = st->experts;
    const size_t elem = dtype_size(st->dtype);
    st->begin(c, c.in[2], rows, "grouped_matmul_wgrad");
    const char* a = static_cast<const char*>(c.in[0].raw());
    const char* b = static_cast<const char*>(c.in[1].raw());
    char* out = static_cast<char*>(c.out[0].raw());
    for (int64_t ex = 0; ex < e; ++ex) {
      const int64_t start = st->host_groups[ex], count = st->host_groups[e + ex];
      char* oe = out + size_t(ex * p * q) * elem;
      if (p == 0 || q == 0) continue;
      if (count == 0) {
        CUDA_CHECK(cudaMemsetAsync(oe, 0, size_t(p * q) * elem, stream_of(c)));
        continue;
      }
      // Row-major out_e[p, q] = a_eᵀ b_e; column-major: out_eᵀ[q, p] = b_eᵀ · a_e, where b_e
      // stored row-major [count, q] is column-major b_eᵀ (ld q) and a_e is column-major a_eᵀ
      // (ld p), used transposed.
      st->gemm(CUBLAS_OP_N, CUBLAS_OP_T, q, p, count, b + size_t(start * q) * elem, q,
               a + size_t(start * p) * elem, p, oe, q);
    }
  };
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_kernel_factory("grouped_matmul", DeviceType::kCUDA,
                                            make_grouped_matmul);
  OpRegistry::instance().add_kernel_factory("grouped_matmul_wgrad", DeviceType::kCUDA,
                                            make_grouped_wgrad);
}

}  // namespace
}  // namespace meshtrain::cuda
