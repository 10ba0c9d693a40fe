// embedding: forward lookup, deterministic scatter-add backward, float64 gradcheck, and the
// errors a user can hit (out-of-range id, wrong ids dtype, wrong weight rank).
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "meshtrain/ops/embedding.h"

namespace meshtrain {
namespace {
using testing::gradcheck;
using testing::InputSpec;

using testing::expect_grad_ok;

std::vector<double> random_values(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng);
  return v;
}

TEST(OpsEmbedding, ForwardGathersRows) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t V = 5, D = 4;
  std::vector<int32_t> ids = {3, 0, 3, 4, 1, 2};
  std::vector<double> w = random_values(V * D, rng);
  auto out = testing::run_forward(
      {Tensor::from_vector(ids, Shape{2, 3}), Tensor::from_vector(w, Shape{V, D})},
      [](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::embedding(b, x[0], x[1])};
      });
  ASSERT_EQ(out[0].shape(), (Shape{2, 3, D}));
  std::vector<double> got = out[0].to_vector<double>();
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t j = 0; j < D; ++j)
      EXPECT_EQ(got[t * D + size_t(j)], w[size_t(ids[t] * D + j)]) << "seed " << seed;
}

TEST(OpsEmbedding, BackwardSumsRepeatedIdsAndZerosUnusedRows) {
  const int64_t V = 4, D = 2;
  std::vector<int32_t> ids = {1, 3, 1};
  std::vector<double> dy = {1, 2, 10, 20, 100, 200};
  auto out = testing::run_forward(
      {Tensor::from_vector(ids, Shape{3}), Tensor::from_vector(dy, Shape{3, D})},
      [&](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::embedding_backward(b, x[0], x[1], V)};
      });
  std::vector<double> want = {0, 0, 101, 202, 0, 0, 10, 20};
  EXPECT_EQ(out[0].to_vector<double>(), want);
}

MT_GRADCHECK_TEST(OpsEmbedding, GradCheckWeight, "embedding") {
  // Fixed ids so that one row is hit twice and one row is never hit.
  InputSpec ids{.shape = Shape{2, 3},
                .dtype = DType::kI32,
                .differentiable = false,
                .values = {4, 0, 2, 2, 1, 4}};
  expect_grad_ok(gradcheck({ids, {Shape{6, 5}}}, [](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::embedding(b, x[0], x[1])};
  }));
}

TEST(OpsEmbedding, Float32MatchesFloat64) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::vector<double> w = random_values(7 * 3, rng);
  std::vector<float> wf(w.begin(), w.end());
  std::vector<int32_t> ids = {6, 0, 5, 5};
  auto build = [](Builder& b, const std::vector<ValueId>& x) {
    return std::vector<ValueId>{ops::embedding(b, x[0], x[1])};
  };
  auto o64 = testing::run_forward(
      {Tensor::from_vector(ids, Shape{4}), Tensor::from_vector(w, Shape{7, 3})}, build);
  auto o32 = testing::run_forward(
      {Tensor::from_vector(ids, Shape{4}), Tensor::from_vector(wf, Shape{7, 3})}, build);
  std::vector<double> a = o64[0].to_vector<double>();
  std::vector<float> f = o32[0].to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(float(a[i]), f[i]) << "seed " << seed;
}

TEST(OpsEmbedding, OutOfRangeIdNamesIdAndVocab) {
  std::vector<int32_t> ids = {0, 7};
  std::vector<double> w(5 * 2, 0.5);
  try {
    testing::run_forward({Tensor::from_vector(ids, Shape{2}), Tensor::from_vector(w, Shape{5, 2})},
                         [](Builder& b, const std::vector<ValueId>& x) {
                           return std::vector<ValueId>{ops::embedding(b, x[0], x[1])};
                         });
    FAIL() << "expected a value error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kValue) << m;
    EXPECT_NE(m.find("id 7"), std::string::npos) << m;
    EXPECT_NE(m.find("V = 5"), std::string::npos) << m;
  }
}

TEST(OpsEmbedding, NegativeIdIsRejectedInBackward) {
  std::vector<int32_t> ids = {-1};
  std::vector<double> dy = {1, 2};
  try {
    testing::run_forward({Tensor::from_vector(ids, Shape{1}), Tensor::from_vector(dy, Shape{1, 2})},
                         [](Builder& b, const std::vector<ValueId>& x) {
                           return std::vector<ValueId>{ops::embedding_backward(b, x[0], x[1], 3)};
                         });
    FAIL() << "expected a value error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kValue) << m;
    EXPECT_NE(m.find("id -1"), std::string::npos) << m;
    EXPECT_NE(m.find("V = 3"), std::string::npos) << m;
  }
}

TEST(OpsEmbedding, BadShapesAndDtypes) {
  Graph g;
  Builder b(g);
  ValueId fids = b.input("ids", {Shape{4}, DType::kF32});
  ValueId w = b.input("w", {Shape{10, 8}, DType::kF32});
  ValueId w3 = b.input("w3", {Shape{10, 8, 1}, DType::kF32});
  ValueId ids = b.input("ids32", {Shape{4}, DType::kI32});
  try {
    ops::embedding(b, fids, w);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("ids must be int32, found float32"), std::string::npos)
        << e.what();
  }
  try {
    ops::embedding(b, ids, w3);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("weight must be [V, D], found [10, 8, 1]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
