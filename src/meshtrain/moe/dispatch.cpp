// moe_dispatch_plan / moe_permute: capacity rule, shape inference and the backward rule.
#include "meshtrain/moe/dispatch.h"

#include "meshtrain/moe/combine.h"

namespace meshtrain::ops {

int64_t moe_capacity(int64_t choices, int64_t num_experts, int64_t alignment) {
  MT_CHECK_T(ShapeError, choices >= 0 && num_experts >= 1 && alignment >= 1,
             "moe capacity needs choices >= 0, num_experts >= 1 and alignment >= 1, found {}, {} "
             "and {}",
             choices, num_experts, alignment);
  const int64_t worst = choices + num_experts * (alignment - 1);
  return (worst + alignment - 1) / alignment * alignment;
}

void check_row_map(const TensorMeta& row_map, const char* op) {
  MT_CHECK_T(ShapeError, row_map.shape.rank() == 2 && row_map.dtype == DType::kI32,
             "{}: row_map must be int32 [T, k], found {} {}", op, row_map.dtype, row_map.shape);
}

void check_route_weights(const TensorMeta& w, const TensorMeta& row_map, const TensorMeta& data,
                         const char* op) {
  MT_CHECK_T(ShapeError, w.shape == row_map.shape,
             "{}: weights must have the row_map's shape {}, found {}", op, row_map.shape, w.shape);
  const bool ok = w.dtype == data.dtype || (data.dtype == DType::kBF16 && w.dtype == DType::kF32);
  MT_CHECK_T(ShapeError, ok,
             "{}: weights must be {} like the rows (or float32 for bfloat16 rows), found {}", op,
             data.dtype, w.dtype);
}

namespace {

std::vector<TensorMeta> infer_plan(const std::vector<TensorMeta>& in, const Attrs& a) {
  MT_CHECK_T(ShapeError, in.size() == 1, "moe_dispatch_plan takes (ids), found {} inputs",
             in.size());
  MT_CHECK_T(ShapeError, in[0].shape.rank() == 2 && in[0].dtype == DType::kI32,
             "moe_dispatch_plan: ids must be int32 [T, k], found {} {}", in[0].dtype, in[0].shape);
  const int64_t e = a.i("num_experts"), align = a.i("alignment");
  MT_CHECK_T(ShapeError, e >= 1 && align >= 1,
             "moe_dispatch_plan: num_experts and alignment must be >= 1, found {} and {}", e,
             align);
  const int64_t cap = moe_capacity(in[0].numel(), e, align);
  MT_CHECK_T(ShapeError, cap <= int64_t(INT32_MAX),
             "moe_dispatch_plan: capacity {} rows does not fit the int32 row map", cap);
  return {{in[0].shape, DType::kI32}, {Shape{2, e}, DType::kI32}};
}

std::vector<TensorMeta> infer_permute(const std::vector<TensorMeta>& in, const Attrs& a) {
  MT_CHECK_T(ShapeError, in.size() == 2 || in.size() == 3,
             "moe_permute takes (x, row_map[, weights]), found {} inputs", in.size());
  const TensorMeta& x = in[0];
  MT_CHECK_T(ShapeError, x.shape.rank() == 2 && is_floating(x.dtype),
             "moe_permute: x must be floating [T, D], found {} {}", x.dtype, x.shape);
  check_row_map(in[1], "moe_permute");
  MT_CHECK_T(ShapeError, in[1].shape[0] == x.shape[0],
             "moe_permute: row_map {} must have one row per token of x {}", in[1].shape, x.shape);
  if (in.size() == 3) check_route_weights(in[2], in[1], x, "moe_permute");
  const int64_t cap = a.i("capacity");
  MT_CHECK_T(ShapeError, cap >= in[1].numel(),
             "moe_permute: capacity {} is below the {} routed rows", cap, in[1].numel());
  return {{Shape{cap, x.shape[1]}, x.dtype}};
}

}  // namespace

DispatchPlan moe_dispatch_plan(Builder& b, ValueId ids, int64_t num_experts, int64_t alignment) {
  std::vector<ValueId> o =
      b.op("moe_dispatch_plan", {ids}, {{"num_experts", num_experts}, {"alignment", alignment}});
  return {o[0], o[1], moe_capacity(b.meta(ids).numel(), num_experts, alignment)};
}

ValueId moe_permute(Builder& b, ValueId x, ValueId row_map, int64_t capacity, ValueId weights) {
  std::vector<ValueId> in{x, row_map};
  if (weights != kNoValue) in.push_back(weights);
  return b.op1("moe_permute", in, {{"capacity", capacity}});
}

ValueId moe_permute(Builder& b, ValueId x, const DispatchPlan& plan, ValueId weights) {
  return moe_permute(b, x, plan.row_map, plan.capacity, weights);
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "moe_dispatch_plan", .infer = infer_plan, .publishes_groups_output = 1});
  r.add_op({.name = "moe_permute", .infer = infer_permute, .backward = [](GradContext& c) {
              const bool weighted = c.node.inputs.size() == 3;
              const ValueId w = weighted ? c.in(2) : kNoValue;
              std::vector<ValueId> g(c.node.inputs.size(), kNoValue);
              if (c.needs_grad[0]) g[0] = moe_combine(c.b, c.grad_out(0), c.in(1), w);
              if (weighted && c.needs_grad[2])
                g[2] = moe_row_dot(c.b, c.grad_out(0), c.in(0), c.in(1));
              return g;
            }});
}

}  // namespace meshtrain::ops
