// CPU cross-entropy kernels over materialised logits (the row math is cross_entropy_rows.h); the
// loss sum accumulates in float64 in row order (deterministic, accurate for float32).
#include "meshtrain/ops/cpu/cpu_kernel.h"
#include "meshtrain/ops/cpu/cross_entropy_rows.h"

namespace meshtrain::cpu {
namespace {

int64_t read_count(const KernelContext& c) { return checked_count(in_ptr<int64_t>(c, 2)[0]); }

template <typename T>
void ce_forward(const T* logits, const int32_t* labels, T* loss, int64_t n, int64_t v,
                int64_t ignore, int64_t count) {
  double total = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (labels[r] == ignore) continue;
    check_label(labels[r], r, v, ignore);
    const T* x = logits + r * v;
    total += row_logsumexp(x, v) - double(x[labels[r]]);
  }
  loss[0] = T(total / double(count));
}

template <typename T>
void ce_backward(const T* logits, const int32_t* labels, const T* dloss, T* dx, int64_t n,
                 int64_t v, int64_t ignore, int64_t count) {
  const double f = double(dloss[0]) / double(count);
  for (int64_t r = 0; r < n; ++r) {
    T* d = dx + r * v;
    if (labels[r] == ignore) {
      std::fill_n(d, v, T(0));
      continue;
    }
    check_label(labels[r], r, v, ignore);
    row_softmax_grad(logits + r * v, d, v, labels[r], f);
  }
}

MT_REGISTER_OPS {
  add_cpu_kernel("cross_entropy", [](KernelContext& c) {
    const Shape& s = c.in[0].shape();
    const int64_t count = read_count(c);
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "cross_entropy", [&] {
      ce_forward(in_ptr<scalar_t>(c, 0), in_ptr<int32_t>(c, 1), out_ptr<scalar_t>(c, 0), s[0], s[1],
                 c.attrs().i("ignore_index"), count);
    });
  });
  add_cpu_kernel("cross_entropy_backward", [](KernelContext& c) {
    const Shape& s = c.in[0].shape();
    const int64_t count = read_count(c);
    MT_DISPATCH_FLOAT(c.out[0].dtype(), "cross_entropy_backward", [&] {
      ce_backward(in_ptr<scalar_t>(c, 0), in_ptr<int32_t>(c, 1), in_ptr<scalar_t>(c, 3),
                  out_ptr<scalar_t>(c, 0), s[0], s[1], c.attrs().i("ignore_index"), count);
    });
  });
}

}  // namespace
}  // namespace meshtrain::cpu
