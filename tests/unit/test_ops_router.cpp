// router: hand-derived routing decisions (bias moves the choice but not the weight, group
// limiting, deterministic ties), agreement with a full-sort reference on random logits, float64
// gradchecks for both score functions with bias, groups, route_norm and route_scale, and the
// errors a user can hit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gradcheck.h"
#include "meshtrain/moe/router.h"
#include "test_support.h"

namespace meshtrain {
namespace {
using ops::RouterConfig;
using testing::expect_error;
using testing::expect_grad_ok;
using testing::gradcheck;
using testing::InputSpec;

struct Routed {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

Routed run_router(const std::vector<double>& logits, const std::vector<double>& bias, int64_t t,
                  const RouterConfig& cfg) {
  const int64_t e = int64_t(bias.size());
  auto out = testing::run_forward(
      {Tensor::from_vector(logits, Shape{t, e}), Tensor::from_vector(bias, Shape{e})},
      [&](Builder& b, const std::vector<ValueId>& x) {
        ops::RouterOutputs r = ops::router(b, x[0], x[1], cfg);
        return std::vector<ValueId>{r.ids, r.weights};
      });
  return {out[0].to_vector<int32_t>(), out[1].to_vector<double>()};
}

// Reference: full stable sorts (not the kernel's partial sort), straight from the definition.
Routed reference(const std::vector<double>& logits, const std::vector<double>& bias, int64_t t,
                 const RouterConfig& c) {
  const int64_t e = int64_t(bias.size()), k = c.top_k;
  Routed r;
  for (int64_t i = 0; i < t; ++i) {
    std::vector<double> s(static_cast<size_t>(e));
    double sum = 0;
    for (int64_t x = 0; x < e; ++x) {
      double l = logits[size_t(i * e + x)];
      s[size_t(x)] = c.score_func == "softmax" ? std::exp(l) : 1 / (1 + std::exp(-l));
      sum += s[size_t(x)];
    }
    if (c.score_func == "softmax")
      for (double& v : s) v /= sum;
    std::vector<double> choice(s);
    for (int64_t x = 0; x < e; ++x) choice[size_t(x)] += bias[size_t(x)];
    if (c.num_expert_groups > 0) {
      const int64_t g = c.num_expert_groups, per = e / g;
      std::vector<double> gs;
      for (int64_t gi = 0; gi < g; ++gi) {
        std::vector<double> m(choice.begin() + gi * per, choice.begin() + (gi + 1) * per);
        std::sort(m.rbegin(), m.rend());
        gs.push_back(m[0] + m[1]);
      }
      std::vector<int> go(static_cast<size_t>(g));
      std::iota(go.begin(), go.end(), 0);
      std::stable_sort(go.begin(), go.end(), [&](int a, int b) { return gs[a] > gs[b]; });
      for (int64_t j = c.num_limited_groups; j < g; ++j)
        for (int64_t x = go[size_t(j)] * per; x < (go[size_t(j)] + 1) * per; ++x)
          choice[size_t(x)] = -INFINITY;
    }
    std::vector<int> order(static_cast<size_t>(e));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return choice[size_t(a)] > choice[size_t(b)]; });
    double top_sum = 0;
    for (int64_t j = 0; j < k; ++j) top_sum += s[size_t(order[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      r.ids.push_back(order[size_t(j)]);
      double w = s[size_t(order[size_t(j)])];
      if (c.route_norm) w /= top_sum + 1e-20;
      r.weights.push_back(w * c.route_scale);
    }
  }
  return r;
}

// Per token, a random permutation of E levels 0.15 apart plus jitter below 0.01: no two logits
// of a token are within 0.13, so a finite-difference step never flips a routing decision.
std::vector<double> separated_logits(int64_t t, int64_t e, std::mt19937_64& rng) {
  std::vector<double> v;
  std::uniform_real_distribution<double> jitter(0, 0.01);
  for (int64_t i = 0; i < t; ++i) {
    std::vector<int> p(static_cast<size_t>(e));
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
    for (int64_t x = 0; x < e; ++x) v.push_back(0.15 * (p[size_t(x)] - e / 2.0) + jitter(rng));
  }
  return v;
}

TEST(OpsRouter, BiasMovesTheChoiceButWeightsUseUnbiasedScores) {
  // Softmax of (2, 1, 0, -1): expert 0 then 1 would win; a bias of +0.9 on expert 3 outweighs
  // expert 1 (score 0.237) though expert 3's own score is 0.032.
  RouterConfig c{.score_func = "softmax", .top_k = 2};
  std::vector<double> logits = {2, 1, 0, -1};
  Routed plain = run_router(logits, {0, 0, 0, 0}, 1, c);
  EXPECT_EQ(plain.ids, (std::vector<int32_t>{0, 1}));
  Routed biased = run_router(logits, {0, 0, 0, 0.9}, 1, c);
  EXPECT_EQ(biased.ids, (std::vector<int32_t>{3, 0}));
  double z = std::exp(2) + std::exp(1) + 1 + std::exp(-1);
  EXPECT_NEAR(biased.weights[0], std::exp(-1) / z, 1e-15);
  EXPECT_NEAR(biased.weights[1], std::exp(2) / z, 1e-15);
}

TEST(OpsRouter, EqualScoresGoToTheLowerExpertId) {
  RouterConfig c{.score_func = "sigmoid", .top_k = 3};
  Routed r = run_router({0.5, 0.5, 0.5, 0.5, 0.5}, {0, 0, 0, 0, 0}, 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  // Group ties too: both groups score the same; group 0 is kept.
  RouterConfig g{
      .score_func = "sigmoid", .top_k = 2, .num_expert_groups = 2, .num_limited_groups = 1};
  Routed rg = run_router({0.1, 0.3, 0.3, 0.1}, {0, 0, 0, 0}, 1, g);
  EXPECT_EQ(rg.ids, (std::vector<int32_t>{1, 0}));
}

TEST(OpsRouter, GroupLimitedRoutingKeepsTheBestGroupsByTopTwoSum) {
  // Groups {0,1} {2,3} {4,5}: expert 0 has the single best score but its group's top-2 sum is
  // below group {2,3}'s; with one limited group only experts 2 and 3 may be chosen.
  RouterConfig c{
      .score_func = "sigmoid", .top_k = 2, .num_expert_groups = 3, .num_limited_groups = 1};
  std::vector<double> logits = {3.0, -3.0, 1.5, 1.4, -1, -2};
  Routed r = run_router(logits, std::vector<double>(6, 0.0), 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  c.num_limited_groups = 2;
  r = run_router(logits, std::vector<double>(6, 0.0), 1, c);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
}

TEST(OpsRouter, RouteNormAndScale) {
  RouterConfig c{.score_func = "sigmoid", .top_k = 2, .route_norm = true, .route_scale = 2.5};
  Routed r = run_router({1.0, -1.0, 0.0}, {0, 0, 0}, 1, c);
  double s0 = 1 / (1 + std::exp(-1.0)), s2 = 0.5;
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(r.weights[0], 2.5 * s0 / (s0 + s2), 1e-15);
  EXPECT_NEAR(r.weights[1], 2.5 * s2 / (s0 + s2), 1e-15);
}

TEST(OpsRouter, MatchesFullSortReferenceOnRandomLogits) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-2, 2), ub(-0.1, 0.1);
  const int64_t t = 37, e = 16;
  std::vector<double> logits(static_cast<size_t>(t * e)), bias(static_cast<size_t>(e));
  for (double& x : logits) x = u(rng);
  for (double& x : bias) x = ub(rng);
  std::vector<RouterConfig> cfgs = {
      {.score_func = "softmax", .top_k = 6},
      {.score_func = "sigmoid", .top_k = 4, .route_norm = true, .route_scale = 2.5},
      {.score_func = "softmax",
       .top_k = 3,
       .num_expert_groups = 4,
       .num_limited_groups = 2,
       .route_scale = 16},
      {.score_func = "sigmoid",
       .top_k = 8,
       .num_expert_groups = 8,
       .num_limited_groups = 4,
       .route_norm = true},
  };
  for (const RouterConfig& c : cfgs) {
    SCOPED_TRACE(fmt::format("{} top-{} groups {}/{} (seed {})", c.score_func, c.top_k,
                             c.num_limited_groups, c.num_expert_groups, seed));
    Routed got = run_router(logits, bias, t, c);
    Routed want = reference(logits, bias, t, c);
    EXPECT_EQ(got.ids, want.ids);
    ASSERT_EQ(got.weights.size(), want.weights.size());
    for (size_t i = 0; i < got.weights.size(); ++i)
      EXPECT_NEAR(got.weights[i], want.weights[i], 1e-14);
  }
}

MT_GRADCHECK_TEST(OpsRouter, GradCheckBothScoreFunctionsWithBiasAndGroups, "router") {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t t = 6, e = 8;
  std::vector<RouterConfig> cfgs = {
      {.score_func = "softmax", .top_k = 3},
      {.score_func = "sigmoid", .top_k = 3},
      {.score_func = "softmax", .top_k = 3, .route_norm = true, .route_scale = 1.7},
      {.score_func = "sigmoid", .top_k = 2, .route_norm = true, .route_scale = 2.5},
      {.score_func = "softmax", .top_k = 3, .num_expert_groups = 4, .num_limited_groups = 2},
      {.score_func = "sigmoid",
       .top_k = 4,
       .num_expert_groups = 4,
       .num_limited_groups = 2,
       .route_norm = true,
       .route_scale = 2.5},
  };
  for (const RouterConfig& c : cfgs) {
    SCOPED_TRACE(fmt::format("{} top-{} norm {} groups {}/{} (seed {})", c.score_func, c.top_k,
                             c.route_norm, c.num_limited_groups, c.num_expert_groups, seed));
    InputSpec logits{.shape = Shape{t, e}, .values = separated_logits(t, e, rng)};
    // A small bias that reorders some choices; it is state, not differentiated.
    std::vector<double> bias(static_cast<size_t>(e));
    for (double& x : bias) x = std::uniform_real_distribution<double>(-0.05, 0.05)(rng);
    InputSpec bias_spec{.shape = Shape{e}, .differentiable = false, .values = bias};
    expect_grad_ok(gradcheck({logits, bias_spec},
                             [&](Builder& b, const std::vector<ValueId>& x) {
                               return std::vector<ValueId>{ops::router(b, x[0], x[1], c).weights};
                             },
                             {.seed = seed}));
  }
}

TEST(OpsRouter, Float32MatchesFloat64) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t t = 9, e = 8;
  std::vector<double> l = separated_logits(t, e, rng);
  std::vector<double> bias = {0.01, -0.02, 0, 0.03, 0, 0, -0.01, 0.02};
  RouterConfig c{.score_func = "softmax",
                 .top_k = 2,
                 .num_expert_groups = 4,
                 .num_limited_groups = 2,
                 .route_norm = true};
  auto run = [&](DType dt) {
    auto cast = [&](const std::vector<double>& v, Shape s) {
      return dt == DType::kF64 ? Tensor::from_vector(v, s)
                               : Tensor::from_vector(std::vector<float>(v.begin(), v.end()), s);
    };
    return testing::run_forward({cast(l, Shape{t, e}), cast(bias, Shape{e})},
                                [&](Builder& b, const std::vector<ValueId>& x) {
                                  ops::RouterOutputs r = ops::router(b, x[0], x[1], c);
                                  return std::vector<ValueId>{r.ids, r.weights};
                                });
  };
  auto o64 = run(DType::kF64);
  auto o32 = run(DType::kF32);
  EXPECT_EQ(o64[0].to_vector<int32_t>(), o32[0].to_vector<int32_t>()) << "seed " << seed;
  std::vector<double> w64 = o64[1].to_vector<double>();
  std::vector<float> w32 = o32[1].to_vector<float>();
  for (size_t i = 0; i < w64.size(); ++i) EXPECT_NEAR(double(w32[i]), w64[i], 1e-6);
}

TEST(OpsRouter, BadInputs) {
  Graph g;
  Builder b(g);
  ValueId l = b.input("logits", {Shape{4, 8}, DType::kF32});
  ValueId bias = b.input("bias", {Shape{8}, DType::kF32});
  auto route = [&](RouterConfig c) { return [&, c] { ops::router(b, l, bias, c); }; };
  expect_error(ErrorKind::kConfig, route({.score_func = "relu"}),
               "softmax or sigmoid, found 'relu'");
  expect_error(ErrorKind::kConfig, route({.top_k = 9}),
               "top_k must be in [1, num_experts = 8], found 9");
  expect_error(ErrorKind::kConfig,
               route({.top_k = 2, .num_expert_groups = 3, .num_limited_groups = 1}),
               "divide num_experts 8, found 3");
  expect_error(ErrorKind::kConfig,
               route({.top_k = 2, .num_expert_groups = 8, .num_limited_groups = 1}),
               "at least 2 experts each");
  expect_error(ErrorKind::kConfig,
               route({.top_k = 5, .num_expert_groups = 4, .num_limited_groups = 2}),
               "top_k 5 exceeds the 4 experts of 2 limited groups");
  expect_error(ErrorKind::kConfig, route({.top_k = 2, .num_limited_groups = 2}),
               "needs num_expert_groups > 0");
  ValueId bad_bias = b.input("bad_bias", {Shape{7}, DType::kF32});
  expect_error(
      ErrorKind::kShape, [&] { ops::router(b, l, bad_bias, {}); },
      "expert_bias must be float32 [8]");
  ValueId bf = b.input("bf", {Shape{4, 8}, DType::kBF16});
  expect_error(
      ErrorKind::kShape, [&] { ops::router(b, bf, bias, {}); }, "must be float32 or float64");
  // NaN logits are data: the kernel names the token and expert.
  std::vector<double> nan_logits = {0, 1, NAN, 2};
  expect_error(
      ErrorKind::kValue,
      [&] {
        testing::run_forward(
            {Tensor::from_vector(nan_logits, Shape{1, 4}),
             Tensor::from_vector(std::vector<double>(4, 0.0), Shape{4})},
            [](Builder& bb, const std::vector<ValueId>& x) {
              return std::vector<ValueId>{ops::router(bb, x[0], x[1], {.top_k = 2}).weights};
            });
      },
      "gate logit of expert 2 at token 0 is nan");
}

}  // namespace
}  // namespace meshtrain
