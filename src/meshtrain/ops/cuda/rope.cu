// CUDA rope kernels. rope_table: the frequencies are resolved on the host when the executor
// prepares the graph (as on the CPU) and travel as a kernel parameter; cos/sin are evaluated in
// float64 and rounded once. rope: one thread per (x0, x1) pair of the row (pairs before the
// rotated window are copied), math in float (double for float64); the table may be float32
// while x is bf16 (llama3 keeps its table in float32).
#include "meshtrain/ops/cuda/cuda_kernel.h"
#include "meshtrain/ops/rope.h"

namespace meshtrain::cuda {
namespace {

constexpr int kMaxRopeFreqs = 1024;  // rot_dim <= 2048; 8 KiB of kernel parameters
struct RopeFreqs {
  double f[kMaxRopeFreqs];
};

template <typename T>
__global__ void rope_table_kernel(const RopeFreqs freqs, int64_t half, int64_t seq_len,
                                  T* __restrict__ table) {
  const int64_t n = seq_len * half;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int64_t t = p / half, i = p % half;
    const double angle = double(t) * freqs.f[i];
    table[2 * p] = from_acc<T>(cos(angle));
    table[2 * p + 1] = from_acc<T>(sin(angle));
  }
}

// (x0 + i x1) · (cos + i sin), with sin negated for the inverse rotation, for the pairs of
// columns [start, start + 2 half) of each row of `row_pairs` pairs; the other pairs are copied.
// I: 32-bit indices when every pair index fits (cheaper divisions).
template <typename T, typename TT, typename I>
__global__ void rope_kernel(const T* __restrict__ x, const TT* __restrict__ table,
                            T* __restrict__ y, I pairs, I s, I h, I row_pairs, I first, I half,
                            bool inverse) {
  using A = acc_t<T>;
  const I stride = I(gridDim.x) * blockDim.x;
  for (I p = I(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += stride) {
    const I row = p / row_pairs, j = p - row * row_pairs;
    if (j < first) {
      y[2 * p] = x[2 * p];
      y[2 * p + 1] = x[2 * p + 1];
      continue;
    }
    const I i = j - first;
    const I si = (row / h) % s;
    const TT* cs = table + (si * half + i) * 2;
    const A c = A(to_acc(cs[0]));
    const A sn = inverse ? -A(to_acc(cs[1])) : A(to_acc(cs[1]));
    const A x0 = to_acc(x[2 * p]), x1 = to_acc(x[2 * p + 1]);
    y[2 * p] = from_acc<T>(x0 * c - x1 * sn);
    y[2 * p + 1] = from_acc<T>(x0 * sn + x1 * c);
  }
}

template <typename T, typename TT>
void launch_rope(const Tensor& x, const Tensor& table, const Tensor& y, int64_t start, bool inverse,
                 cudaStream_t st) {
  const Shape& sh = x.shape();
  const int64_t row_pairs = sh[3] / 2, first = start / 2, half = row_pairs - first;
  const int64_t pairs = sh.numel() / 2;
  if (pairs == 0) return;
  const unsigned grid = grid_for(pairs, 256);
  const T* xp = static_cast<const T*>(x.raw());
  const TT* tp = static_cast<const TT*>(table.raw());
  T* yp = static_cast<T*>(y.raw());
  if (2 * pairs + int64_t(grid) * 256 < (int64_t(1) << 31))
    rope_kernel<T, TT, uint32_t><<<grid, 256, 0, st>>>(xp, tp, yp, uint32_t(pairs), uint32_t(sh[1]),
                                                       uint32_t(sh[2]), uint32_t(row_pairs),
                                                       uint32_t(first), uint32_t(half), inverse);
  else
    rope_kernel<T, TT, int64_t>
        <<<grid, 256, 0, st>>>(xp, tp, yp, pairs, sh[1], sh[2], row_pairs, first, half, inverse);
  CUDA_CHECK_LAUNCH("rope");
}

void rope_any(KernelContext& c) {
  const DType xd = c.in[0].dtype(), td = c.in[1].dtype();
  const bool inv = c.attrs().b("inverse");
  const int64_t start = c.attrs().i("start", 0);
  const cudaStream_t st = stream_of(c);
  if (xd == DType::kF32 && td == DType::kF32)
    return launch_rope<float, float>(c.in[0], c.in[1], c.out[0], start, inv, st);
  if (xd == DType::kF64 && td == DType::kF64)
    return launch_rope<double, double>(c.in[0], c.in[1], c.out[0], start, inv, st);
  if (xd == DType::kBF16 && td == DType::kF32)
    return launch_rope<bf16, float>(c.in[0], c.in[1], c.out[0], start, inv, st);
  if (xd == DType::kBF16 && td == DType::kBF16)
    return launch_rope<bf16, bf16>(c.in[0], c.in[1], c.out[0], start, inv, st);
  MT_THROW(ValueError, "rope (cuda): unsupported x/table dtypes {} and {}", xd, td);
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_kernel_factory(
      "rope_table", DeviceType::kCUDA, [](const Node& node, const Graph&) -> KernelFn {
        const Attrs& a = node.attrs;
        std::vector<double> f =
            ops::rope_frequencies(ops::rope_config_from_attrs(a), a.i("rot_dim"), a.i("seq_len"));
        MT_CHECK_T(ValueError, int64_t(f.size()) <= kMaxRopeFreqs,
                   "rope_table (cuda): rot_dim {} exceeds the kernel's limit of {}", a.i("rot_dim"),
                   2 * kMaxRopeFreqs);
        auto freqs = std::make_shared<RopeFreqs>();
        for (size_t i = 0; i < f.size(); ++i) freqs->f[i] = f[i];
        const int64_t half = int64_t(f.size());
        return [freqs, half](KernelContext& c) {
          const int64_t seq = c.out[0].shape()[0];
          if (seq * half == 0) return;
          MT_DISPATCH_CUDA_FLOAT(c.out[0].dtype(), "rope_table", [&] {
            rope_table_kernel<<<grid_for(seq * half, 256), 256, 0, stream_of(c)>>>(
                *freqs, half, seq, out_ptr<scalar_t>(c, 0));
            CUDA_CHECK_LAUNCH("rope_table");
          });
        };
      });
  add_cuda_kernel("rope", rope_any);
}

}  // namespace
}  // namespace meshtrain::cuda
