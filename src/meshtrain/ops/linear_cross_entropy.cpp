// linear_cross_entropy, scale_by and scale_by_accumulate: shape inference and the backward rule.
// Rule: the fused op's gradient outputs are for dloss = 1, so its backward is two scale_by nodes
// (dh, dw times the incoming dloss), and a weight gradient that flows straight into its float32
// sink becomes one scale_by_accumulate (graph/passes/fuse_grad_matmul, by accumulating_form).
#include "meshtrain/ops/linear_cross_entropy.h"

namespace meshtrain::ops {
namespace {

// bf16 operands give a float32 loss and a float32 dw (summed over the chunks without a bf16
// rounding); float32 and float64 keep their own dtype (cross_entropy's rule).
DType wide_dtype(DType d) { return d == DType::kBF16 ? DType::kF32 : d; }

void check_inputs(const std::vector<TensorMeta>& in, const Attrs& at) {
  MT_CHECK_T(ShapeError, in.size() == 4,
             "linear_cross_entropy takes (h, w, labels, token_count), found {} inputs", in.size());
  const TensorMeta &h = in[0], &w = in[1], &labels = in[2], &count = in[3];
  MT_CHECK_T(ShapeError, h.shape.rank() == 2 && w.shape.rank() == 2,
             "linear_cross_entropy: h must be [N, D] and w [V, D], found {} and {}", h.shape,
             w.shape);
  MT_CHECK_T(ShapeError, h.shape[1] == w.shape[1],
             "linear_cross_entropy: h {} and w {} differ in the inner dimension D", h.shape,
             w.shape);
  MT_CHECK_T(ShapeError, w.shape[0] > 0,
             "linear_cross_entropy: w needs at least one class, found {}", w.shape);
  MT_CHECK_T(ShapeError, is_floating(h.dtype) && h.dtype == w.dtype,
             "linear_cross_entropy: h and w must share a floating dtype, found {} and {}", h.dtype,
             w.dtype);
  MT_CHECK_T(ShapeError, labels.dtype == DType::kI32 && labels.shape == Shape{h.shape[0]},
             "linear_cross_entropy: labels must be int32 [{}] (one per row of h), found {} {}",
             h.shape[0], labels.dtype, labels.shape);
  MT_CHECK_T(ShapeError, count.dtype == DType::kI64 && count.shape == Shape{1},
             "linear_cross_entropy: token_count must be int64 [1], found {} {}", count.dtype,
             count.shape);
  MT_CHECK_T(ValueError, at.i("chunk_rows") > 0,
             "linear_cross_entropy: chunk_rows must be positive, found {}", at.i("chunk_rows"));
}

void check_scale(const TensorMeta& x, const TensorMeta& s, DType out, const char* op) {
  MT_CHECK_T(ShapeError, is_floating(x.dtype) && is_floating(out),
             "{}: x and the output must be floating, found {} and {}", op, x.dtype, out);
  MT_CHECK_T(ShapeError, s.shape == Shape{1} && is_floating(s.dtype),
             "{}: the scale must be a floating [1], found {} {}", op, s.dtype, s.shape);
}

}  // namespace

int64_t linear_cross_entropy_flops(int64_t n, int64_t v, int64_t d, bool grads) {
  return 2 * n * v * d * (grads ? 3 : 1);
}

LinearCrossEntropy linear_cross_entropy(Builder& b, ValueId h, ValueId w, ValueId labels,
                                        ValueId token_count, bool grads, int64_t chunk_rows,
                                        int64_t ignore_index) {
  std::vector<ValueId> out =
      b.op(kLinearCrossEntropyOp, {h, w, labels, token_count},
           {{"chunk_rows", chunk_rows}, {"ignore_index", ignore_index}, {"grads", int64_t(grads)}});
  if (!grads) return {out.at(0), kNoValue, kNoValue};
  return {out.at(0), out.at(1), out.at(2)};
}

ValueId scale_by(Builder& b, ValueId x, ValueId s, DType out) {
  return b.op1(kScaleByOp, {x, s}, {{"dtype", int64_t(out)}});
}

void scale_by_accumulate(Builder& b, ValueId dst, ValueId x, ValueId s, bool overwrite) {
  b.op(kScaleByAccumulateOp, {dst, x, s},
       {{"dtype", int64_t(b.dtype(dst))}, {"overwrite", int64_t(overwrite)}});
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = kLinearCrossEntropyOp,
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& at) {
                  check_inputs(in, at);
                  const DType wide = wide_dtype(in[0].dtype);
                  std::vector<TensorMeta> out{{Shape{1}, wide}};
                  if (at.b("grads")) {
                    out.push_back(in[0]);                // dh [N, D]
                    out.push_back({in[1].shape, wide});  // dw [V, D]
                  }
                  return out;
                },
            .backward =
                [](GradContext& c) {
                  MT_CHECK_T(ValueError, c.attrs().b("grads"),
                             "linear_cross_entropy at '{}' was built without grads (a forward-only "
                             "loss) but a backward reaches it",
                             c.node.scope);
                  Builder& b = c.b;
                  const ValueId dloss = c.grad_out(0);
                  ValueId dh = kNoValue, dw = kNoValue;
                  if (c.needs_grad[0]) dh = scale_by(b, c.out(1), dloss, b.dtype(c.in(0)));
                  if (c.needs_grad[1]) dw = scale_by(b, c.out(2), dloss, b.dtype(c.in(1)));
                  return std::vector<ValueId>{dh, dw, kNoValue, kNoValue};
                },
            .compute_heavy = true,
            .flops =
                [](const std::vector<TensorMeta>& in, const Attrs& at) {
                  return linear_cross_entropy_flops(in.at(0).shape[0], in.at(1).shape[0],
                                                    in.at(0).shape[1], at.b("grads"));
                }});
  r.add_op({.name = kScaleByOp,
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& at) {
                  MT_CHECK_T(ShapeError, in.size() == 2, "scale_by takes (x, s), found {} inputs",
                             in.size());
                  const DType out = DType(at.i("dtype"));
                  check_scale(in[0], in[1], out, "scale_by");
                  return std::vector<TensorMeta>{{in[0].shape, out}};
                },
            .accumulating_form = kScaleByAccumulateOp});
  // A gradient sink like matmul_accumulate: no outputs, not differentiable.
  r.add_op({.name = kScaleByAccumulateOp,
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  MT_CHECK_T(ShapeError, in.size() == 3,
                             "scale_by_accumulate takes (dst, x, s), found {} inputs", in.size());
                  const TensorMeta &dst = in[0], &x = in[1];
                  check_scale(x, in[2], dst.dtype, "scale_by_accumulate");
                  MT_CHECK_T(ShapeError, dst.shape.numel() == x.shape.numel(),
                             "scale_by_accumulate: the destination {} holds {} elements, x {} {}",
                             dst.shape, dst.shape.numel(), x.shape, x.shape.numel());
                  MT_CHECK_T(ValueError, dst.dtype == x.dtype || dst.dtype == DType::kF32,
                             "scale_by_accumulate: a {} destination for {} x (expected x's dtype "
                             "or float32)",
                             dst.dtype, x.dtype);
                  return std::vector<TensorMeta>{};
                },
            .side_effect = true});
}

}  // namespace meshtrain::ops
