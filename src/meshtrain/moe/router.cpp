// router / router_backward: config validation, shape inference, workspace and the backward rule.
#include "meshtrain/moe/router.h"

namespace meshtrain::ops {
namespace {

Attrs router_attrs(const RouterConfig& c) {
  return {{"score_func", c.score_func},
          {"top_k", c.top_k},
          {"num_expert_groups", c.num_expert_groups},
          {"num_limited_groups", c.num_limited_groups},
          {"route_norm", int64_t(c.route_norm)},
          {"route_scale", c.route_scale}};
}

void check_logits(const TensorMeta& logits, const char* op) {
  MT_CHECK_T(ShapeError, logits.shape.rank() == 2, "{}: logits must be [T, E], found {}", op,
             logits.shape);
  MT_CHECK_T(ShapeError, logits.dtype == DType::kF32 || logits.dtype == DType::kF64,
             "{}: logits must be float32 or float64 (the router computes in float32), found {}", op,
             logits.dtype);
}

void check_choices(const TensorMeta& t, const TensorMeta& logits, int64_t k, DType dtype,
                   const char* what, const char* op) {
  const Shape want{logits.shape[0], k};
  MT_CHECK_T(ShapeError, t.shape == want && t.dtype == dtype, "{}: {} must be {} {}, found {} {}",
             op, what, dtype, want, t.dtype, t.shape);
}

}  // namespace

void validate_router_config(const RouterConfig& c, int64_t num_experts) {
  MT_CHECK_T(ConfigError, c.score_func == "softmax" || c.score_func == "sigmoid",
             "router score_func must be softmax or sigmoid, found '{}'", c.score_func);
  MT_CHECK_T(ConfigError, num_experts >= 1, "router needs at least one expert, found {}",
             num_experts);
  MT_CHECK_T(ConfigError, c.top_k >= 1 && c.top_k <= num_experts,
             "router top_k must be in [1, num_experts = {}], found {}", num_experts, c.top_k);
  MT_CHECK_T(ConfigError, c.route_scale > 0, "router route_scale must be > 0, found {}",
             c.route_scale);
  if (c.num_expert_groups == 0) {
    MT_CHECK_T(ConfigError, c.num_limited_groups == 0,
               "router num_limited_groups {} needs num_expert_groups > 0", c.num_limited_groups);
    return;
  }
  const int64_t g = c.num_expert_groups;
  MT_CHECK_T(ConfigError, g > 0 && num_experts % g == 0,
             "router num_expert_groups must be positive and divide num_experts {}, found {}",
             num_experts, g);
  MT_CHECK_T(ConfigError, num_experts / g >= 2,
             "router groups need at least 2 experts each (a group scores its top 2), found {} "
             "experts in {} groups",
             num_experts, g);
  MT_CHECK_T(ConfigError, c.num_limited_groups >= 1 && c.num_limited_groups <= g,
             "router num_limited_groups must be in [1, num_expert_groups = {}], found {}", g,
             c.num_limited_groups);
  MT_CHECK_T(ConfigError, c.top_k <= c.num_limited_groups * (num_experts / g),
             "router top_k {} exceeds the {} experts of {} limited groups", c.top_k,
             c.num_limited_groups * (num_experts / g), c.num_limited_groups);
}

RouterConfig router_config_from_attrs(const Attrs& a) {
  RouterConfig c;
  c.score_func = a.s("score_func");
  c.top_k = a.i("top_k");
  c.num_expert_groups = a.i("num_expert_groups");
  c.num_limited_groups = a.i("num_limited_groups");
  c.route_norm = a.b("route_norm");
  c.route_scale = a.f("route_scale");
  return c;
}

RouterOutputs router(Builder& b, ValueId logits, ValueId expert_bias, const RouterConfig& cfg) {
  // A bad config is the user's (flavor or TOML), so it surfaces as a ConfigError here, before
  // shape inference would report it as a ShapeError of the node.
  if (b.shape(logits).rank() == 2) validate_router_config(cfg, b.shape(logits)[1]);
  std::vector<ValueId> o = b.op("router", {logits, expert_bias}, router_attrs(cfg));
  return {o[0], o[1]};
}

ValueId router_backward(Builder& b, ValueId logits, ValueId ids, ValueId dweights,
                        const RouterConfig& cfg) {
  return b.op1("router_backward", {logits, ids, dweights}, router_attrs(cfg));
}

MT_REGISTER_OPS {
  auto& r = OpRegistry::instance();
  r.add_op({.name = "router",
            .infer =
                [](const std::vector<TensorMeta>& in, const Attrs& a) {
                  MT_CHECK_T(ShapeError, in.size() == 2,
                             "router takes (logits, expert_bias), found {} inputs", in.size());
                  check_logits(in[0], "router");
                  const int64_t e = in[0].shape[1];
                  MT_CHECK_T(ShapeError, in[1].shape == Shape{e} && in[1].dtype == in[0].dtype,
                             "router: expert_bias must be {} [{}] like the logits, found {} {}",
                             in[0].dtype, e, in[1].dtype, in[1].shape);
                  RouterConfig c = router_config_from_attrs(a);
                  validate_router_config(c, e);
                  const int64_t t = in[0].shape[0];
                  return std::vector<TensorMeta>{{Shape{t, c.top_k}, DType::kI32},
                                                 {Shape{t, c.top_k}, in[0].dtype}};
                },
            .backward =
                [](GradContext& c) {
                  // The ids are integers and the bias only moves the choice: only the logits have a
                  // gradient, through the weights.
                  ValueId dl = kNoValue;
                  if (c.needs_grad[0] && c.grad_out(1) != kNoValue)
                    dl = router_backward(c.b, c.in(0), c.out(0), c.grad_out(1),
                                         router_config_from_attrs(c.attrs()));
                  return std::vector<ValueId>{dl, kNoValue};
                }});
  r.add_op(
      {.name = "router_backward", .infer = [](const std::vector<TensorMeta>& in, const Attrs& a) {
         MT_CHECK_T(ShapeError, in.size() == 3,
                    "router_backward takes (logits, ids, dweights), found {} inputs", in.size());
         check_logits(in[0], "router_backward");
         RouterConfig c = router_config_from_attrs(a);
         validate_router_config(c, in[0].shape[1]);
         check_choices(in[1], in[0], c.top_k, DType::kI32, "ids", "router_backward");
         check_choices(in[2], in[0], c.top_k, in[0].dtype, "dweights", "router_backward");
         return std::vector<TensorMeta>{in[0]};
       }});
}

}  // namespace meshtrain::ops
