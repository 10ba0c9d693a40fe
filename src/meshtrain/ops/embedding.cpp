// embedding / embedding_backward: shape inference and the backward rule. Id range is data, so the
// kernels check it; everything shape- or dtype-related is checked here, once.
#include "meshtrain/ops/embedding.h"

namespace meshtrain::ops {
namespace {

void check_ids(const TensorMeta& ids, const char* op) {
  MT_CHECK_T(ShapeError, ids.dtype == DType::kI32, "{}: ids must be int32, found {}", op,
             ids.dtype);
}

std::vector<TensorMeta> infer_embedding(const std::vector<TensorMeta>& in, const Attrs&) {
  MT_CHECK_T(ShapeError, in.size() == 2, "embedding takes (ids, weight), found {} inputs",
             in.size());
  check_ids(in[0], "embedding");
  const TensorMeta& w = in[1];
  MT_CHECK_T(ShapeError, w.shape.rank() == 2, "embedding: weight must be [V, D], found {}",
             w.shape);
  MT_CHECK_T(ShapeError, is_floating(w.dtype), "embedding: weight must be floating, found {}",
             w.dtype);
  std::vector<int64_t> dims = in[0].shape.dims();
  dims.push_back(w.shape[1]);
  return {{Shape(dims), w.dtype}};
}

std::vector<TensorMeta> infer_embedding_backward(const std::vector<TensorMeta>& in,
                                                 const Attrs& a) {
  MT_CHECK_T(ShapeError, in.size() == 2, "embedding_backward takes (ids, dy), found {} inputs",
             in.size());
  check_ids(in[0], "embedding_backward");
  const TensorMeta& dy = in[1];
  int64_t v = a.i("num_embeddings");
  MT_CHECK_T(ShapeError, v > 0, "embedding_backward: num_embeddings must be positive, found {}", v);
  MT_CHECK_T(ShapeError, dy.shape.rank() == in[0].shape.rank() + 1,
             "embedding_backward: dy must be ids shape {} plus an embedding dim, found {}",
             in[0].shape, dy.shape);
  for (int d = 0; d < in[0].shape.rank(); ++d)
    MT_CHECK_T(ShapeError, dy.shape[d] == in[0].shape[d],
               "embedding_backward: dy {} does not match ids {} at dim {}", dy.shape, in[0].shape,
               d);
  return {{Shape{v, dy.shape.last()}, dy.dtype}};
}

}  // namespace

ValueId embedding(Builder& b, ValueId ids, ValueId weight) {
  return b.op1("embedding", {ids, weight});
}

ValueId embedding_backward(Builder& b, ValueId ids, ValueId dy, int64_t num_embeddings) {
  return b.op1("embedding_backward", {ids, dy}, {{"num_embeddings", num_embeddings}});
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "embedding", .infer = infer_embedding, .backward = [](GradContext& c) {
              // ids are integers: only the weight has a gradient.
              ValueId dw = embedding_backward(c.b, c.in(0), c.grad_out(0), c.b.shape(c.in(1))[0]);
              return std::vector<ValueId>{kNoValue, dw};
            }});
  r.add_op({.name = "embedding_backward", .infer = infer_embedding_backward});
}

}  // namespace meshtrain::ops
