// CPU cross-entropy kernels. Each row's exponentials subtract the row max first; row sums and
// the loss sum accumulate in float64 in row order (deterministic, accurate for float32).
#include <cmath>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

int64_t read_count(const KernelContext& c) {
  int64_t count = in_ptr<int64_t>(c, 2)[0];
  MT_CHECK_T(ValueError, count > 0,
             "cross_entropy: token_count must be positive (the number of labels that are not "
             "ignore_index), found {}",
             count);
  return count;
}

void check_label(int32_t label, int64_t row, int64_t v, int64_t ignore) {
  MT_CHECK_T(ValueError, label >= 0 && label < v,
             "cross_entropy: row {} has label {}, expected a label in [0, {}) or ignore_index {}",
             row, label, v, ignore);
}

template <typename T>
T row_max(const T* x, int64_t v) {
  T m = x[0];
  for (int64_t j = 1; j < v; ++j) m = std::max(m, x[j]);
  return m;
}

// exp runs in T (x - max is exact enough there, and float exp is twice as fast as double);
// the sum accumulates in double.
template <typename T>
double row_logsumexp(const T* x, int64_t v) {
  const T m = row_max(x, v);
  double s = 0;
  for (int64_t j = 0; j < v; ++j) s += double(std::exp(x[j] - m));
  return double(m) + std::log(s);
}

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
    const T* x = logits + r * v;
    const T m = row_max(x, v);
    double s = 0;
    for (int64_t j = 0; j < v; ++j) {
      d[j] = std::exp(x[j] - m);
      s += double(d[j]);
    }
    const double scale = f / s;  // softmax = exp(x - max) / sum, times dloss / count
    for (int64_t j = 0; j < v; ++j) d[j] = T(double(d[j]) * scale);
    d[labels[r]] = T(double(d[labels[r]]) - f);
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
