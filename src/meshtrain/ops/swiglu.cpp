// swiglu / swiglu_backward: shape inference and the backward rule.
#include "meshtrain/ops/swiglu.h"

namespace meshtrain::ops {
namespace {

void check_same(const std::vector<TensorMeta>& in, size_t n, const char* op, const char* names) {
  MT_CHECK_T(ShapeError, in.size() == n, "{} takes ({}), found {} inputs", op, names, in.size());
  MT_CHECK_T(ShapeError, is_floating(in[0].dtype), "{}: inputs must be floating, found {}", op,
             in[0].dtype);
  for (size_t i = 1; i < n; ++i)
    MT_CHECK_T(ShapeError, in[i] == in[0],
               "{}: ({}) must have equal shape and dtype, found {} {} and {} {}", op, names,
               in[0].dtype, in[0].shape, in[i].dtype, in[i].shape);
}

}  // namespace

ValueId swiglu(Builder& b, ValueId gate, ValueId up) { return b.op1("swiglu", {gate, up}); }

SwigluGrads swiglu_backward(Builder& b, ValueId gate, ValueId up, ValueId dy) {
  std::vector<ValueId> g = b.op("swiglu_backward", {gate, up, dy});
  return {g[0], g[1]};
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "swiglu",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  check_same(in, 2, "swiglu", "gate, up");
                  return std::vector<TensorMeta>{in[0]};
                },
            .backward =
                [](GradContext& c) {
                  SwigluGrads g = swiglu_backward(c.b, c.in(0), c.in(1), c.grad_out(0));
                  return std::vector<ValueId>{g.dgate, g.dup};
                }});
  r.add_op(
      {.name = "swiglu_backward", .infer = [](const std::vector<TensorMeta>& in, const Attrs&) {
         check_same(in, 3, "swiglu_backward", "gate, up, dy");
         return std::vector<TensorMeta>{in[0], in[0]};
       }});
}

}  // namespace meshtrain::ops
