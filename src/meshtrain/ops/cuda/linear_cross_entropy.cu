// CUDA linear_cross_entropy and scale_by / scale_by_accumulate. Per chunk of rows: a cuBLASLt GEMM
// writes the logits h_c wᵀ into a float32 workspace block (float64 for float64); one block per row
// takes its (max, Σexp) (cross_entropy_rows.cuh), writes its loss (float64) and overwrites the row
// in place with (softmax - onehot) / count in the operands' dtype (bf16 over the front of the row's
// float32 bytes); then cuBLASLt dh_c = g w and dw (+)= gᵀ h_c. The loss is the deterministic
// two-pass reduction of the row losses. Fixed algorithms, no atomics: bitwise repeatable.
#include <cuda_runtime_api.h>

#include "meshtrain/ops/cuda/cross_entropy_rows.cuh"
#include "meshtrain/ops/cuda/cublaslt_matmul.h"
#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/cuda_workspace.h"
#include "meshtrain/ops/cuda/reduce.cuh"
#include "meshtrain/ops/linear_cross_entropy.h"

namespace meshtrain::cuda {
namespace {

constexpr int kTile = 4;  // elements per thread in each tile of a row's gradient pass

// X: the logits' type (float, or double for float64 operands); G: the operands' type, which the
// gradient GEMMs read. Row r's gradient is written as G over the first bytes of its X row, so its
// row stride in G elements is v · sizeof(X) / sizeof(G).
template <typename X, typename G>
__global__ void __launch_bounds__(kRowThreads)
    lce_rows_kernel(X* __restrict__ logits, const int32_t* __restrict__ labels,
                    const int64_t* __restrict__ count, double* __restrict__ row_loss, int64_t v,
                    int64_t ignore, bool grads) {
  constexpr int V = 16 / int(sizeof(X));
  const int64_t r = blockIdx.x;
  X* xr = logits + r * v;
  G* gr = reinterpret_cast<G*>(xr);
  const int32_t label = labels[r];
  if (label == ignore) {  // uniform over the block: no barrier is skipped by part of it
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    if (grads)
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) gr[j] = from_acc<G>(X(0));
    return;
  }
  MT_DEVICE_CHECK(label >= 0 && label < v,
                  "linear_cross_entropy: a label is outside [0, V) and is not ignore_index");
  const int64_t n = count[0];
  MT_DEVICE_CHECK(n > 0, "linear_cross_entropy: token_count must be positive");
  // The workspace is 256-byte aligned, so rows of a multiple of V elements are 16-byte aligned.
  const MaxSum<X> st = v % V == 0 ? row_max_sum<V>(xr, v) : row_max_sum<1>(xr, v);
  if (threadIdx.x == 0) row_loss[r] = double(st.m) + log(double(st.s)) - double(xr[label]);
  if (!grads) return;
  __syncthreads();  // the label's logit is read before the writes below may land on it
  const X f = X(1.0 / double(n));  // the gradient for dloss = 1
  const X scale = f / st.s;        // softmax = exp(x - max) / Σ
  const int64_t step = int64_t(blockDim.x) * kTile;
  for (int64_t base = 0; base < v; base += step) {
    X d[kTile];
#pragma unroll
    for (int k = 0; k < kTile; ++k) {
      const int64_t j = base + int64_t(k) * blockDim.x + threadIdx.x;
      d[k] = j < v ? exp(xr[j] - st.m) * scale - (j == label ? f : X(0)) : X(0);
    }
    // This tile's G writes land on X elements below base + step: all read by now, once the
    // whole block has read this tile (earlier tiles were read before earlier barriers).
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) {
      const int64_t j = base + int64_t(k) * blockDim.x + threadIdx.x;
      if (j < v) gr[j] = from_acc<G>(d[k]);
    }
  }
}

template <typename X, typename S, typename O>
__global__ void scale_kernel(const X* __restrict__ x, const S* __restrict__ s, O* __restrict__ out,
                             int64_t n, bool accumulate) {
  using A = acc_t<O>;
  const A k = A(to_acc(s[0]));
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    // A rounded product, then the add (no FMA contraction): what the CPU kernel computes.
    A y;
    if constexpr (std::is_same_v<A, double>)
      y = __dmul_rn(A(to_acc(x[i])), k);
    else
      y = __fmul_rn(A(to_acc(x[i])), k);
    if (accumulate) y += A(to_acc(out[i]));
    out[i] = from_acc<O>(y);
  }
}

