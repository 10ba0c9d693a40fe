// moe_combine / moe_row_dot: shape inference and the backward rule.
#include "meshtrain/moe/combine.h"

#include "meshtrain/moe/dispatch.h"

namespace meshtrain::ops {
namespace {

std::vector<TensorMeta> infer_combine(const std::vector<TensorMeta>& in, const Attrs&) {
  MT_CHECK_T(ShapeError, in.size() == 2 || in.size() == 3,
             "moe_combine takes (y, row_map[, weights]), found {} inputs", in.size());
  const TensorMeta& y = in[0];
  MT_CHECK_T(ShapeError, y.shape.rank() == 2 && is_floating(y.dtype),
             "moe_combine: y must be floating [capacity, D], found {} {}", y.dtype, y.shape);
  check_row_map(in[1], "moe_combine");
  MT_CHECK_T(ShapeError, y.shape[0] >= in[1].numel(),
             "moe_combine: y has {} rows, fewer than the {} routed rows of row_map {}", y.shape[0],
             in[1].numel(), in[1].shape);
  if (in.size() == 3) check_route_weights(in[2], in[1], y, "moe_combine");
  return {{Shape{in[1].shape[0], y.shape[1]}, y.dtype}};
}

std::vector<TensorMeta> infer_row_dot(const std::vector<TensorMeta>& in, const Attrs&) {
  MT_CHECK_T(ShapeError, in.size() == 3, "moe_row_dot takes (perm, rows, row_map), found {} inputs",
             in.size());
  const TensorMeta& p = in[0];
  const TensorMeta& x = in[1];
  MT_CHECK_T(ShapeError,
             p.shape.rank() == 2 && x.shape.rank() == 2 && p.dtype == x.dtype &&
                 is_floating(p.dtype) && p.shape[1] == x.shape[1],
             "moe_row_dot: perm [capacity, D] and rows [T, D] must share D and a floating dtype, "
             "found {} {} and {} {}",
             p.dtype, p.shape, x.dtype, x.shape);
  check_row_map(in[2], "moe_row_dot");
  MT_CHECK_T(ShapeError, in[2].shape[0] == x.shape[0] && p.shape[0] >= in[2].numel(),
             "moe_row_dot: row_map {} must have one row per token of rows {} and fit perm {}",
             in[2].shape, x.shape, p.shape);
  const DType wt = p.dtype == DType::kBF16 ? DType::kF32 : p.dtype;
  return {{in[2].shape, wt}};
}

}  // namespace

ValueId moe_combine(Builder& b, ValueId y, ValueId row_map, ValueId weights) {
  std::vector<ValueId> in{y, row_map};
  if (weights != kNoValue) in.push_back(weights);
  return b.op1("moe_combine", in);
}

ValueId moe_row_dot(Builder& b, ValueId perm, ValueId rows, ValueId row_map) {
  return b.op1("moe_row_dot", {perm, rows, row_map});
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "moe_combine", .infer = infer_combine, .backward = [](GradContext& c) {
              const bool weighted = c.node.inputs.size() == 3;
              const ValueId w = weighted ? c.in(2) : kNoValue;
              std::vector<ValueId> g(c.node.inputs.size(), kNoValue);
              if (c.needs_grad[0])
                g[0] = moe_permute(c.b, c.grad_out(0), c.in(1), c.b.shape(c.in(0))[0], w);
              if (weighted && c.needs_grad[2])
                g[2] = moe_row_dot(c.b, c.in(0), c.grad_out(0), c.in(1));
              return g;
            }});
  r.add_op({.name = "moe_row_dot", .infer = infer_row_dot});
}

}  // namespace meshtrain::ops
