// CUDA RMSNorm kernels. Forward: one block per row (sum of squares, then y = x·rstd·w). Backward:
// one block per row for dx (it also stores 1/rms per row in the workspace), then dw reduced
// deterministically: column partials per fixed row group, added in group order. Rows and dw
// accumulate in float (double for float64); the dw partials in double.
#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/cuda/cuda_workspace.h"

namespace meshtrain::cuda {
namespace {

int row_threads(int64_t d, int vec) {
  int64_t per = (d / vec + 31) / 32 * 32;
  return int(std::clamp<int64_t>(per, 32, 256));
}

// Σ x² over a row of d elements (V-wide accesses when the row is V-aligned).
template <int V, typename T>
__device__ acc_t<T> row_sum_squares(const T* __restrict__ xr, int64_t d) {
  using A = acc_t<T>;
  A ss = 0;
  for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {
    Pack<T, V> p = *reinterpret_cast<const Pack<T, V>*>(xr + j);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A v = to_acc(p.v[k]);
      ss += v * v;
    }
  }
  return block_sum(ss);
}

template <int V, typename T>
__global__ void rmsnorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                       T* __restrict__ y, int64_t d, double eps) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  T* yr = y + r * d;
  const A ss = row_sum_squares<V>(xr, d);
  // 1/rms, rounded to the storage precision of the arithmetic like the CPU kernel's T(inv_rms).
  const A rstd = A(1) / sqrt(ss / A(d) + A(eps));
  for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {
    Pack<T, V> px = *reinterpret_cast<const Pack<T, V>*>(xr + j);
    Pack<T, V> pw = *reinterpret_cast<const Pack<T, V>*>(w + j);
    Pack<T, V> py;
#pragma unroll
    for (int k = 0; k < V; ++k) py.v[k] = from_acc<T>(to_acc(px.v[k]) * rstd * to_acc(pw.v[k]));
    *reinterpret_cast<Pack<T, V>*>(yr + j) = py;
  }
}

// dx = rstd · (w·dy − xhat · mean(xhat·w·dy)), xhat = x·rstd; stores rstd[r] for the dw pass.
template <int V, typename T>
__global__ void rmsnorm_backward_dx_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                           const T* __restrict__ dy, T* __restrict__ dx,
                                           double* __restrict__ rstd_out, int64_t d, double eps) {
  using A = acc_t<T>;
  const int64_t r = blockIdx.x;
  const T* xr = x + r * d;
  const T* gr = dy + r * d;
  A ss = 0, dot = 0;
  for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {
    Pack<T, V> px = *reinterpret_cast<const Pack<T, V>*>(xr + j);
    Pack<T, V> pw = *reinterpret_cast<const Pack<T, V>*>(w + j);
    Pack<T, V> pg = *reinterpret_cast<const Pack<T, V>*>(gr + j);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A xv = to_acc(px.v[k]);
      ss += xv * xv;
      dot += to_acc(pg.v[k]) * to_acc(pw.v[k]) * xv;
    }
  }
  ss = block_sum(ss);
  dot = block_sum(dot);
  const A rstd = A(1) / sqrt(ss / A(d) + A(eps));
  const A c = dot * rstd / A(d);
  if (threadIdx.x == 0) rstd_out[r] = double(rstd);
  T* dxr = dx + r * d;
  for (int64_t j = int64_t(threadIdx.x) * V; j < d; j += int64_t(blockDim.x) * V) {
    Pack<T, V> px = *reinterpret_cast<const Pack<T, V>*>(xr + j);
    Pack<T, V> pw = *reinterpret_cast<const Pack<T, V>*>(w + j);
    Pack<T, V> pg = *reinterpret_cast<const Pack<T, V>*>(gr + j);
    Pack<T, V> po;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const A xhat = to_acc(px.v[k]) * rstd;
      po.v[k] = from_acc<T>(rstd * (to_acc(pg.v[k]) * to_acc(pw.v[k]) - xhat * c));
    }
    *reinterpret_cast<Pack<T, V>*>(dxr + j) = po;
  }
}

// partial[g][j] = Σ_{r in group g} dy[r][j] · x[r][j] · rstd[r], rows in order.
template <typename T>
__global__ void rmsnorm_dw_partial_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                          const double* __restrict__ rstd,
                                          double* __restrict__ partial, int64_t rows, int64_t d,
                                          int64_t rows_per_group) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t g = blockIdx.y;
  if (j >= d) return;
  const int64_t r0 = g * rows_per_group;
  const int64_t r1 = min(rows, r0 + rows_per_group);
  double acc = 0;
  for (int64_t r = r0; r < r1; ++r)
    acc += double(to_acc(dy[r * d + j])) * double(to_acc(x[r * d + j])) * rstd[r];
  partial[g * d + j] = acc;
}