// out (+)= x · s[0], each of the three tensors in its own floating dtype.
void launch_scale(const Tensor& x, const Tensor& s, void* out, DType out_dtype, bool accumulate,
                  cudaStream_t stream) {
  const int64_t n = x.numel();
  if (n == 0) return;
  MT_DISPATCH_CUDA_FLOAT(x.dtype(), "scale_by x", [&] {
    using X = scalar_t;
    MT_DISPATCH_CUDA_FLOAT(s.dtype(), "scale_by scale", [&] {
      using S = scalar_t;
      MT_DISPATCH_CUDA_FLOAT(out_dtype, "scale_by output", [&] {
        scale_kernel<X, S, scalar_t><<<grid_for(n, 256), 256, 0, stream>>>(
            static_cast<const X*>(x.raw()), static_cast<const S*>(s.raw()),
            static_cast<scalar_t*>(out), n, accumulate);
      });
    });
  });
  CUDA_CHECK_LAUNCH("scale_by");
}

struct LceShape {
  int64_t n, d, v, chunk;
  DType dt;    // h and w
  DType wide;  // logits, loss and dw: float32 for bf16, else dt
};

LceShape lce_shape(const TensorMeta& h, const TensorMeta& w, int64_t chunk_rows) {
  const int64_t n = h.shape[0];
  return {n,          h.shape[1],
          w.shape[0], std::max<int64_t>(1, std::min(chunk_rows, n)),
          h.dtype,    h.dtype == DType::kBF16 ? DType::kF32 : h.dtype};
}

// Workspace: the GEMMs' scratch, the logits block [chunk, v] (wide), the row losses and the
// reduction's partials.
size_t logits_bytes(const LceShape& s) {
  return align_ws(size_t(s.chunk * s.v) * dtype_size(s.wide));
}
size_t lce_workspace_bytes(const LceShape& s) {
  return kGemmWorkspaceBytes + logits_bytes(s) + cross_entropy_workspace_bytes(s.n);
}

// The four GEMMs of a chunk of `rows` rows.
struct ChunkPlans {
  std::shared_ptr<const GemmPlan> logits, dh, dw_first, dw_add;
};

ChunkPlans chunk_plans(int device, const LceShape& s, int64_t rows, bool grads) {
  ChunkPlans p;
  GemmProblem lg = gemm_problem(s.dt, false, true, rows, s.v, s.d);
  lg.out = s.wide;
  p.logits = gemm_plan(device, lg, kGemmWorkspaceBytes);
  if (!grads) return p;
  // The gradient's row stride: G elements over rows of v wide elements.
  const int64_t ldg = s.v * int64_t(dtype_size(s.wide) / dtype_size(s.dt));
  GemmProblem dh{.dtype = s.dt,
                 .m = rows,
                 .n = s.d,
                 .k = s.v,
                 .lda = ldg,
                 .ldb = s.d,
                 .ldc = s.d,
                 .out = s.dt};
  p.dh = gemm_plan(device, dh, kGemmWorkspaceBytes);
  GemmProblem dw{.dtype = s.dt,
                 .ta = true,
                 .m = s.v,
                 .n = s.d,
                 .k = rows,
                 .lda = ldg,
                 .ldb = s.d,
                 .ldc = s.d,
                 .out = s.wide};
  p.dw_first = gemm_plan(device, dw, kGemmWorkspaceBytes);
  dw.accumulate = true;
  p.dw_add = gemm_plan(device, dw, kGemmWorkspaceBytes);
  return p;
}

template <typename X, typename G>
void launch_rows(void* logits, const int32_t* labels, const int64_t* count, double* row_loss,
                 int64_t rows, int64_t v, int64_t ignore, bool grads, cudaStream_t s) {
  lce_rows_kernel<X, G><<<unsigned(rows), kRowThreads, 0, s>>>(static_cast<X*>(logits), labels,
                                                               count, row_loss, v, ignore, grads);
  CUDA_CHECK_LAUNCH("linear_cross_entropy_rows");
}

