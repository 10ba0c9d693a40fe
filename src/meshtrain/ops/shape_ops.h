// Structural copies along one dim of a contiguous tensor: slice, concat, expand (of an extent-1
// dim) and sum_dim (the reduction that is expand's backward). Every output is a fresh contiguous
// copy, never a view. Dims may be negative (counted from the end).
#pragma once

#include <vector>

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

// x[..., start : start + length, ...] along dim.
ValueId slice(Builder& b, ValueId x, int dim, int64_t start, int64_t length);
// The backward of slice: dy placed at [start, start + extent_of_dy) of zeros whose extent at dim
// is `full_extent`.
ValueId slice_backward(Builder& b, ValueId dy, int dim, int64_t start, int64_t full_extent);
// Inputs of equal rank and dtype, equal extents except at dim. Backward: slices of dy.
ValueId concat(Builder& b, const std::vector<ValueId>& xs, int dim);
inline constexpr const char* kConcatOp = "concat";
// x has extent 1 at dim; the output repeats it n times there. Backward: sum_dim(dy, dim).
ValueId expand(Builder& b, ValueId x, int dim, int64_t n);
// Sum over dim, keeping it with extent 1. Backward: expand(dy, dim, extent).
ValueId sum_dim(Builder& b, ValueId x, int dim);

// x [P, Q, ...] -> [Q, P, ...] (dims 0 and 1 swapped; the rest move as contiguous rows). Its own
// backward. Used to gather a tensor sharded along dim 1 with a dim-0 all_gather.
ValueId transpose01(Builder& b, ValueId x);

// The row-major decomposition the kernels use: outer (dims before), extent, inner (dims after).
struct DimSplit {
  int64_t outer, extent, inner;
};
DimSplit split_at(const Shape& s, int dim);

}  // namespace meshtrain::ops
