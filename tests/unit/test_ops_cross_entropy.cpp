// cross_entropy: loss value against a hand computation, ignore_index (rows skipped in the loss,
// zero rows in the gradient), the count read from its tensor, float32/float64 agreement, the
// float64 gradcheck, and the label / count / shape errors.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "meshtrain/ops/cross_entropy.h"
#include "meshtrain/ops/elementwise.h"

namespace meshtrain {
namespace {
using testing::gradcheck;
using testing::InputSpec;

using testing::expect_grad_ok;

double naive_row_loss(const std::vector<double>& logits, int64_t row, int64_t v, int label) {
  double s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp(logits[size_t(row * v + j)]);
  return std::log(s) - logits[size_t(row * v + label)];
}

std::vector<Tensor> ce_inputs(const std::vector<double>& logits, int64_t n, int64_t v,
                              const std::vector<int32_t>& labels, int64_t count) {
  return {Tensor::from_vector(logits, Shape{n, v}), Tensor::from_vector(labels, Shape{n}),
          Tensor::from_vector(std::vector<int64_t>{count}, Shape{1})};
}

TEST(OpsCrossEntropy, ForwardMatchesHandComputation) {
  const int64_t n = 3, v = 4;
  std::vector<double> logits = {0.5, -1.0, 2.0, 0.0, 3.0, 3.0, 3.0, 3.0, -2.0, 1.0, 0.25, 4.0};
  std::vector<int32_t> labels = {1, -100, 3};
  // Dividing by 5 (not the 2 counted rows) shows the kernel reads the count tensor.
  auto out = testing::run_forward(
      ce_inputs(logits, n, v, labels, 5), [](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::cross_entropy(b, x[0], x[1], x[2])};
      });
  double want = (naive_row_loss(logits, 0, v, 1) + naive_row_loss(logits, 2, v, 3)) / 5.0;
  EXPECT_NEAR(out[0].to_vector<double>()[0], want, 1e-14);
}

TEST(OpsCrossEntropy, LargeLogitsStayFinite) {
  std::vector<double> logits = {1000.0, 999.0, -1000.0};
  auto out = testing::run_forward(
      ce_inputs(logits, 1, 3, {0}, 1), [](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::cross_entropy(b, x[0], x[1], x[2])};
      });
  EXPECT_NEAR(out[0].to_vector<double>()[0], std::log(1 + std::exp(-1.0)), 1e-12);
}

TEST(OpsCrossEntropy, CustomIgnoreIndexSkipsRowsAndZeroesTheirGradient) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-2, 2);
  const int64_t n = 4, v = 5;
  std::vector<double> logits(static_cast<size_t>(n * v));
  for (double& x : logits) x = dist(rng);
  std::vector<int32_t> labels = {2, 7, 0, 7};  // 7 is the ignore index here
  auto out = testing::run_forward(
      ce_inputs(logits, n, v, labels, 2), [](Builder& b, const std::vector<ValueId>& x) {
        ValueId loss = ops::cross_entropy(b, x[0], x[1], x[2], /*ignore_index=*/7);
        ValueId dloss = ops::fill(b, Shape{1}, DType::kF64, 3.0);
        ValueId dlogits = ops::cross_entropy_backward(b, x[0], x[1], x[2], dloss, 7);
        return std::vector<ValueId>{loss, dlogits};
      });
  double want = (naive_row_loss(logits, 0, v, 2) + naive_row_loss(logits, 2, v, 0)) / 2.0;
  EXPECT_NEAR(out[0].to_vector<double>()[0], want, 1e-14) << "seed " << seed;
  std::vector<double> d = out[1].to_vector<double>();
  for (int64_t r = 0; r < n; ++r) {
    double row_sum = 0;
    for (int64_t j = 0; j < v; ++j) {
      double g = d[size_t(r * v + j)];
      row_sum += g;
      if (labels[size_t(r)] == 7) {
        EXPECT_EQ(g, 0.0) << "ignored row " << r;
      } else {
        double z = 0;
        for (int64_t k = 0; k < v; ++k) z += std::exp(logits[size_t(r * v + k)]);
        double p = std::exp(logits[size_t(r * v + j)]) / z;
        double want_g = (p - (j == labels[size_t(r)] ? 1.0 : 0.0)) * 3.0 / 2.0;
        EXPECT_NEAR(g, want_g, 1e-14) << "row " << r << " col " << j;
      }
    }
    EXPECT_NEAR(row_sum, 0.0, 1e-14);
  }
}

