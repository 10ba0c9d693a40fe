// grouped_matmul: per-expert products against naive loops (both weight layouts) on buffers whose
// unused rows are NaN, zero weight gradients for experts with no rows, float64 gradchecks
// (including an expert with zero tokens), the routed-expert chain router -> permute -> SwiGLU
// experts -> combine as one gradcheck, and the errors a user can hit.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "meshtrain/moe/combine.h"
#include "meshtrain/moe/dispatch.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/moe/router.h"
#include "meshtrain/ops/swiglu.h"
#include "test_support.h"

namespace meshtrain {
namespace {
using testing::expect_error;
using testing::expect_grad_ok;
using testing::gradcheck;
using testing::InputSpec;

// 4 experts over a 12-row buffer: rows 0..2, 4..7, none (expert 2), 8..10; rows 3 and 11 unused.
constexpr int64_t kE = 4, kRows = 12;
const std::vector<double> kGroups = {0, 4, 8, 8, 3, 4, 0, 3};
bool used(int64_t r) { return r != 3 && r != 11; }
int expert_of(int64_t r) { return r < 3 ? 0 : r < 8 ? 1 : 3; }

InputSpec groups_spec() {
  return {.shape = Shape{2, kE}, .dtype = DType::kI32, .differentiable = false, .values = kGroups};
}

std::vector<double> poisoned(int64_t d, std::mt19937_64& rng) {
  std::vector<double> v(static_cast<size_t>(kRows * d), NAN);
  for (int64_t r = 0; r < kRows; ++r)
    if (used(r))
      for (int64_t c = 0; c < d; ++c)
        v[size_t(r * d + c)] = std::uniform_real_distribution<double>(-1, 1)(rng);
  return v;
}

std::vector<double> random(int64_t n, std::mt19937_64& rng) {
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = std::uniform_real_distribution<double>(-1, 1)(rng);
  return v;
}

TEST(OpsGroupedMatmul, MatchesNaiveLoopsAndSkipsUnusedRows) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t k = 5, n = 3;
  std::vector<double> x = poisoned(k, rng);
  std::vector<double> w = random(kE * n * k, rng);  // [E, N, K], also read as [E, K, N]
  std::vector<int32_t> groups(kGroups.begin(), kGroups.end());
  for (bool tw : {true, false}) {
    SCOPED_TRACE(tw ? "transposed" : "untransposed");
    const int64_t kk = tw ? k : n, nn = tw ? n : k;  // untransposed: x is [C, N] · w [E, N, K]
    std::vector<double> xin = tw ? x : poisoned(kk, rng);
    auto out = testing::run_forward(
        {Tensor::from_vector(xin, Shape{kRows, kk}),
         Tensor::from_vector(w, tw ? Shape{kE, n, k} : Shape{kE, kk, nn}),
         Tensor::from_vector(groups, Shape{2, kE})},
        [&](Builder& b, const std::vector<ValueId>& in) {
          return std::vector<ValueId>{ops::grouped_matmul(b, in[0], in[1], in[2], tw)};
        });
    std::vector<double> y = out[0].to_vector<double>();
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t c = 0; c < nn; ++c) {
        double want = 0;
        if (used(r)) {
          const double* we = w.data() + expert_of(r) * n * k;
          for (int64_t i = 0; i < kk; ++i)
            want += xin[size_t(r * kk + i)] * (tw ? we[c * k + i] : we[i * nn + c]);
        }
        EXPECT_NEAR(y[size_t(r * nn + c)], want, 1e-14) << "row " << r << " seed " << seed;
      }
  }
}

TEST(OpsGroupedMatmul, WeightGradientIsZeroForAnExpertWithNoRows) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  std::vector<int32_t> groups(kGroups.begin(), kGroups.end());
  auto out = testing::run_forward(
      {Tensor::from_vector(poisoned(3, rng), Shape{kRows, 3}),
       Tensor::from_vector(poisoned(2, rng), Shape{kRows, 2}),
       Tensor::from_vector(groups, Shape{2, kE})},
      [](Builder& b, const std::vector<ValueId>& in) {
        return std::vector<ValueId>{ops::grouped_matmul_wgrad(b, in[0], in[1], in[2])};
      });
  ASSERT_EQ(out[0].shape(), (Shape{kE, 3, 2}));
  std::vector<double> dw = out[0].to_vector<double>();
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(dw[size_t(2 * 6 + i)], 0.0);
  for (double v : dw) EXPECT_TRUE(std::isfinite(v)) << "seed " << seed;
}

