// The shared model blocks (see layers.h). The SwiGLU expression stays one expression so that both
// models create its nodes in the order they always have.
#include "meshtrain/model/layers.h"

#include "meshtrain/ops/cross_entropy.h"
#include "meshtrain/ops/linear_cross_entropy.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/ops/swiglu.h"

namespace meshtrain {

ValueId scoped_param(Builder& b, ParallelPlan& plan, const std::string& local, const Shape& shape,
                     const InitSpec& init, ParamOptions options) {
  return plan.param(b, b.current_scope() + "." + local, shape, init, options);
}

ValueId swiglu_mlp(Builder& b, ValueId x, ValueId w1, ValueId w2, ValueId w3) {
  return ops::linear(b, ops::swiglu(b, ops::linear(b, x, w1), ops::linear(b, x, w3)), w2);
}

ValueId feed_forward(Builder& b, ParallelPlan& plan, ValueId x, int64_t dim, int64_t hidden,
                     double init_std) {
  auto s = b.scope("feed_forward");
  const ParamOptions col{.tp = TpStyle::kColwise}, row{.tp = TpStyle::kRowwise};
  ValueId w1 = scoped_param(b, plan, "w1.weight", {hidden, dim}, InitSpec::trunc_normal(0.02), col);
  ValueId w2 =
      scoped_param(b, plan, "w2.weight", {dim, hidden}, InitSpec::trunc_normal(init_std), row);
  ValueId w3 =
      scoped_param(b, plan, "w3.weight", {hidden, dim}, InitSpec::trunc_normal(init_std), col);
  return plan.tp_exit(b, swiglu_mlp(b, plan.tp_enter(b, x), w1, w2, w3));
}

ValueId output_loss(Builder& b, ValueId h, ValueId wout, ValueId labels, ValueId count,
                    const ModelInputs& in) {
  if (!in.fused_output_loss) return ops::cross_entropy(b, ops::linear(b, h, wout), labels, count);
  return ops::linear_cross_entropy(b, h, wout, labels, count, in.loss_grads,
                                   in.output_loss_chunk_rows)
      .loss;
}

}  // namespace meshtrain