MT_GRADCHECK_TEST(OpsCrossEntropy, GradCheckLogitsWithIgnoredRows, "cross_entropy") {
  InputSpec logits{Shape{6, 5}, DType::kF64, true, 0, -2.0, 2.0};
  InputSpec labels{.shape = Shape{6},
                   .dtype = DType::kI32,
                   .differentiable = false,
                   .values = {4, -100, 0, 2, -100, 1}};
  InputSpec count{.shape = Shape{1}, .dtype = DType::kI64, .differentiable = false, .values = {4}};
  expect_grad_ok(gradcheck({logits, labels, count}, [](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::cross_entropy(b, x[0], x[1], x[2])};
  }));
}

TEST(OpsCrossEntropy, Float32MatchesFloat64) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-5, 5);
  const int64_t n = 16, v = 33;
  std::vector<double> logits(static_cast<size_t>(n * v));
  for (double& x : logits) x = dist(rng);
  std::vector<int32_t> labels(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) labels[size_t(r)] = int32_t((r * 7) % v);
  labels[3] = -100;
  auto build = [](Builder& b, const std::vector<ValueId>& x) {
    ValueId loss = ops::cross_entropy(b, x[0], x[1], x[2]);
    ValueId one = ops::fill(b, Shape{1}, b.dtype(x[0]), 1.0);
    return std::vector<ValueId>{loss, ops::cross_entropy_backward(b, x[0], x[1], x[2], one)};
  };
  auto o64 = testing::run_forward(ce_inputs(logits, n, v, labels, n - 1), build);
  std::vector<Tensor> in32 = ce_inputs(logits, n, v, labels, n - 1);
  in32[0] = Tensor::from_vector(std::vector<float>(logits.begin(), logits.end()), Shape{n, v});
  auto o32 = testing::run_forward(in32, build);
  EXPECT_NEAR(double(o32[0].to_vector<float>()[0]), o64[0].to_vector<double>()[0], 1e-5);
  std::vector<double> a = o64[1].to_vector<double>();
  std::vector<float> f = o32[1].to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(double(f[i]), a[i], 1e-6) << "seed " << seed;
}

void expect_value_error(const std::vector<Tensor>& inputs, const std::vector<std::string>& parts) {
  try {
    testing::run_forward(inputs, [](Builder& b, const std::vector<ValueId>& x) {
      return std::vector<ValueId>{ops::cross_entropy(b, x[0], x[1], x[2])};
    });
    FAIL() << "expected a value error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kValue) << m;
    for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << m;
  }
}

TEST(OpsCrossEntropy, LabelOutOfRangeIsValueError) {
  std::vector<double> logits(2 * 4, 0.1);
  expect_value_error(ce_inputs(logits, 2, 4, {1, 9}, 2), {"row 1 has label 9", "[0, 4)"});
  expect_value_error(ce_inputs(logits, 2, 4, {-1, 0}, 2), {"row 0 has label -1", "-100"});
}

TEST(OpsCrossEntropy, NonPositiveCountIsValueError) {
  std::vector<double> logits(2 * 4, 0.1);
  expect_value_error(ce_inputs(logits, 2, 4, {1, 2}, 0),
                     {"token_count must be positive", "found 0"});
}

TEST(OpsCrossEntropy, BadShapes) {
  Graph g;
  Builder b(g);
  ValueId logits = b.input("logits", {Shape{8, 10}, DType::kF32});
  ValueId labels = b.input("labels", {Shape{6}, DType::kI32});
  ValueId labels64 = b.input("labels64", {Shape{8}, DType::kI64});
  ValueId count = b.input("count", {Shape{1}, DType::kI64});
  ValueId count32 = b.input("count32", {Shape{1}, DType::kI32});
  ValueId good_labels = b.input("good", {Shape{8}, DType::kI32});
  auto expect_msg = [&](ValueId l, ValueId c, const std::string& want) {
    try {
      ops::cross_entropy(b, logits, l, c);
      FAIL() << "expected a ShapeError";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_msg(labels, count, "labels must be [8] (one per logits row), found [6]");
  expect_msg(labels64, count, "labels must be int32, found int64");
  expect_msg(good_labels, count32, "token_count must be int64 [1], found int32 [1]");
}

}  // namespace
}  // namespace meshtrain
