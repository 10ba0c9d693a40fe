// CPU router kernels, one token at a time in float64 scratch (the workspace; no allocation):
// scores, the biased choice, group limiting, a deterministic partial sort (higher score first,
// lower id on ties), then the gate weights. The backward recomputes the scores from the logits.
#include "meshtrain/moe/router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "meshtrain/ops/cpu/cpu_kernel.h"

namespace meshtrain::cpu {
namespace {

struct Scratch {
  double* scores;  // [E]
  double* choice;  // [E] biased scores (masked to -inf outside the limited groups); ds in backward
  double* group;   // [G]
  int32_t* order;  // [E]
  int32_t* group_order;  // [G]
};

Scratch scratch(const KernelContext& c, int64_t e, int64_t g) {
  auto* d = static_cast<double*>(c.workspace.raw());
  Scratch s{d, d + e, d + 2 * e, nullptr, nullptr};
  s.order = reinterpret_cast<int32_t*>(d + 2 * e + g);
  s.group_order = s.order + e;
  return s;
}

template <typename T>
void compute_scores(const T* logits, int64_t e, bool softmax, double* s) {
  if (softmax) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < e; ++i) m = std::max(m, double(logits[i]));
    double sum = 0;
    for (int64_t i = 0; i < e; ++i) sum += (s[i] = std::exp(double(logits[i]) - m));
    for (int64_t i = 0; i < e; ++i) s[i] /= sum;
  } else {
    for (int64_t i = 0; i < e; ++i) s[i] = 1.0 / (1.0 + std::exp(-double(logits[i])));
  }
}

// The first n entries of `idx` become the n best by value (descending), lower index on ties.
void best_n(const double* value, int32_t* idx, int64_t count, int64_t n) {
  std::iota(idx, idx + count, 0);
  std::partial_sort(idx, idx + n, idx + count, [value](int32_t a, int32_t b) {
    return value[a] > value[b] || (value[a] == value[b] && a < b);
  });
}

template <typename T>
void route(const KernelContext& c, const ops::RouterConfig& cfg) {
  const Shape& ls = c.in[0].shape();
  const int64_t tokens = ls[0], e = ls[1], k = cfg.top_k, g = cfg.num_expert_groups;
  const T* logits = in_ptr<T>(c, 0);
  const T* bias = in_ptr<T>(c, 1);
  int32_t* ids = out_ptr<int32_t>(c, 0);
  T* weights = out_ptr<T>(c, 1);
  Scratch s = scratch(c, e, g);
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < tokens; ++t) {
    // A NaN or infinite logit would make the ordering undefined; training has diverged by then.
    for (int64_t i = 0; i < e; ++i)
      MT_CHECK_T(ValueError, std::isfinite(double(logits[t * e + i])),
                 "router: the gate logit of expert {} at token {} is {} (training diverged?)", i, t,
                 double(logits[t * e + i]));
    compute_scores(logits + t * e, e, cfg.score_func == "softmax", s.scores);
    for (int64_t i = 0; i < e; ++i) s.choice[i] = s.scores[i] + double(bias[i]);
    if (g > 0) {
      const int64_t per = e / g;
      for (int64_t gi = 0; gi < g; ++gi) {
        double top1 = neg_inf, top2 = neg_inf;
        for (int64_t i = gi * per; i < (gi + 1) * per; ++i) {
          const double v = s.choice[i];
          if (v > top1) {
            top2 = top1;
            top1 = v;
          } else if (v > top2) {
            top2 = v;
          }
        }
        s.group[gi] = top1 + top2;
      }
      best_n(s.group, s.group_order, g, cfg.num_limited_groups);
      for (int64_t j = cfg.num_limited_groups; j < g; ++j) {
        const int64_t gi = s.group_order[j];
        for (int64_t i = gi * per; i < (gi + 1) * per; ++i) s.choice[i] = neg_inf;
      }
    }
    best_n(s.choice, s.order, e, k);
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s.scores[s.order[j]];
    const double norm = cfg.route_norm ? 1.0 / (sum + 1e-20) : 1.0;
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = s.order[j];
      weights[t * k + j] = T(s.scores[s.order[j]] * norm * cfg.route_scale);
    }
  }
}

