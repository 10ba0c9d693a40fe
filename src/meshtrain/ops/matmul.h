// Matrix multiply C = op(A) · op(B), where A and B are viewed as 2-D row-major matrices
// [rows, last dim] and op() optionally transposes. Without transpose_a the output keeps A's
// leading dims ([..., K] x [K, N] -> [..., N]); with it the output is [M, N].
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

ValueId matmul(Builder& b, ValueId a, ValueId bm, bool transpose_a = false,
               bool transpose_b = false);
// torchtitan's nn.Linear without bias: x [..., in], w [out, in] -> [..., out].
inline ValueId linear(Builder& b, ValueId x, ValueId w) { return matmul(b, x, w, false, true); }

struct MatmulDims {
  int64_t m, n, k;
};
MatmulDims matmul_dims(const TensorMeta& a, const TensorMeta& b, bool ta, bool tb);

}  // namespace meshtrain::ops
