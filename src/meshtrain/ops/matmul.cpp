// matmul: shape inference and the backward rule, written as four transposed products; and
// matmul_accumulate, the product added into a persistent buffer in place.
#include "meshtrain/ops/matmul.h"

#include "meshtrain/ops/elementwise.h"

namespace meshtrain::ops {

MatmulDims matmul_dims(const TensorMeta& a, const TensorMeta& b, bool ta, bool tb) {
  MT_CHECK_T(ShapeError, a.shape.rank() >= 1 && b.shape.rank() >= 1,
             "matmul operands need rank >= 1, found {} and {}", a.shape, b.shape);
  int64_t ar = a.shape.rows(), ac = a.shape.last();
  int64_t br = b.shape.rows(), bc = b.shape.last();
  MatmulDims d{ta ? ac : ar, tb ? br : bc, ta ? ar : ac};
  int64_t kb = tb ? bc : br;
  MT_CHECK_T(ShapeError, d.k == kb, "matmul inner dimensions differ: {} (A {}{}) vs {} (B {}{})",
             d.k, a.shape, ta ? "ᵀ" : "", kb, b.shape, tb ? "ᵀ" : "");
  MT_CHECK_T(ShapeError, a.dtype == b.dtype, "matmul dtypes differ: {} vs {}", a.dtype, b.dtype);
  return d;
}

MatmulDims matmul_accumulate_dims(const TensorMeta& dst, const TensorMeta& a, const TensorMeta& b,
                                  bool ta, bool tb) {
  const MatmulDims d = matmul_dims(a, b, ta, tb);
  MT_CHECK_T(ShapeError, dst.shape.numel() == d.m * d.n,
             "matmul_accumulate: the destination {} holds {} elements, the product {} x {}",
             dst.shape, dst.shape.numel(), d.m, d.n);
  MT_CHECK_T(ValueError,
             dst.dtype == a.dtype || (a.dtype == DType::kBF16 && dst.dtype == DType::kF32),
             "matmul_accumulate: a {} destination for {} operands (expected the operands' dtype, "
             "or float32 for bfloat16 operands)",
             dst.dtype, a.dtype);
  return d;
}

void matmul_accumulate(Builder& b, ValueId dst, ValueId a, ValueId bm, bool ta, bool tb,
                       bool overwrite) {
  b.op(kMatmulAccumulateOp, {dst, a, bm},
       {{"transpose_a", int64_t(ta)},
        {"transpose_b", int64_t(tb)},
        {"overwrite", int64_t(overwrite)}});
}

ValueId matmul(Builder& b, ValueId a, ValueId bm, bool ta, bool tb) {
  return b.op1(kMatmulOp, {a, bm}, {{"transpose_a", int64_t(ta)}, {"transpose_b", int64_t(tb)}});
}

MT_REGISTER_OPS {
  OpRegistry::instance().add_op({.name = kMatmulOp,
                                 .infer =
                                     [](const std::vector<TensorMeta>& in, const Attrs& at) {
                                       bool ta = at.b("transpose_a"), tb = at.b("transpose_b");
                                       MatmulDims d = matmul_dims(in.at(0), in.at(1), ta, tb);
                                       std::vector<int64_t> dims;
                                       if (ta) {
                                         dims = {d.m, d.n};
                                       } else {
                                         dims = in[0].shape.dims();
                                         dims.back() = d.n;
                                       }
                                       return std::vector<TensorMeta>{{Shape(dims), in[0].dtype}};
                                     },
                                 .backward =
                                     [](GradContext& c) {
                                       Builder& b = c.b;
                                       bool ta = c.attrs().b("transpose_a"),
                                            tb = c.attrs().b("transpose_b");
                                       ValueId A = c.in(0), B = c.in(1), G = c.grad_out(0);
                                       ValueId dA = kNoValue, dB = kNoValue;
                                       // C = op(A) op(B); each case writes dA, dB as products of G,
                                       // A, B.
                                       if (c.needs_grad[0]) {
                                         if (!ta)
                                           dA = matmul(b, G, B, false, !tb);  // G op(B)^T
                                         else if (!tb)
                                           dA = matmul(b, B, G, false, true);  // B G^T
                                         else
                                           dA = matmul(b, B, G, true, true);  // B^T G^T
                                         dA = reshape(b, dA, b.shape(A));
                                       }
                                       if (c.needs_grad[1]) {
                                         if (!tb)
                                           dB = matmul(b, A, G, !ta, false);  // op(A)^T G
                                         else if (!ta)
                                           dB = matmul(b, G, A, true, false);  // G^T A
                                         else
                                           dB = matmul(b, G, A, true, true);  // G^T A^T
                                         dB = reshape(b, dB, b.shape(B));
                                       }
                                       return std::vector<ValueId>{dA, dB};
                                     },
                                 .compute_heavy = true,
                                 .accumulating_form = kMatmulAccumulateOp});
  // A gradient sink like accumulate (no outputs, not differentiable); compute-heavy for the cost
  // model, which counts the product's 2·m·n·k.
  OpRegistry::instance().add_op(
      {.name = kMatmulAccumulateOp,
       .infer =
           [](const std::vector<TensorMeta>& in, const Attrs& at) {
             MT_CHECK_T(ShapeError, in.size() == 3,
                        "matmul_accumulate takes (dst, a, b), found {} inputs", in.size());
             matmul_accumulate_dims(in[0], in[1], in[2], at.b("transpose_a"), at.b("transpose_b"));
             return std::vector<TensorMeta>{};
           },
       .side_effect = true,
       .compute_heavy = true,
       .flops =
           [](const std::vector<TensorMeta>& in, const Attrs& at) {
             const MatmulDims d =
                 matmul_dims(in.at(1), in.at(2), at.b("transpose_a"), at.b("transpose_b"));
             return 2 * d.m * d.n * d.k;
           }});
}

}  // namespace meshtrain::ops