MT_GRADCHECK_TEST(OpsGroupedMatmul, GradCheckBothLayoutsWithAnEmptyExpert, "grouped_matmul") {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  for (bool tw : {true, false}) {
    SCOPED_TRACE(tw ? "transposed" : "untransposed");
    const int64_t k = 4, n = 3;
    InputSpec x{.shape = Shape{kRows, k}, .values = poisoned(k, rng)};
    InputSpec w{.shape = tw ? Shape{kE, n, k} : Shape{kE, k, n}};
    expect_grad_ok(gradcheck({x, w, groups_spec()},
                             [&](Builder& b, const std::vector<ValueId>& in) {
                               return std::vector<ValueId>{
                                   ops::grouped_matmul(b, in[0], in[1], in[2], tw)};
                             },
                             {.seed = seed}));
  }
}

// The routed-expert path of a MoE layer end to end (score_before_experts off and on): logits ->
// router -> plan -> permute -> w1/w3 grouped GEMMs -> SwiGLU -> w2 -> combine. Logits are
// well separated so no finite-difference step changes the routing.
TEST(OpsGroupedMatmul, GradCheckRoutedExpertChain) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t t = 6, d = 4, h = 3, e = 4;
  std::vector<double> logits;
  for (int64_t i = 0; i < t; ++i) {
    std::vector<double> row = {-0.3, -0.1, 0.1, 0.3};
    std::shuffle(row.begin(), row.end(), rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  for (bool before : {false, true}) {
    SCOPED_TRACE(before ? "score_before_experts" : "score after experts");
    InputSpec bias{.shape = Shape{e}, .differentiable = false, .values = {0.02, 0, -0.01, 0}};
    expect_grad_ok(
        gradcheck({{Shape{t, d}},
                   {.shape = Shape{t, e}, .values = logits},
                   bias,
                   {Shape{e, h, d}},
                   {Shape{e, h, d}},
                   {Shape{e, d, h}}},
                  [&](Builder& b, const std::vector<ValueId>& in) {
                    ops::RouterOutputs r =
                        ops::router(b, in[1], in[2], {.score_func = "softmax", .top_k = 2});
                    ops::DispatchPlan p = ops::moe_dispatch_plan(b, r.ids, e, 4);
                    ValueId xp = ops::moe_permute(b, in[0], p, before ? r.weights : kNoValue);
                    ValueId g = ops::grouped_matmul(b, xp, in[3], p.groups);
                    ValueId u = ops::grouped_matmul(b, xp, in[4], p.groups);
                    ValueId y = ops::grouped_matmul(b, ops::swiglu(b, g, u), in[5], p.groups);
                    return std::vector<ValueId>{
                        ops::moe_combine(b, y, p.row_map, before ? kNoValue : r.weights)};
                  },
                  {.seed = seed}));
  }
}

TEST(OpsGroupedMatmul, BadInputs) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{12, 5}, DType::kF32});
  ValueId w = b.input("w", {Shape{4, 3, 6}, DType::kF32});
  ValueId groups = b.input("groups", {Shape{2, 4}, DType::kI32});
  ValueId groups3 = b.input("groups3", {Shape{2, 3}, DType::kI32});
  ValueId w_ok = b.input("w_ok", {Shape{4, 3, 5}, DType::kF32});
  expect_error(
      ErrorKind::kShape, [&] { ops::grouped_matmul(b, x, w, groups); },
      "x [12, 5] has K = 5, w [4, 3, 6] (used transposed) has K = 6");
  expect_error(
      ErrorKind::kShape, [&] { ops::grouped_matmul(b, x, w_ok, groups3); },
      "groups must be int32 [2, 4]");
  // Group sizes are data: a group running past the buffer is caught by the kernel.
  std::vector<int32_t> bad = {0, 4, 8, 10, 3, 4, 0, 3};
  expect_error(
      ErrorKind::kValue,
      [&] {
        testing::run_forward(
            {Tensor::from_vector(std::vector<double>(12 * 2, 1.0), Shape{12, 2}),
             Tensor::from_vector(std::vector<double>(4 * 2 * 2, 1.0), Shape{4, 2, 2}),
             Tensor::from_vector(bad, Shape{2, 4})},
            [](Builder& bb, const std::vector<ValueId>& in) {
              return std::vector<ValueId>{ops::grouped_matmul(bb, in[0], in[1], in[2])};
            });
      },
      "expert 3 group [10, 13) is not inside the buffer's 12 rows");
}

}  // namespace
}  // namespace meshtrain
