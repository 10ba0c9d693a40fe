// Definitions (shape inference and backward rules) of the elementwise and structural ops.
#include "meshtrain/ops/elementwise.h"

namespace meshtrain::ops {
namespace {
std::vector<TensorMeta> same_as_first(const std::vector<TensorMeta>& in, const Attrs&) {
  return {in.at(0)};
}
void check_same(const std::vector<TensorMeta>& in, const char* op) {
  MT_CHECK_T(ShapeError, in.size() == 2, "{} takes 2 inputs, found {}", op, in.size());
  MT_CHECK_T(ShapeError, in[0] == in[1],
             "{}: operands must have equal shape and dtype, found {} {} and {} {}", op,
             dtype_name(in[0].dtype), in[0].shape, dtype_name(in[1].dtype), in[1].shape);
}
}  // namespace

ValueId fill(Builder& b, const Shape& shape, DType dtype, double value) {
  return b.op1("fill", {}, {{"shape", shape.dims()}, {"dtype", int64_t(dtype)}, {"value", value}});
}
ValueId add(Builder& b, ValueId x, ValueId y) { return b.op1("add", {x, y}); }
ValueId mul(Builder& b, ValueId x, ValueId y) { return b.op1("mul", {x, y}); }
ValueId scale(Builder& b, ValueId x, double factor) {
  return b.op1("scale", {x}, {{"factor", factor}});
}
ValueId cast(Builder& b, ValueId x, DType dtype) {
  if (b.dtype(x) == dtype) return x;
  return b.op1("cast", {x}, {{"dtype", int64_t(dtype)}});
}
ValueId reshape(Builder& b, ValueId x, const Shape& shape) {
  if (b.shape(x) == shape) return x;
  return b.op1("reshape", {x}, {{"shape", shape.dims()}});
}
ValueId grad_cast(Builder& b, ValueId x, DType dtype) {
  if (b.dtype(x) == dtype) return x;
  return b.op1("grad_cast", {x}, {{"dtype", int64_t(dtype)}});
}
ValueId sum(Builder& b, ValueId x) { return b.op1("sum", {x}); }
ValueId expand_scalar(Builder& b, ValueId x, const Shape& shape) {
  return b.op1("expand_scalar", {x}, {{"shape", shape.dims()}});
}
void accumulate(Builder& b, ValueId dst, ValueId src, bool overwrite) {
  if (overwrite)
    b.op("accumulate", {dst, src}, {{"overwrite", int64_t(1)}});
  else
    b.op("accumulate", {dst, src});
}
void cast_into(Builder& b, ValueId dst, ValueId src) { b.op("cast_into", {dst, src}); }

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "fill", .infer = [](const std::vector<TensorMeta>&, const Attrs& a) {
              return std::vector<TensorMeta>{{Shape(a.ints("shape")), DType(a.i("dtype"))}};
            }});
  r.add_op({.name = "add",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  check_same(in, "add");
                  return std::vector<TensorMeta>{in[0]};
                },
            .backward =
                [](GradContext& c) {
                  return std::vector<ValueId>{c.grad_out(0), c.grad_out(0)};
                },
            .sums_inputs = true});
  r.add_op({.name = "mul",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  check_same(in, "mul");
                  return std::vector<TensorMeta>{in[0]};
                },
            .backward =
                [](GradContext& c) {
                  std::vector<ValueId> g(2, kNoValue);
                  if (c.needs_grad[0]) g[0] = mul(c.b, c.grad_out(0), c.in(1));
                  if (c.needs_grad[1]) g[1] = mul(c.b, c.grad_out(0), c.in(0));
                  return g;
                }});
  r.add_op({.name = "scale", .infer = same_as_first, .backward = [](GradContext& c) {
              return std::vector<ValueId>{scale(c.b, c.grad_out(0), c.attrs().f("factor"))};
            }});
  r.add_op({.name = "cast",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  return std::vector<TensorMeta>{{in.at(0).shape, DType(a.i("dtype"))}};
                },
            .backward =
                [](GradContext& c) {
                  return std::vector<ValueId>{cast(c.b, c.grad_out(0), c.b.dtype(c.in(0)))};
                },
            .cast = true});
  r.add_op({.name = "reshape",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  Shape s(a.ints("shape"));
                  MT_CHECK_T(ShapeError, s.numel() == in.at(0).numel(),
                             "reshape {} to {}: element counts differ", in[0].shape, s);
                  return std::vector<TensorMeta>{{s, in[0].dtype}};
                },
            .backward =
                [](GradContext& c) {
                  return std::vector<ValueId>{reshape(c.b, c.grad_out(0), c.b.shape(c.in(0)))};
                },
            .view_of_input = 0,
            .rearranges = true});
  r.add_op({.name = "grad_cast",
            .infer = same_as_first,
            .backward =
                [](GradContext& c) {
                  return std::vector<ValueId>{
                      cast(c.b, c.grad_out(0), DType(c.attrs().i("dtype")))};
                },
            .view_of_input = 0});
  r.add_op({.name = "sum",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  return std::vector<TensorMeta>{{Shape{1}, in.at(0).dtype}};
                },
            .backward =
                [](GradContext& c) {
                  return std::vector<ValueId>{
                      expand_scalar(c.b, c.grad_out(0), c.b.shape(c.in(0)))};
                }});
  r.add_op(
      {.name = "expand_scalar",
       .infer =
           [](const std::vector<TensorMeta>& in, const Attrs& a) {
             MT_CHECK_T(ShapeError, in.at(0).numel() == 1, "expand_scalar of shape {}",
                        in[0].shape);
             return std::vector<TensorMeta>{{Shape(a.ints("shape")), in[0].dtype}};
           },
       .backward = [](GradContext& c) { return std::vector<ValueId>{sum(c.b, c.grad_out(0))}; }});
  r.add_op({.name = "accumulate",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  MT_CHECK_T(ShapeError, in.size() == 2 && in[0].shape == in[1].shape,
                             "accumulate: destination and source shapes differ");
                  return std::vector<TensorMeta>{};
                },
            .side_effect = true,
            .accumulates_in_place = true});
  r.add_op({.name = "cast_into",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  MT_CHECK_T(ShapeError, in.size() == 2 && in[0].shape == in[1].shape,
                             "cast_into: destination {} and source {} shapes differ",
                             in.at(0).shape, in.at(1).shape);
                  return std::vector<TensorMeta>{};
                },
            .side_effect = true});
}

}  // namespace meshtrain::ops