// w_j = scale · u_j / N with u_j = s[id_j] and N = Σu + 1e-20 (N = 1 without route_norm):
// du_j = scale · (g_j / N − Σ_i g_i u_i / N²); ds scatters du; softmax: dl = s (ds − <s, ds>);
// sigmoid: dl = ds · s (1 − s).
template <typename T>
void route_backward(const KernelContext& c, const ops::RouterConfig& cfg) {
  const Shape& ls = c.in[0].shape();
  const int64_t tokens = ls[0], e = ls[1], k = cfg.top_k;
  const T* logits = in_ptr<T>(c, 0);
  const int32_t* ids = in_ptr<int32_t>(c, 1);
  const T* dw = in_ptr<T>(c, 2);
  T* dl = out_ptr<T>(c, 0);
  Scratch s = scratch(c, e, cfg.num_expert_groups);
  const bool softmax = cfg.score_func == "softmax";
  for (int64_t t = 0; t < tokens; ++t) {
    compute_scores(logits + t * e, e, softmax, s.scores);
    const int32_t* id = ids + t * k;
    const T* g = dw + t * k;
    double* ds = s.choice;
    std::fill_n(ds, e, 0.0);
    if (cfg.route_norm) {
      double sum = 0, gu = 0;
      for (int64_t j = 0; j < k; ++j) {
        sum += s.scores[id[j]];
        gu += double(g[j]) * s.scores[id[j]];
      }
      const double n = sum + 1e-20;
      for (int64_t j = 0; j < k; ++j)
        ds[id[j]] += cfg.route_scale * (double(g[j]) / n - gu / (n * n));
    } else {
      for (int64_t j = 0; j < k; ++j) ds[id[j]] += cfg.route_scale * double(g[j]);
    }
    T* out = dl + t * e;
    if (softmax) {
      double dot = 0;
      for (int64_t i = 0; i < e; ++i) dot += s.scores[i] * ds[i];
      for (int64_t i = 0; i < e; ++i) out[i] = T(s.scores[i] * (ds[i] - dot));
    } else {
      for (int64_t i = 0; i < e; ++i) out[i] = T(ds[i] * s.scores[i] * (1.0 - s.scores[i]));
    }
  }
}

// Scratch per token: scores and biased scores (E doubles each), expert order (E int32), group
// scores (G doubles) and group order (G int32).
size_t router_workspace(const std::vector<TensorMeta>& in, const std::vector<TensorMeta>&,
                        const Attrs& a) {
  const int64_t e = in[0].shape[1], g = a.i("num_expert_groups");
  return size_t(2 * e + g) * sizeof(double) + size_t(e + g) * sizeof(int32_t);
}

MT_REGISTER_OPS {
  auto& reg = OpRegistry::instance();
  reg.add_kernel_factory(
      "router", DeviceType::kCPU,
      [](const Node& node, const Graph&) {
        ops::RouterConfig cfg = ops::router_config_from_attrs(node.attrs);
        return KernelFn([cfg](KernelContext& c) {
          MT_DISPATCH_FLOAT(c.in[0].dtype(), "router", [&] { route<scalar_t>(c, cfg); });
        });
      },
      router_workspace);
  reg.add_kernel_factory(
      "router_backward", DeviceType::kCPU,
      [](const Node& node, const Graph&) {
        ops::RouterConfig cfg = ops::router_config_from_attrs(node.attrs);
        return KernelFn([cfg](KernelContext& c) {
          MT_DISPATCH_FLOAT(c.in[0].dtype(), "router_backward",
                            [&] { route_backward<scalar_t>(c, cfg); });
        });
      },
      router_workspace);
}

}  // namespace
}  // namespace meshtrain::cpu
