// moe_token_counts / expert_bias_update: shape inference (neither is differentiable).
#include "meshtrain/moe/load_balance.h"

namespace meshtrain::ops {

ValueId moe_token_counts(Builder& b, ValueId ids, int64_t num_experts, DType dtype) {
  return b.op1("moe_token_counts", {ids},
               {{"num_experts", num_experts}, {"dtype", int64_t(dtype)}});
}

void expert_bias_update(Builder& b, ValueId bias, ValueId counter, ValueId last_load, double coeff,
                        ValueId counts) {
  std::vector<ValueId> in{bias, counter, last_load};
  if (counts != kNoValue) in.push_back(counts);
  b.op("expert_bias_update", in, {{"coeff", coeff}});
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op(
      {.name = "moe_token_counts", .infer = [](const std::vector<TensorMeta>& in, const Attrs& a) {
         MT_CHECK_T(ShapeError, in.size() == 1 && in[0].dtype == DType::kI32,
                    "moe_token_counts takes int32 ids [T, k]");
         const int64_t e = a.i("num_experts");
         const DType dt = DType(a.i("dtype"));
         MT_CHECK_T(ShapeError, e >= 1, "moe_token_counts: num_experts must be >= 1, found {}", e);
         MT_CHECK_T(ShapeError, dt == DType::kF32 || dt == DType::kF64,
                    "moe_token_counts: counts are float32 or float64, found {}", dt);
         return std::vector<TensorMeta>{{Shape{e}, dt}};
       }});
  r.add_op({.name = "expert_bias_update",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  MT_CHECK_T(
                      ShapeError, in.size() == 3 || in.size() == 4,
                      "expert_bias_update takes (bias, counter, last_load[, counts]), found {} "
                      "inputs",
                      in.size());
                  MT_CHECK_T(ShapeError,
                             in[0].shape.rank() == 1 && in[0].dtype != DType::kBF16 &&
                                 is_floating(in[0].dtype),
                             "expert_bias_update: bias must be float32/float64 [E], found {} {}",
                             in[0].dtype, in[0].shape);
                  const char* names[] = {"bias", "counter", "last_load", "counts"};
                  for (size_t i = 1; i < in.size(); ++i)
                    MT_CHECK_T(ShapeError, in[i] == in[0],
                               "expert_bias_update: {} must be {} {} like the bias, found {} {}",
                               names[i], in[0].dtype, in[0].shape, in[i].dtype, in[i].shape);
                  MT_CHECK_T(ShapeError, a.f("coeff") >= 0,
                             "expert_bias_update: coeff must be >= 0, found {}", a.f("coeff"));
                  return std::vector<TensorMeta>{};
                },
            .side_effect = true});
}

}  // namespace meshtrain::ops
