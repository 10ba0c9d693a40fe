// Elementwise and structural ops: fill, add, mul, scale, cast, reshape (a view), sum, and the
// in-place accumulate (gradient accumulation) and cast_into (compute copies of masters). Same-shape
// only: broadcasting patterns the models need are fused into their own ops.
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

ValueId fill(Builder& b, const Shape& shape, DType dtype, double value);
ValueId add(Builder& b, ValueId x, ValueId y);
ValueId mul(Builder& b, ValueId x, ValueId y);
ValueId scale(Builder& b, ValueId x, double factor);
// Identity (no node) when x already has `dtype`.
ValueId cast(Builder& b, ValueId x, DType dtype);
ValueId reshape(Builder& b, ValueId x, const Shape& shape);
// Identity in forward (a view); in backward casts the incoming gradient to `dtype`. Marks where a
// gradient changes precision (FSDP reduces gradients in mixed_precision_reduce). No node when the
// value already has `dtype`.
ValueId grad_cast(Builder& b, ValueId x, DType dtype);
// Sum of all elements to a [1] tensor (accumulates in double on CPU).
ValueId sum(Builder& b, ValueId x);
// Broadcast a [1] tensor to `shape` (the backward of sum).
ValueId expand_scalar(Builder& b, ValueId x, const Shape& shape);
// dst += src in place; dst is persistent (a gradient accumulator or a counter). No outputs.
// overwrite: dst = src instead (the only micro-batch of a step writes its gradients outright, so
// they need no zeroing and no read). src may be bfloat16 for a float32/float64 dst.
void accumulate(Builder& b, ValueId dst, ValueId src, bool overwrite = false);
// dst = cast(src) in place, with the cast op's conversion (bfloat16 rounds to nearest even);
// dst is persistent (a master's compute copy), any dtype of src's shape. No outputs.
void cast_into(Builder& b, ValueId dst, ValueId src);

}  // namespace meshtrain::ops
