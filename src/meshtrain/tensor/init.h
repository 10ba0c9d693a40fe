// Parameter initialisers defined on the global tensor. `init_local` fills any local piece of a
// global tensor (a block of rows, or a block of columns of every row) with exactly the values
// that piece has in the full tensor, so sharded runs start from the 1-rank run's weights.
#pragma once

#include <string>
#include <vector>

#include "meshtrain/core/shape.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain {

struct InitSpec {
  enum class Kind : uint8_t { kZeros, kOnes, kConstant, kNormal, kTruncNormal };
  Kind kind = Kind::kZeros;
  double mean = 0.0, std = 1.0;
  double a = -2.0, b = 2.0;  // truncation bounds (absolute values, as torch.nn.init.trunc_normal_)
  double value = 0.0;        // kConstant

  static InitSpec zeros() { return {}; }
  static InitSpec ones() { return {.kind = Kind::kOnes}; }
  static InitSpec constant(double v) { return {.kind = Kind::kConstant, .value = v}; }
  static InitSpec normal(double std, double mean = 0.0) {
    return {.kind = Kind::kNormal, .mean = mean, .std = std};
  }
  static InitSpec trunc_normal(double std, double a = -2.0, double b = 2.0) {
    return {.kind = Kind::kTruncNormal, .std = std, .a = a, .b = b};
  }
  std::string to_string() const;
};

// Which block of the global tensor a local tensor holds: along each dim d the global indices
// [begin[d], begin[d] + local extent) (dims past begin.size() start at 0). Indices at or past
// limit[d] (default: the global extent) are padding and are zero — a padded FSDP shard of a
// tensor-parallel slice ends where the slice ends, not where the tensor does.
struct LocalPiece {
  std::vector<int64_t> begin;
  std::vector<int64_t> limit;
  int64_t at(int d) const { return d < int(begin.size()) ? begin[size_t(d)] : 0; }
  int64_t limit_at(int d, int64_t global_extent) const {
    return d < int(limit.size()) ? limit[size_t(d)] : global_extent;
  }
  bool is_padding(const std::vector<int64_t>& global_index, const Shape& global) const;
};

// Fills host tensor `local` (float32 or float64) with its piece of the global tensor named
// `name` initialised by `spec` from `seed`.
void init_local(const Tensor& local, const Shape& global_shape, const LocalPiece& piece,
                const InitSpec& spec, uint64_t seed, const std::string& name);

}  // namespace meshtrain