template <typename T>
__global__ void rmsnorm_dw_finish_kernel(const double* __restrict__ partial, T* __restrict__ dw,
                                         int64_t groups, int64_t d) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d) return;
  double acc = 0;
  for (int64_t g = 0; g < groups; ++g) acc += partial[g * d + j];
  dw[j] = from_acc<T>(acc);
}

template <typename T>
bool can_vectorize(int64_t d, std::initializer_list<const void*> ptrs) {
  constexpr int V = 16 / int(sizeof(T));
  if (d % V != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

template <typename T>
void forward(const T* x, const T* w, T* y, int64_t rows, int64_t d, double eps, cudaStream_t s) {
  if (rows == 0 || d == 0) return;
  constexpr int V = 16 / int(sizeof(T));
  if (can_vectorize<T>(d, {x, w, y}))
    rmsnorm_forward_kernel<V><<<unsigned(rows), row_threads(d, V), 0, s>>>(x, w, y, d, eps);
  else
    rmsnorm_forward_kernel<1><<<unsigned(rows), row_threads(d, 1), 0, s>>>(x, w, y, d, eps);
  CUDA_CHECK_LAUNCH("rmsnorm_forward");
}

template <typename T>
void backward(const T* x, const T* w, const T* dy, T* dx, T* dw, void* ws, int64_t rows, int64_t d,
              double eps, cudaStream_t s) {
  if (d == 0) return;
  if (rows == 0) {
    // No rows: dw is an empty sum.
    CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(d) * sizeof(T), s));
    return;
  }
  double* rstd = static_cast<double*>(ws);
  double* partial =
      reinterpret_cast<double*>(static_cast<char*>(ws) + rmsnorm_backward_rstd_bytes(rows));
  constexpr int V = 16 / int(sizeof(T));
  if (can_vectorize<T>(d, {x, w, dy, dx}))
    rmsnorm_backward_dx_kernel<V>
        <<<unsigned(rows), row_threads(d, V), 0, s>>>(x, w, dy, dx, rstd, d, eps);
  else
    rmsnorm_backward_dx_kernel<1>
        <<<unsigned(rows), row_threads(d, 1), 0, s>>>(x, w, dy, dx, rstd, d, eps);
  CUDA_CHECK_LAUNCH("rmsnorm_backward_dx");
  const int64_t groups = rmsnorm_row_groups(rows);
  const int64_t per_group = (rows + groups - 1) / groups;
  const int threads = 256;
  dim3 grid(unsigned((d + threads - 1) / threads), unsigned(groups));
  rmsnorm_dw_partial_kernel<<<grid, threads, 0, s>>>(x, dy, rstd, partial, rows, d, per_group);
  CUDA_CHECK_LAUNCH("rmsnorm_dw_partial");
  rmsnorm_dw_finish_kernel<<<unsigned((d + threads - 1) / threads), threads, 0, s>>>(partial, dw,
                                                                                     groups, d);
  CUDA_CHECK_LAUNCH("rmsnorm_dw_finish");
}

MT_REGISTER_OPS {
  add_cuda_kernel("rmsnorm", [](KernelContext& c) {
    const Shape& sh = c.in[0].shape();
    MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "rmsnorm", [&] {
      forward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), out_ptr<scalar_t>(c, 0), sh.rows(),
              sh.last(), c.attrs().f("eps"), stream_of(c));
    });
  });
  // Scratch: 1/rms per row and per-row-group column partials of dw (a deterministic reduction).
  add_cuda_kernel(
      "rmsnorm_backward",
      [](KernelContext& c) {
        const Shape& sh = c.in[0].shape();
        MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "rmsnorm_backward", [&] {
          backward(in_ptr<scalar_t>(c, 0), in_ptr<scalar_t>(c, 1), in_ptr<scalar_t>(c, 2),
                   out_ptr<scalar_t>(c, 0), out_ptr<scalar_t>(c, 1),
                   c.workspace.defined() ? c.workspace.raw() : nullptr, sh.rows(), sh.last(),
                   c.attrs().f("eps"), stream_of(c));
        });
      },
      [](const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&, const Attrs&) {
        return rmsnorm_backward_workspace_bytes(in[0].shape.rows(), in[0].shape.last());
      });
}

}  // namespace
}  // namespace meshtrain::cuda
