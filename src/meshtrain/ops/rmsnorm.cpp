// rmsnorm / rmsnorm_backward: shape inference, workspace and the backward rule.
#include "meshtrain/ops/rmsnorm.h"

namespace meshtrain::ops {
namespace {

void check_x_w(const TensorMeta& x, const TensorMeta& w, const char* op) {
  MT_CHECK_T(ShapeError, x.shape.rank() >= 1, "{}: x needs rank >= 1, found {}", op, x.shape);
  MT_CHECK_T(ShapeError, is_floating(x.dtype), "{}: x must be floating, found {}", op, x.dtype);
  MT_CHECK_T(ShapeError, w.shape.rank() == 1 && w.shape[0] == x.shape.last(),
             "{}: weight must be [{}] (the last dim of x {}), found {}", op, x.shape.last(),
             x.shape, w.shape);
  MT_CHECK_T(ShapeError, w.dtype == x.dtype, "{}: weight dtype {} differs from x dtype {}", op,
             w.dtype, x.dtype);
}

void check_eps(const Attrs& a, const char* op) {
  double eps = a.f("eps");
  MT_CHECK_T(ShapeError, eps >= 0, "{}: eps must be >= 0, found {}", op, eps);
}

}  // namespace

ValueId rmsnorm(Builder& b, ValueId x, ValueId w, double eps) {
  return b.op1("rmsnorm", {x, w}, {{"eps", eps}});
}

RmsNormGrads rmsnorm_backward(Builder& b, ValueId x, ValueId w, ValueId dy, double eps) {
  std::vector<ValueId> g = b.op("rmsnorm_backward", {x, w, dy}, {{"eps", eps}});
  return {g[0], g[1]};
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "rmsnorm",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  MT_CHECK_T(ShapeError, in.size() == 2, "rmsnorm takes (x, w), found {} inputs",
                             in.size());
                  check_x_w(in[0], in[1], "rmsnorm");
                  check_eps(a, "rmsnorm");
                  return std::vector<TensorMeta>{in[0]};
                },
            .backward =
                [](GradContext& c) {
                  RmsNormGrads g =
                      rmsnorm_backward(c.b, c.in(0), c.in(1), c.grad_out(0), c.attrs().f("eps"));
                  return std::vector<ValueId>{g.dx, g.dw};
                }});
  r.add_op(
      {.name = "rmsnorm_backward", .infer = [](const std::vector<TensorMeta>& in, const Attrs& a) {
         MT_CHECK_T(ShapeError, in.size() == 3,
                    "rmsnorm_backward takes (x, w, dy), found {} inputs", in.size());
         check_x_w(in[0], in[1], "rmsnorm_backward");
         check_eps(a, "rmsnorm_backward");
         MT_CHECK_T(ShapeError, in[2] == in[0], "rmsnorm_backward: dy {} {} must match x {} {}",
                    in[2].dtype, in[2].shape, in[0].dtype, in[0].shape);
         return std::vector<TensorMeta>{in[0], in[1]};
       }});
}

}  // namespace meshtrain::ops
