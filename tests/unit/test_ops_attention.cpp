// attention: out and lse against a naive float64 loop (causal and not, GQA, Dqk != Dv),
// float32/float64 agreement, gradchecks of q, k, v through attention_backward, and the errors.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "meshtrain/graph/autodiff.h"
#include "meshtrain/ops/attention.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain {
namespace {
using testing::gradcheck;
using testing::InputSpec;

using testing::expect_grad_ok;

struct Case {
  int64_t B, S, Hq, Hkv, Dqk, Dv;
  bool causal;
};

std::vector<double> random_values(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

// Straightforward attention: loops over (b, h, i), scores over the visible keys only.
void naive_attention(const Case& c, double scale, const std::vector<double>& q,
                     const std::vector<double>& k, const std::vector<double>& v,
                     std::vector<double>& out, std::vector<double>& lse) {
  out.assign(size_t(c.B * c.S * c.Hq * c.Dv), 0.0);
  lse.assign(size_t(c.B * c.Hq * c.S), 0.0);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h) {
      int64_t g = h / (c.Hq / c.Hkv);
      for (int64_t i = 0; i < c.S; ++i) {
        int64_t n = c.causal ? i + 1 : c.S;
        std::vector<double> s(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.Dqk; ++d)
            dot += q[size_t(((b * c.S + i) * c.Hq + h) * c.Dqk + d)] *
                   k[size_t(((b * c.S + j) * c.Hkv + g) * c.Dqk + d)];
          s[size_t(j)] = scale * dot;
        }
        double m = *std::max_element(s.begin(), s.end()), z = 0;
        for (double x : s) z += std::exp(x - m);
        lse[size_t((b * c.Hq + h) * c.S + i)] = m + std::log(z);
        for (int64_t j = 0; j < n; ++j)
          for (int64_t d = 0; d < c.Dv; ++d)
            out[size_t(((b * c.S + i) * c.Hq + h) * c.Dv + d)] +=
                std::exp(s[size_t(j)] - m) / z * v[size_t(((b * c.S + j) * c.Hkv + g) * c.Dv + d)];
      }
    }
}

template <typename T>
std::vector<Tensor> make_inputs(const Case& c, const std::vector<double>& q,
                                const std::vector<double>& k, const std::vector<double>& v) {
  auto conv = [](const std::vector<double>& x) { return std::vector<T>(x.begin(), x.end()); };
  return {Tensor::from_vector(conv(q), Shape{c.B, c.S, c.Hq, c.Dqk}),
          Tensor::from_vector(conv(k), Shape{c.B, c.S, c.Hkv, c.Dqk}),
          Tensor::from_vector(conv(v), Shape{c.B, c.S, c.Hkv, c.Dv})};
}

testing::BuildFn build_attention(double scale, bool causal, bool with_lse) {
  return [=](Builder& b, const std::vector<ValueId>& x) {
    ops::AttentionOutputs o = ops::attention(b, x[0], x[1], x[2], scale, causal);
    return with_lse ? std::vector<ValueId>{o.out, o.lse} : std::vector<ValueId>{o.out};
  };
}

const Case kCases[] = {
    {2, 5, 4, 2, 6, 4, true},   // GQA, Dqk != Dv, causal
    {2, 5, 4, 2, 6, 4, false},  // same, non-causal
    {1, 7, 3, 3, 5, 5, true},   // MHA
    {1, 6, 4, 1, 3, 7, true},   // MQA (one kv head), Dv > Dqk
    {1, 70, 2, 1, 3, 2, true},  // S beyond one CPU row block (64): several blocks
    {1, 70, 2, 2, 2, 3, false},
};

TEST(OpsAttention, ForwardMatchesNaive) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const Case& c : kCases) {
    SCOPED_TRACE(fmt::format("B{} S{} Hq{} Hkv{} Dqk{} Dv{} causal{} seed {}", c.B, c.S, c.Hq,
                             c.Hkv, c.Dqk, c.Dv, c.causal, seed));
    std::vector<double> q = random_values(c.B * c.S * c.Hq * c.Dqk, rng);
    std::vector<double> k = random_values(c.B * c.S * c.Hkv * c.Dqk, rng);
    std::vector<double> v = random_values(c.B * c.S * c.Hkv * c.Dv, rng);
    const double scale = 1.7 / std::sqrt(double(c.Dqk));
    std::vector<double> want_out, want_lse;
    naive_attention(c, scale, q, k, v, want_out, want_lse);
    auto got = testing::run_forward(make_inputs<double>(c, q, k, v),
                                    build_attention(scale, c.causal, true));
    ASSERT_EQ(got[1].shape(), (Shape{c.B, c.Hq, c.S}));
    ASSERT_EQ(got[1].dtype(), DType::kF64);
    std::vector<double> out = got[0].to_vector<double>(), lse = got[1].to_vector<double>();
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want_out[i], 1e-13) << i;
    for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], want_lse[i], 1e-13) << i;
  }
}