KernelFn make_lce_kernel(const Node& node, const Graph& graph) {
  const TensorMeta& hm = graph.value(node.inputs.at(0)).meta;
  const TensorMeta& wm = graph.value(node.inputs.at(1)).meta;
  const LceShape s = lce_shape(hm, wm, node.attrs.i("chunk_rows"));
  const bool grads = node.attrs.b("grads");
  const int64_t ignore = node.attrs.i("ignore_index");
  MT_CHECK_T(ValueError, s.d > 0, "linear_cross_entropy at '{}' on CUDA: D must be positive",
             node.scope);
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));  // the backend made its device current before prepare()
  const ChunkPlans full = chunk_plans(device, s, s.chunk, grads);
  const int64_t tail_rows = s.n % s.chunk;
  const ChunkPlans tail = tail_rows > 0 ? chunk_plans(device, s, tail_rows, grads) : full;
  auto rows_fn = s.dt == DType::kBF16  ? launch_rows<float, bf16>
                 : s.dt == DType::kF32 ? launch_rows<float, float>
                                       : launch_rows<double, double>;
  return [=](KernelContext& c) {
    const cudaStream_t st = stream_of(c);
    char* ws = static_cast<char*>(c.workspace.raw());
    void* gemm_ws = ws;
    char* logits = ws + kGemmWorkspaceBytes;
    double* row_loss = reinterpret_cast<double*>(logits + logits_bytes(s));
    double* partials =
        reinterpret_cast<double*>(reinterpret_cast<char*>(row_loss) + cross_entropy_row_bytes(s.n));
    const char* h = static_cast<const char*>(c.in[0].raw());
    const void* w = c.in[1].raw();
    const int32_t* labels = in_ptr<int32_t>(c, 2);
    const int64_t* count = in_ptr<int64_t>(c, 3);
    char* dh = grads ? static_cast<char*>(c.out[1].raw()) : nullptr;
    void* dw = grads ? c.out[2].raw() : nullptr;
    const size_t row_bytes = size_t(s.d) * dtype_size(s.dt);
    for (int64_t r0 = 0; r0 < s.n; r0 += s.chunk) {
      const int64_t rows = std::min(s.chunk, s.n - r0);
      const ChunkPlans& p = rows == s.chunk ? full : tail;
      const char* hc = h + size_t(r0) * row_bytes;
      p.logits->run(hc, w, logits, gemm_ws, kGemmWorkspaceBytes, st);
      rows_fn(logits, labels + r0, count, row_loss + r0, rows, s.v, ignore, grads, st);
      if (!grads) continue;
      p.dh->run(logits, w, dh + size_t(r0) * row_bytes, gemm_ws, kGemmWorkspaceBytes, st);
      (r0 == 0 ? p.dw_first : p.dw_add)->run(logits, hc, dw, gemm_ws, kGemmWorkspaceBytes, st);
    }
    if (grads && s.n == 0) {
      CUDA_CHECK(cudaMemsetAsync(dw, 0, c.out[2].nbytes(), st));
    }
    if (s.wide == DType::kF64)
      launch_reduce(row_loss, s.n, partials, out_ptr<double>(c, 0), IdentityOp{}, st, count);
    else
      launch_reduce(row_loss, s.n, partials, out_ptr<float>(c, 0), IdentityOp{}, st, count);
  };
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_kernel_factory(
      ops::kLinearCrossEntropyOp, DeviceType::kCUDA, make_lce_kernel,
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs& at) {
        return lce_workspace_bytes(lce_shape(in.at(0), in.at(1), at.i("chunk_rows")));
      });
  add_cuda_kernel(ops::kScaleByOp, [](KernelContext& c) {
    launch_scale(c.in[0], c.in[1], c.out[0].raw(), c.out[0].dtype(), false, stream_of(c));
  });
  add_cuda_kernel(ops::kScaleByAccumulateOp, [](KernelContext& c) {
    launch_scale(c.in[1], c.in[2], c.in[0].raw(), c.in[0].dtype(), !c.attrs().b("overwrite"),
                 stream_of(c));
  });
}

}  // namespace
}  // namespace meshtrain::cuda
