// The row math of the CPU cross-entropy kernels (cross_entropy and linear_cross_entropy): the
// label check, a row's logsumexp and its softmax-minus-onehot gradient. Exponentials subtract the
// row max first and run in T; row sums accumulate in float64 in column order (deterministic).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "meshtrain/core/check.h"

namespace meshtrain::cpu {

inline void check_label(int32_t label, int64_t row, int64_t v, int64_t ignore) {
  MT_CHECK_T(ValueError, label >= 0 && label < v,
             "cross_entropy: row {} has label {}, expected a label in [0, {}) or ignore_index {}",
             row, label, v, ignore);
}

// The count a loss is divided by, read from its tensor (data, so checked at run time).
inline int64_t checked_count(int64_t count) {
  MT_CHECK_T(ValueError, count > 0,
             "cross_entropy: token_count must be positive (the number of labels that are not "
             "ignore_index), found {}",
             count);
  return count;
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

// d = (softmax(x) - onehot(label)) · f. d may be x itself (each x[j] is read before d[j] is
// written, and the max before either).
template <typename T>
void row_softmax_grad(const T* x, T* d, int64_t v, int32_t label, double f) {
  const T m = row_max(x, v);
  double s = 0;
  for (int64_t j = 0; j < v; ++j) {
    d[j] = std::exp(x[j] - m);
    s += double(d[j]);
  }
  const double scale = f / s;  // softmax = exp(x - max) / sum, times f
  for (int64_t j = 0; j < v; ++j) d[j] = T(double(d[j]) * scale);
  d[label] = T(double(d[label]) - f);
}

}  // namespace meshtrain::cpu
