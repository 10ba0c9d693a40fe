// Definitions of the optimizer ops (no backward: they run after it).
#include "meshtrain/ops/optimizer_ops.h"

namespace meshtrain::ops {

ValueId sum_squares(Builder& b, ValueId x) { return b.op1("sum_squares", {x}); }

void adamw_update(Builder& b, ValueId param, ValueId grad, ValueId exp_avg, ValueId exp_avg_sq,
                  ValueId total_norm_sq, int lr_slot, int step_slot, const AdamWParams& p,
                  ValueId compute, ElementRange range) {
  std::vector<ValueId> in = {param, grad, exp_avg, exp_avg_sq, total_norm_sq};
  if (compute != kNoValue) in.push_back(compute);
  b.op("adamw_update", in,
       {{"lr_slot", int64_t(lr_slot)},
        {"step_slot", int64_t(step_slot)},
        {"beta1", p.beta1},
        {"beta2", p.beta2},
        {"eps", p.eps},
        {"weight_decay", p.weight_decay},
        {"max_norm", p.max_norm},
        {"reset_grad", int64_t(p.reset_grad)},
        {"begin", range.begin},
        {"count", range.count}});
}

ElementRange adamw_range(const Attrs& attrs, int64_t numel) {
  const int64_t begin = attrs.i("begin", 0), count = attrs.i("count", -1);
  return {begin, count < 0 ? numel - begin : count};
}

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  double c = max_norm / (total_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "sum_squares", .infer = [](const std::vector<TensorMeta>&, const Attrs&) {
              return std::vector<TensorMeta>{{Shape{1}, DType::kF64}};
            }});
  r.add_op({.name = "adamw_update",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  MT_CHECK_T(ShapeError, in.size() == 5 || in.size() == 6,
                             "adamw_update takes 5 inputs, or 6 with a compute copy; found {}",
                             in.size());
                  for (int i = 1; i < 4; ++i)
                    MT_CHECK_T(
                        ShapeError, in[size_t(i)] == in[0],
                        "adamw_update: param, grad and moments must match, found {} {} vs {} {}",
                        in[0].dtype, in[0].shape, in[size_t(i)].dtype, in[size_t(i)].shape);
                  MT_CHECK_T(ShapeError, in[4].dtype == DType::kF64 && in[4].numel() == 1,
                             "adamw_update: the squared norm is a float64 scalar");
                  if (in.size() == 6)
                    MT_CHECK_T(ShapeError,
                               in[5].shape == in[0].shape && is_floating(in[5].dtype) &&
                                   in[5].dtype != in[0].dtype,
                               "adamw_update: the compute copy must be the param's shape {} in "
                               "another float dtype than {}, found {} {}",
                               in[0].shape, in[0].dtype, in[5].dtype, in[5].shape);
                  const int64_t begin = a.i("begin", 0), count = a.i("count", -1);
                  MT_CHECK_T(ShapeError,
                             begin >= 0 && begin <= in[0].numel() &&
                                 (count < 0 || count <= in[0].numel() - begin),
                             "adamw_update: elements [{}, {} + {}) lie outside the {} of the flat "
                             "buffers",
                             begin, begin, count, in[0].numel());
                  return std::vector<TensorMeta>{};
                },
            .side_effect = true});
}

}  // namespace meshtrain::ops
