// swiglu: forward against silu(g) * u, float32/float64 agreement, gradcheck of both inputs
// through swiglu_backward, and the shape-mismatch message.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "meshtrain/ops/swiglu.h"

namespace meshtrain {
namespace {
using testing::gradcheck;
using testing::InputSpec;

using testing::expect_grad_ok;

std::vector<ValueId> build(Builder& b, const std::vector<ValueId>& x) {
  return {ops::swiglu(b, x[0], x[1])};
}

TEST(OpsSwiglu, ForwardMatchesNaive) {
  // Includes large |g| where the sigmoid saturates.
  std::vector<double> g = {-40.0, -3.0, -0.5, 0.0, 0.25, 2.0, 30.0, 800.0};
  std::vector<double> u = {1.5, -2.0, 0.5, 3.0, -1.0, 0.75, 2.0, -1.0};
  auto out = testing::run_forward(
      {Tensor::from_vector(g, Shape{2, 4}), Tensor::from_vector(u, Shape{2, 4})}, build);
  std::vector<double> got = out[0].to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    double want = g[i] / (1 + std::exp(-g[i])) * u[i];
    EXPECT_NEAR(got[i], want, 1e-14 * std::max(1.0, std::abs(want))) << i;
    EXPECT_TRUE(std::isfinite(got[i])) << i;
  }
}

TEST(OpsSwiglu, Float32MatchesFloat64) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-4, 4);
  std::vector<double> g(60), u(60);
  for (size_t i = 0; i < g.size(); ++i) g[i] = dist(rng), u[i] = dist(rng);
  auto o64 = testing::run_forward(
      {Tensor::from_vector(g, Shape{6, 10}), Tensor::from_vector(u, Shape{6, 10})}, build);
  auto o32 = testing::run_forward(
      {Tensor::from_vector(std::vector<float>(g.begin(), g.end()), Shape{6, 10}),
       Tensor::from_vector(std::vector<float>(u.begin(), u.end()), Shape{6, 10})},
      build);
  std::vector<double> a = o64[0].to_vector<double>();
  std::vector<float> f = o32[0].to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(double(f[i]), a[i], 1e-5 * std::max(1.0, std::abs(a[i]))) << "seed " << seed;
}

MT_GRADCHECK_TEST(OpsSwiglu, GradCheckGateAndUp, "swiglu") {
  InputSpec gate{Shape{3, 7}, DType::kF64, true, 0, -3.0, 3.0};
  InputSpec up{Shape{3, 7}, DType::kF64, true, 0, -2.0, 2.0};
  expect_grad_ok(gradcheck({gate, up}, build));
}

TEST(OpsSwiglu, ShapeMismatchNamesBothShapes) {
  Graph g;
  Builder b(g);
  ValueId gate = b.input("gate", {Shape{4, 16}, DType::kF32});
  ValueId up = b.input("up", {Shape{4, 12}, DType::kF32});
  try {
    ops::swiglu(b, gate, up);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("float32 [4, 16] and float32 [4, 12]"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace meshtrain
