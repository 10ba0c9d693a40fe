// cross_entropy / cross_entropy_backward: shape inference and the backward rule. Label values
// and the token count are data, checked by the kernels; shapes and dtypes are checked here.
#include "meshtrain/ops/cross_entropy.h"

namespace meshtrain::ops {
namespace {

void check_common(const std::vector<TensorMeta>& in, const char* op) {
  const TensorMeta& logits = in[0];
  const TensorMeta& labels = in[1];
  const TensorMeta& count = in[2];
  MT_CHECK_T(ShapeError, logits.shape.rank() == 2, "{}: logits must be [N, V], found {}", op,
             logits.shape);
  MT_CHECK_T(ShapeError, logits.shape[1] > 0, "{}: logits need at least one class, found {}", op,
             logits.shape);
  MT_CHECK_T(ShapeError, is_floating(logits.dtype), "{}: logits must be floating, found {}", op,
             logits.dtype);
  MT_CHECK_T(ShapeError, labels.dtype == DType::kI32, "{}: labels must be int32, found {}", op,
             labels.dtype);
  MT_CHECK_T(ShapeError, labels.shape == Shape{logits.shape[0]},
             "{}: labels must be [{}] (one per logits row), found {}", op, logits.shape[0],
             labels.shape);
  MT_CHECK_T(ShapeError, count.dtype == DType::kI64 && count.shape == Shape{1},
             "{}: token_count must be int64 [1], found {} {}", op, count.dtype, count.shape);
}

// The loss dtype: bf16 logits give a float32 loss (a bf16 sum over tokens would lose digits);
// float32 and float64 logits give a loss of their own dtype.
DType loss_dtype(DType logits) { return logits == DType::kBF16 ? DType::kF32 : logits; }

}  // namespace

ValueId cross_entropy(Builder& b, ValueId logits, ValueId labels, ValueId token_count,
                      int64_t ignore_index) {
  return b.op1("cross_entropy", {logits, labels, token_count}, {{"ignore_index", ignore_index}});
}

ValueId cross_entropy_backward(Builder& b, ValueId logits, ValueId labels, ValueId token_count,
                               ValueId dloss, int64_t ignore_index) {
  return b.op1("cross_entropy_backward", {logits, labels, token_count, dloss},
               {{"ignore_index", ignore_index}});
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "cross_entropy",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  MT_CHECK_T(ShapeError, in.size() == 3,
                             "cross_entropy takes (logits, labels, token_count), found {} inputs",
                             in.size());
                  check_common(in, "cross_entropy");
                  return std::vector<TensorMeta>{{Shape{1}, loss_dtype(in[0].dtype)}};
                },
            .backward =
                [](GradContext& c) {
                  ValueId d = cross_entropy_backward(c.b, c.in(0), c.in(1), c.in(2), c.grad_out(0),
                                                     c.attrs().i("ignore_index"));
                  return std::vector<ValueId>{d, kNoValue, kNoValue};
                }});
  r.add_op({.name = "cross_entropy_backward",
            .infer = [](const std::vector<TensorMeta>& in, const Attrs&) {
              MT_CHECK_T(ShapeError, in.size() == 4,
                         "cross_entropy_backward takes (logits, labels, token_count, dloss), "
                         "found {} inputs",
                         in.size());
              check_common(in, "cross_entropy_backward");
              const DType want = loss_dtype(in[0].dtype);
              MT_CHECK_T(ShapeError, in[3].shape == Shape{1} && in[3].dtype == want,
                         "cross_entropy_backward: dloss must be {} [1] (the loss of {} logits), "
                         "found {} {}",
                         want, in[0].dtype, in[3].dtype, in[3].shape);
              return std::vector<TensorMeta>{in[0]};
            }});
}

}  // namespace meshtrain::ops
