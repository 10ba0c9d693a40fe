// attention / attention_backward: shape inference and the backward rule.
// The gradient of lse is not supported: the model never puts lse on the path to the loss.
#include "meshtrain/ops/attention.h"

namespace meshtrain::ops {

AttentionDims attention_dims(const TensorMeta& q, const TensorMeta& k, const TensorMeta& v) {
  MT_CHECK_T(ShapeError, q.shape.rank() == 4 && k.shape.rank() == 4 && v.shape.rank() == 4,
             "attention: q, k, v must be [B, S, H, D], found {}, {}, {}", q.shape, k.shape,
             v.shape);
  MT_CHECK_T(ShapeError, is_floating(q.dtype) && k.dtype == q.dtype && v.dtype == q.dtype,
             "attention: q, k, v must share a floating dtype, found {}, {}, {}", q.dtype, k.dtype,
             v.dtype);
  AttentionDims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]};
  MT_CHECK_T(
      ShapeError,
      k.shape[0] == d.batch && v.shape[0] == d.batch && k.shape[1] == d.seq && v.shape[1] == d.seq,
      "attention: q {}, k {}, v {} must agree on batch and sequence (dims 0 and 1)", q.shape,
      k.shape, v.shape);
  MT_CHECK_T(ShapeError, k.shape[3] == d.dim_qk,
             "attention: q head dim {} differs from k head dim {} (q {}, k {})", d.dim_qk,
             k.shape[3], q.shape, k.shape);
  MT_CHECK_T(ShapeError, v.shape[2] == d.heads_kv,
             "attention: k has {} heads, v has {} (k {}, v {})", d.heads_kv, v.shape[2], k.shape,
             v.shape);
  MT_CHECK_T(ShapeError, d.dim_qk > 0 && d.dim_v > 0,
             "attention: head dims must be positive, found q/k {} and v {}", d.dim_qk, d.dim_v);
  MT_CHECK_T(ShapeError, d.heads_kv > 0 && d.heads_q % d.heads_kv == 0,
             "attention: q heads {} must be a multiple of kv heads {}", d.heads_q, d.heads_kv);
  return d;
}

namespace {
// The two S×S matmuls of attention (QKᵀ and PV), halved under the causal mask; the backward does
// 2.5 times the forward's work. q [B, S, H, Dqk], v [B, S, H, Dv].
int64_t attention_flops(const std::vector<TensorMeta>& in, const Attrs& a, double times_forward) {
  const Shape& q = in.at(0).shape;
  const Shape& v = in.at(2).shape;
  const double fwd =
      2.0 * double(q[0]) * double(q[2]) * double(q[1]) * double(q[1]) * double(q[3] + v[3]) / 2.0;
  const double causal = a.i("causal", 1) ? 1.0 : 2.0;  // causal: half of S²
  return int64_t(causal * (times_forward * fwd));
}
}  // namespace

DType attention_lse_dtype(DType input) { return input == DType::kF64 ? DType::kF64 : DType::kF32; }

const char* attention_kernel_name(AttentionKernel k) {
  switch (k) {
    case AttentionKernel::kAuto: return "auto";
    case AttentionKernel::kCudnn: return "cudnn";
    case AttentionKernel::kMeshtrain: return "meshtrain";
  }
  return "auto";
}

// Graphs built before the attribute existed (and tests that build nodes by hand) carry none.
AttentionKernel attention_kernel_of(const Attrs& attrs) {
  return attrs.has("kernel") ? AttentionKernel(attrs.i("kernel")) : AttentionKernel::kAuto;
}

AttentionOutputs attention(Builder& b, ValueId q, ValueId k, ValueId v, double softmax_scale,
                           bool causal, AttentionKernel kernel) {
  std::vector<ValueId> o = b.op(
      kAttentionOp, {q, k, v},
      {{"softmax_scale", softmax_scale}, {"causal", int64_t(causal)}, {"kernel", int64_t(kernel)}});
  return {o[0], o[1]};
}

AttentionGrads attention_backward(Builder& b, ValueId q, ValueId k, ValueId v, ValueId out,
                                  ValueId lse, ValueId dout, double softmax_scale, bool causal,
                                  AttentionKernel kernel) {
  std::vector<ValueId> g = b.op(
      kAttentionBackwardOp, {q, k, v, out, lse, dout},
      {{"softmax_scale", softmax_scale}, {"causal", int64_t(causal)}, {"kernel", int64_t(kernel)}});
  return {g[0], g[1], g[2]};
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = kAttentionOp,
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs&) {
                  MT_CHECK_T(ShapeError, in.size() == 3,
                             "attention takes (q, k, v), found {} inputs", in.size());
                  AttentionDims d = attention_dims(in[0], in[1], in[2]);
                  return std::vector<TensorMeta>{
                      {Shape{d.batch, d.seq, d.heads_q, d.dim_v}, in[0].dtype},
                      {Shape{d.batch, d.heads_q, d.seq}, attention_lse_dtype(in[0].dtype)}};
                },
            .backward =
                [](GradContext& c) {
                  MT_CHECK(c.grad_out(1) == kNoValue,
                           "attention at '{}': a gradient through lse is not supported",
                           c.node.scope);
                  const Attrs& a = c.attrs();
                  AttentionGrads g = attention_backward(
                      c.b, c.in(0), c.in(1), c.in(2), c.out(0), c.out(1), c.grad_out(0),
                      a.f("softmax_scale"), a.b("causal"), attention_kernel_of(a));
                  return std::vector<ValueId>{g.dq, g.dk, g.dv};
                },
            .compute_heavy = true,
            .flops = [](const std::vector<TensorMeta>& in,
                        const Attrs& a) { return attention_flops(in, a, 1.0); }});
  r.add_op(
      {.name = kAttentionBackwardOp,
       .infer =
           [](const std::vector<TensorMeta>& in, const Attrs&) {
             MT_CHECK_T(ShapeError, in.size() == 6,
                        "attention_backward takes (q, k, v, out, lse, dout), found {} inputs",
                        in.size());
             AttentionDims d = attention_dims(in[0], in[1], in[2]);
             TensorMeta out{Shape{d.batch, d.seq, d.heads_q, d.dim_v}, in[0].dtype};
             TensorMeta lse{Shape{d.batch, d.heads_q, d.seq}, attention_lse_dtype(in[0].dtype)};
             MT_CHECK_T(ShapeError, in[3] == out && in[5] == out,
                        "attention_backward: out and dout must be {} {}, found {} {} and {} {}",
                        out.dtype, out.shape, in[3].dtype, in[3].shape, in[5].dtype, in[5].shape);
             MT_CHECK_T(ShapeError, in[4] == lse,
                        "attention_backward: lse must be {} {}, found {} {}", lse.dtype, lse.shape,
                        in[4].dtype, in[4].shape);
             return std::vector<TensorMeta>{in[0], in[1], in[2]};
           },
       .compute_heavy = true,
       .flops = [](const std::vector<TensorMeta>& in,
                   const Attrs& a) { return attention_flops(in, a, 2.5); }});
}

}  // namespace meshtrain::ops
