// CUDA cross-entropy kernels, fused and streamed over the vocabulary: one block per row keeps a
// running (max, Σexp) per thread while it reads the row once in chunks (an online logsumexp,
// cross_entropy_rows.cuh), so no float32 copy of bf16 logits is ever made. Forward writes each
// row's loss (float64) to the workspace, then a deterministic two-pass reduction divides the sum by
// the device token count. Backward recomputes the row's (max, Σexp) the same way and writes softmax
// - onehot, scaled.
#include "meshtrain/ops/cuda/cross_entropy_rows.cuh"
#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/cuda_workspace.h"
#include "meshtrain/ops/cuda/reduce.cuh"

namespace meshtrain::cuda {
namespace {

template <int V, typename T>
__global__ void __launch_bounds__(kRowThreads)
    ce_row_loss_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels,
                       double* __restrict__ row_loss, int64_t v, int64_t ignore) {
  const int64_t r = blockIdx.x;
  const int32_t label = labels[r];
  if (label == ignore) {  // uniform over the block: no barrier is skipped by part of it
    if (threadIdx.x == 0) row_loss[r] = 0.0;
    return;
  }
  MT_DEVICE_CHECK(label >= 0 && label < v,
                  "cross_entropy: a label is outside [0, V) and is not ignore_index");
  const T* xr = logits + r * v;
  const auto st = row_max_sum<V>(xr, v);
  if (threadIdx.x == 0) row_loss[r] = double(st.m) + log(double(st.s)) - double(to_acc(xr[label]));
}

template <int V, typename T, typename G>
__global__ void __launch_bounds__(kRowThreads)
    ce_backward_kernel(const T* __restrict__ logits, const int32_t* __restrict__ labels,
                       const int64_t* __restrict__ count, const G* __restrict__ dloss,
                       T* __restrict__ dx, int64_t v, int64_t ignore) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const int32_t label = labels[r];
  T* dr = dx + r * v;
  if (label == ignore) {
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) dr[j] = from_acc<T>(A(0));
    return;
  }
  MT_DEVICE_CHECK(label >= 0 && label < v,
                  "cross_entropy_backward: a label is outside [0, V) and is not ignore_index");
  const int64_t n = count[0];
  MT_DEVICE_CHECK(n > 0, "cross_entropy_backward: token_count must be positive");
  const T* xr = logits + r * v;
  const auto st = row_max_sum<V>(xr, v);
  const A f = A(double(to_acc(dloss[0])) / double(n));  // dloss / count
  const A scale = f / st.s;                             // softmax = exp(x - max) / Σ
  for (int64_t j = int64_t(threadIdx.x) * V; j < v; j += int64_t(blockDim.x) * V) {
    Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(xr + j);
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A d = exp(A(to_acc(p.v[k])) - st.m) * scale;
      if (j + k == label) d -= f;
      o.v[k] = from_acc<T>(d);
    }
    *reinterpret_cast<Pack<T, V>*>(dr + j) = o;
  }
}

template <typename T>
bool vectorizable(int64_t v, const void* a, const void* b = nullptr) {
  constexpr int V = 16 / int(sizeof(T));
  return v % V == 0 && aligned16(a) && (b == nullptr || aligned16(b));
}

template <typename T>
void forward(const KernelContext& c, cudaStream_t s) {
  const Shape& sh = c.in[0].shape();
  const int64_t rows = sh[0], v = sh[1];
  const T* logits = in_ptr<T>(c, 0);
  const int32_t* labels = in_ptr<int32_t>(c, 1);
  const int64_t* count = in_ptr<int64_t>(c, 2);
  const int64_t ignore = c.attrs().i("ignore_index");
  char* ws = static_cast<char*>(c.workspace.raw());
  double* row_loss = reinterpret_cast<double*>(ws);
  double* partials = reinterpret_cast<double*>(ws + cross_entropy_row_bytes(rows));
  if (rows > 0) {
    constexpr int V = 16 / int(sizeof(T));
    if (vectorizable<T>(v, logits))
      ce_row_loss_kernel<V>
          <<<unsigned(rows), kRowThreads, 0, s>>>(logits, labels, row_loss, v, ignore);
    else
      ce_row_loss_kernel<1>
          <<<unsigned(rows), kRowThreads, 0, s>>>(logits, labels, row_loss, v, ignore);
    CUDA_CHECK_LAUNCH("cross_entropy_rows");
  }
  // The loss is float32 for bf16 logits, else the logits' dtype.
  if (c.out[0].dtype() == DType::kF64)
    launch_reduce(row_loss, rows, partials, out_ptr<double>(c, 0), IdentityOp{}, s, count);
  else
    launch_reduce(row_loss, rows, partials, out_ptr<float>(c, 0), IdentityOp{}, s, count);
}

template <typename T, typename G>
void backward(const KernelContext& c, cudaStream_t s) {
  const Shape& sh = c.in[0].shape();
  const int64_t rows = sh[0], v = sh[1];
  if (rows == 0) return;
  const T* logits = in_ptr<T>(c, 0);
  T* dx = out_ptr<T>(c, 0);
  constexpr int V = 16 / int(sizeof(T));
  const int64_t ignore = c.attrs().i("ignore_index");
  if (vectorizable<T>(v, logits, dx))
    ce_backward_kernel<V, T, G><<<unsigned(rows), kRowThreads, 0, s>>>(
        logits, in_ptr<int32_t>(c, 1), in_ptr<int64_t>(c, 2), in_ptr<G>(c, 3), dx, v, ignore);
  else
    ce_backward_kernel<1, T, G><<<unsigned(rows), kRowThreads, 0, s>>>(
        logits, in_ptr<int32_t>(c, 1), in_ptr<int64_t>(c, 2), in_ptr<G>(c, 3), dx, v, ignore);
  CUDA_CHECK_LAUNCH("cross_entropy_backward");
}

MT_REGISTER_OPS {
  // Scratch: one float64 loss per row, then the deterministic reduction's partials.
  add_cuda_kernel(
      "cross_entropy",
      [](KernelContext& c) {
        MT_DISPATCH_CUDA_FLOAT(c.in[0].dtype(), "cross_entropy",
                               [&] { forward<scalar_t>(c, stream_of(c)); });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs&) {
        return cross_entropy_workspace_bytes(in[0].shape[0]);
      });
  add_cuda_kernel("cross_entropy_backward", [](KernelContext& c) {
    // dloss has the loss's dtype: float32 for bf16 logits, else the logits' dtype.
    switch (c.in[0].dtype()) {
      case DType::kF32: return backward<float, float>(c, stream_of(c));
      case DType::kF64: return backward<double, double>(c, stream_of(c));
      case DType::kBF16: return backward<bf16, float>(c, stream_of(c));
      default:
        MT_THROW(ValueError, "cross_entropy_backward (cuda): logits must be floating, found {}",
                 c.in[0].dtype());
    }
  });
}

}  // namespace
}  // namespace meshtrain::cuda
