// rmsnorm: forward against a naive float64 formula, float32/float64 agreement, gradchecks of
// x and w through the fused rmsnorm_backward, and the weight-size error message.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "meshtrain/ops/rmsnorm.h"

namespace meshtrain {
namespace {
using testing::gradcheck;
using testing::InputSpec;

using testing::expect_grad_ok;

std::vector<double> random_values(int64_t n, std::mt19937_64& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

ValueId build_norm(Builder& b, const std::vector<ValueId>& x, double eps) {
  return ops::rmsnorm(b, x[0], x[1], eps);
}

TEST(OpsRmsNorm, ForwardMatchesNaive) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t rows = 6, D = 8;
  const double eps = 1e-5;
  std::vector<double> x = random_values(rows * D, rng, -2, 2), w = random_values(D, rng);
  auto out = testing::run_forward(
      {Tensor::from_vector(x, Shape{2, 3, D}), Tensor::from_vector(w, Shape{D})},
      [&](Builder& b, const std::vector<ValueId>& in) {
        return std::vector<ValueId>{build_norm(b, in, eps)};
      });
  std::vector<double> got = out[0].to_vector<double>();
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t j = 0; j < D; ++j) ms += x[size_t(r * D + j)] * x[size_t(r * D + j)];
    ms /= double(D);
    for (int64_t j = 0; j < D; ++j) {
      double want = x[size_t(r * D + j)] / std::sqrt(ms + eps) * w[size_t(j)];
      EXPECT_NEAR(got[size_t(r * D + j)], want, 1e-14) << "seed " << seed;
    }
  }
}

TEST(OpsRmsNorm, Float32MatchesFloat64) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t rows = 5, D = 32;
  std::vector<double> x = random_values(rows * D, rng, -3, 3), w = random_values(D, rng);
  auto build = [](Builder& b, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{build_norm(b, in, 1e-6)};
  };
  auto o64 = testing::run_forward(
      {Tensor::from_vector(x, Shape{rows, D}), Tensor::from_vector(w, Shape{D})}, build);
  auto o32 = testing::run_forward(
      {Tensor::from_vector(std::vector<float>(x.begin(), x.end()), Shape{rows, D}),
       Tensor::from_vector(std::vector<float>(w.begin(), w.end()), Shape{D})},
      build);
  std::vector<double> a = o64[0].to_vector<double>();
  std::vector<float> f = o32[0].to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(double(f[i]), a[i], 1e-5 * std::max(1.0, std::abs(a[i]))) << "seed " << seed;
}

MT_GRADCHECK_TEST(OpsRmsNorm, GradCheckXAndWeight, "rmsnorm") {
  expect_grad_ok(gradcheck({{Shape{2, 3, 8}, DType::kF64, true, 0, -2.0, 2.0}, {Shape{8}}},
                           [](Builder& b, const std::vector<ValueId>& x) {
                             return std::vector<ValueId>{build_norm(b, x, 1e-5)};
                           }));
}

TEST(OpsRmsNorm, GradCheckWeightOnly) {
  // x fixed (not differentiable): the rule still emits rmsnorm_backward and uses its dw.
  expect_grad_ok(gradcheck({{Shape{4, 5}, DType::kF64, false}, {Shape{5}}},
                           [](Builder& b, const std::vector<ValueId>& x) {
                             return std::vector<ValueId>{build_norm(b, x, 1e-6)};
                           }));
}

TEST(OpsRmsNorm, WeightOfWrongSizeNamesBothSizes) {
  Graph g;
  Builder b(g);
  auto s = b.scope("layers.1.attention_norm");
  ValueId x = b.input("x", {Shape{4, 8}, DType::kF32});
  ValueId w = b.input("w", {Shape{7}, DType::kF32});
  try {
    ops::rmsnorm(b, x, w, 1e-5);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("layers.1.attention_norm"), std::string::npos) << m;
    EXPECT_NE(m.find("weight must be [8]"), std::string::npos) << m;
    EXPECT_NE(m.find("found [7]"), std::string::npos) << m;
  }
}

TEST(OpsRmsNorm, WeightDtypeMismatch) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{4, 8}, DType::kF32});
  ValueId w = b.input("w", {Shape{8}, DType::kF64});
  try {
    ops::rmsnorm(b, x, w, 1e-5);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("weight dtype float64 differs from x dtype float32"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
