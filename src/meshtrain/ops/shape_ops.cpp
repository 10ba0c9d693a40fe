// slice, slice_backward, concat, expand, sum_dim: shape inference and backward rules. The op
// attributes keep the dim as the caller gave it; inference normalizes it (and names it on error).
#include "meshtrain/ops/shape_ops.h"

namespace meshtrain::ops {

DimSplit split_at(const Shape& s, int dim) {
  int d = s.normalize(dim);
  DimSplit r{1, s[d], 1};
  for (int i = 0; i < d; ++i) r.outer *= s[i];
  for (int i = d + 1; i < s.rank(); ++i) r.inner *= s[i];
  return r;
}

namespace {

void check_inputs(const std::vector<TensorMeta>& in, size_t n, const char* op) {
  MT_CHECK_T(ShapeError, in.size() == n, "{} takes {} input(s), found {}", op, n, in.size());
}

std::vector<TensorMeta> infer_slice(const std::vector<TensorMeta>& in, const Attrs& a) {
  check_inputs(in, 1, "slice");
  const Shape& s = in[0].shape;
  int d = s.normalize(int(a.i("dim")));
  int64_t start = a.i("start"), len = a.i("length");
  MT_CHECK_T(ShapeError, start >= 0 && len >= 0 && start + len <= s[d],
             "slice [{}, {}) of dim {} is outside its extent {} (shape {})", start, start + len,
             a.i("dim"), s[d], s);
  return {{s.with(d, len), in[0].dtype}};
}

std::vector<TensorMeta> infer_slice_backward(const std::vector<TensorMeta>& in, const Attrs& a) {
  check_inputs(in, 1, "slice_backward");
  const Shape& s = in[0].shape;
  int d = s.normalize(int(a.i("dim")));
  int64_t start = a.i("start"), full = a.i("full_extent");
  MT_CHECK_T(ShapeError, start >= 0 && start + s[d] <= full,
             "slice_backward: [{}, {}) of dim {} does not fit in extent {} (dy shape {})", start,
             start + s[d], a.i("dim"), full, s);
  return {{s.with(d, full), in[0].dtype}};
}

std::vector<TensorMeta> infer_concat(const std::vector<TensorMeta>& in, const Attrs& a) {
  MT_CHECK_T(ShapeError, !in.empty(), "concat needs at least one input");
  const Shape& s0 = in[0].shape;
  int d = s0.normalize(int(a.i("dim")));
  int64_t total = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Shape& s = in[i].shape;
    MT_CHECK_T(ShapeError, in[i].dtype == in[0].dtype,
               "concat: input {} has dtype {}, expected {} like input 0", i, in[i].dtype,
               in[0].dtype);
    MT_CHECK_T(ShapeError, s.rank() == s0.rank(),
               "concat: input {} has shape {}, expected rank {} like input 0 {}", i, s, s0.rank(),
               s0);
    for (int k = 0; k < s.rank(); ++k)
      MT_CHECK_T(ShapeError, k == d || s[k] == s0[k],
                 "concat along dim {}: input {} has shape {}, input 0 has {}; they must agree "
                 "outside dim {}",
                 a.i("dim"), i, s, s0, d);
    total += s[d];
  }
  return {{s0.with(d, total), in[0].dtype}};
}

std::vector<TensorMeta> infer_expand(const std::vector<TensorMeta>& in, const Attrs& a) {
  check_inputs(in, 1, "expand");
  const Shape& s = in[0].shape;
  int d = s.normalize(int(a.i("dim")));
  int64_t n = a.i("n");
  MT_CHECK_T(ShapeError, s[d] == 1, "expand: dim {} of {} must have extent 1, found {}", a.i("dim"),
             s, s[d]);
  MT_CHECK_T(ShapeError, n >= 0, "expand: count must be >= 0, found {}", n);
  return {{s.with(d, n), in[0].dtype}};
}

std::vector<TensorMeta> infer_sum_dim(const std::vector<TensorMeta>& in, const Attrs& a) {
  check_inputs(in, 1, "sum_dim");
  const Shape& s = in[0].shape;
  int d = s.normalize(int(a.i("dim")));
  MT_CHECK_T(ShapeError, is_floating(in[0].dtype), "sum_dim: input must be floating, found {}",
             in[0].dtype);
  return {{s.with(d, 1), in[0].dtype}};
}

}  // namespace

ValueId slice(Builder& b, ValueId x, int dim, int64_t start, int64_t length) {
  return b.op1("slice", {x}, {{"dim", int64_t(dim)}, {"start", start}, {"length", length}});
}

ValueId slice_backward(Builder& b, ValueId dy, int dim, int64_t start, int64_t full_extent) {
  return b.op1("slice_backward", {dy},
               {{"dim", int64_t(dim)}, {"start", start}, {"full_extent", full_extent}});
}

ValueId concat(Builder& b, const std::vector<ValueId>& xs, int dim) {
  return b.op1(kConcatOp, xs, {{"dim", int64_t(dim)}});
}

ValueId expand(Builder& b, ValueId x, int dim, int64_t n) {
  return b.op1("expand", {x}, {{"dim", int64_t(dim)}, {"n", n}});
}

ValueId sum_dim(Builder& b, ValueId x, int dim) {
  return b.op1("sum_dim", {x}, {{"dim", int64_t(dim)}});
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "slice",
            .infer = infer_slice,
            .backward =
                [](GradContext& c) {
                  const Attrs& a = c.attrs();
                  int dim = int(a.i("dim"));
                  int64_t full = c.b.shape(c.in(0))[dim];
                  return std::vector<ValueId>{
                      slice_backward(c.b, c.grad_out(0), dim, a.i("start"), full)};
                },
            .rearranges = true});
  r.add_op({.name = "slice_backward", .infer = infer_slice_backward, .pads_slice = true});
  r.add_op({.name = kConcatOp, .infer = infer_concat, .backward = [](GradContext& c) {
              int dim = int(c.attrs().i("dim"));
              std::vector<ValueId> g(c.node.inputs.size(), kNoValue);
              int64_t offset = 0;
              for (size_t i = 0; i < g.size(); ++i) {
                int64_t ext = c.b.shape(c.in(int(i)))[dim];
                if (c.needs_grad[i]) g[i] = slice(c.b, c.grad_out(0), dim, offset, ext);
                offset += ext;
              }
              return g;
            }});
  r.add_op({.name = "expand", .infer = infer_expand, .backward = [](GradContext& c) {
              return std::vector<ValueId>{sum_dim(c.b, c.grad_out(0), int(c.attrs().i("dim")))};
            }});
  r.add_op(
      {.name = "transpose01",
       .infer =
           [](const std::vector<TensorMeta>& in, const Attrs&) {
             const Shape& x = in.at(0).shape;
             MT_CHECK_T(ShapeError, x.rank() >= 2, "transpose01 needs rank >= 2, found {}", x);
             std::vector<int64_t> d = x.dims();
             std::swap(d[0], d[1]);
             return std::vector<TensorMeta>{{Shape(d), in[0].dtype}};
           },
       .backward =
           [](GradContext& c) { return std::vector<ValueId>{transpose01(c.b, c.grad_out(0))}; },
       .rearranges = true});
  r.add_op({.name = "sum_dim", .infer = infer_sum_dim, .backward = [](GradContext& c) {
              int dim = int(c.attrs().i("dim"));
              return std::vector<ValueId>{expand(c.b, c.grad_out(0), dim, c.b.shape(c.in(0))[dim])};
            }});
}

ValueId transpose01(Builder& b, ValueId x) { return b.op1("transpose01", {x}); }

}  // namespace meshtrain::ops
