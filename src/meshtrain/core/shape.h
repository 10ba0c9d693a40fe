// Shape: the extents of a contiguous row-major tensor. Negative extents are never valid.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "meshtrain/core/check.h"

namespace meshtrain {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) { validate(); }
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) { validate(); }

  int rank() const { return int(dims_.size()); }
  int64_t operator[](int i) const { return dims_[normalize(i)]; }
  int64_t& operator[](int i) { return dims_[normalize(i)]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : dims_) n *= d;
    return n;
  }
  // Product of all dims but the last (the "rows" of a row-major matrix view).
  int64_t rows() const { return dims_.empty() ? 1 : numel() / dims_.back(); }
  int64_t last() const { return dims_.empty() ? 1 : dims_.back(); }
  const std::vector<int64_t>& dims() const { return dims_; }
  // Python-style negative index -> [0, rank).
  int normalize(int i) const {
    int r = rank();
    int j = i < 0 ? i + r : i;
    MT_CHECK_T(ShapeError, j >= 0 && j < r, "dimension {} out of range for shape {}", i,
               to_string());
    return j;
  }
  Shape with(int i, int64_t v) const {
    Shape s = *this;
    s[i] = v;
    return s;
  }
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }
  std::string to_string() const;

 private:
  void validate() const {
    for (int64_t d : dims_)
      MT_CHECK_T(ShapeError, d >= 0, "shape extents must be >= 0, found {}", d);
  }
  std::vector<int64_t> dims_;
};

}  // namespace meshtrain

template <>
struct fmt::formatter<meshtrain::Shape> : fmt::formatter<std::string> {
  auto format(const meshtrain::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.to_string(), ctx);
  }
};
