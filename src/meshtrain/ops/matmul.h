// Matrix multiply C = op(A) · op(B), where A and B are viewed as 2-D row-major matrices
// [rows, last dim] and op() optionally transposes. Without transpose_a the output keeps A's
// leading dims ([..., K] x [K, N] -> [..., N]); with it the output is [M, N].
#pragma once

#include "meshtrain/ir/builder.h"

namespace meshtrain::ops {

ValueId matmul(Builder& b, ValueId a, ValueId bm, bool transpose_a = false,
               bool transpose_b = false);
inline constexpr const char* kMatmulOp = "matmul";
// dst (+)= op(A) · op(B) in place, dst a persistent [m, n] buffer (any shape of m·n elements):
// the weight gradient written straight into its fp32 gradient buffer (graph/passes/
// fuse_grad_matmul). A and B share a dtype; dst has theirs or, for bf16 operands, float32
// (products summed in fp32 and added to dst without a bf16 rounding). `overwrite`: dst = product.
void matmul_accumulate(Builder& b, ValueId dst, ValueId a, ValueId bm, bool transpose_a,
                       bool transpose_b, bool overwrite);
inline constexpr const char* kMatmulAccumulateOp = "matmul_accumulate";

// torchtitan's nn.Linear without bias: x [..., in], w [out, in] -> [..., out].
inline ValueId linear(Builder& b, ValueId x, ValueId w) { return matmul(b, x, w, false, true); }

struct MatmulDims {
  int64_t m, n, k;
};
MatmulDims matmul_dims(const TensorMeta& a, const TensorMeta& b, bool ta, bool tb);
// matmul_accumulate's checks: dst's element count and dtype against the product of a and b.
MatmulDims matmul_accumulate_dims(const TensorMeta& dst, const TensorMeta& a, const TensorMeta& b,
                                  bool ta, bool tb);

}  // namespace meshtrain::ops