TEST(OpsAttention, Float32MatchesFloat64) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const Case c{2, 150, 4, 2, 24, 16, true};
  std::vector<double> q = random_values(c.B * c.S * c.Hq * c.Dqk, rng);
  std::vector<double> k = random_values(c.B * c.S * c.Hkv * c.Dqk, rng);
  std::vector<double> v = random_values(c.B * c.S * c.Hkv * c.Dv, rng);
  const double scale = 1.0 / std::sqrt(double(c.Dqk));
  auto o64 =
      testing::run_forward(make_inputs<double>(c, q, k, v), build_attention(scale, true, true));
  auto o32 =
      testing::run_forward(make_inputs<float>(c, q, k, v), build_attention(scale, true, true));
  ASSERT_EQ(o32[1].dtype(), DType::kF32);
  for (int i = 0; i < 2; ++i) {
    std::vector<double> a = o64[size_t(i)].to_vector<double>();
    std::vector<float> f = o32[size_t(i)].to_vector<float>();
    for (size_t j = 0; j < a.size(); ++j)
      EXPECT_NEAR(double(f[j]), a[j], 2e-6 * std::max(1.0, std::abs(a[j])))
          << "output " << i << " seed " << seed;
  }
}

MT_GRADCHECK_TEST(OpsAttention, GradCheck, "attention") {
  for (const Case& c : kCases) {
    SCOPED_TRACE(fmt::format("B{} S{} Hq{} Hkv{} Dqk{} Dv{} causal{}", c.B, c.S, c.Hq, c.Hkv, c.Dqk,
                             c.Dv, c.causal));
    // Inputs in [-2, 2) give peaked, non-uniform probabilities, so dS is far from zero.
    InputSpec q{Shape{c.B, c.S, c.Hq, c.Dqk}, DType::kF64, true, 0, -2.0, 2.0};
    InputSpec k{Shape{c.B, c.S, c.Hkv, c.Dqk}, DType::kF64, true, 0, -2.0, 2.0};
    InputSpec v{Shape{c.B, c.S, c.Hkv, c.Dv}, DType::kF64, true, 0, -2.0, 2.0};
    expect_grad_ok(gradcheck({q, k, v}, build_attention(0.8, c.causal, false)));
  }
}

TEST(OpsAttention, GradientThroughLseIsRejected) {
  Graph g;
  Builder b(g);
  ValueId q = b.input("q", {Shape{1, 3, 2, 4}, DType::kF64});
  ValueId k = b.input("k", {Shape{1, 3, 2, 4}, DType::kF64});
  ValueId v = b.input("v", {Shape{1, 3, 2, 4}, DType::kF64});
  ops::AttentionOutputs o = ops::attention(b, q, k, v, 0.5);
  ValueId loss = ops::sum(b, o.lse);
  try {
    differentiate(g, loss, {q, k, v});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient through lse is not supported"),
              std::string::npos)
        << e.what();
  }
}

TEST(OpsAttention, BadShapesNameTheMismatch) {
  Graph g;
  Builder b(g);
  auto in = [&](const char* n, Shape s) { return b.input(n, {s, DType::kF32}); };
  auto expect_msg = [&](ValueId q, ValueId k, ValueId v, const std::string& want) {
    try {
      ops::attention(b, q, k, v, 0.125);
      FAIL() << "expected a ShapeError containing: " << want;
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  ValueId q3 = in("q3", {2, 8, 3, 16}), k2 = in("k2", {2, 8, 2, 16}), v2 = in("v2", {2, 8, 2, 8});
  expect_msg(q3, k2, v2, "q heads 3 must be a multiple of kv heads 2");
  ValueId q4 = in("q4", {2, 8, 4, 16}), k_d = in("k_d", {2, 8, 2, 12});
  expect_msg(q4, k_d, v2, "q head dim 16 differs from k head dim 12");
  ValueId k_s = in("k_s", {2, 7, 2, 16});
  expect_msg(q4, k_s, v2, "must agree on batch and sequence");
  ValueId v3 = in("v3", {2, 8, 3, 8});
  expect_msg(q4, k2, v3, "k has 2 heads, v has 3");
  ValueId q_rank = in("q_rank", {16, 64});
  expect_msg(q_rank, k2, v2, "must be [B, S, H, D]");
}

}  // namespace
}  // namespace meshtrain
