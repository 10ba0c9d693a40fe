// Token permutation and combine: the dispatch plan's layout (padding, an expert with no tokens,
// token order inside a group), permute/combine as exact inverses, float64 gradchecks of the
// permutation, its inverse and the weighted combine with NaN-poisoned padding rows (which must
// never be read), and the errors a user can hit.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"
#include "meshtrain/moe/combine.h"
#include "meshtrain/moe/dispatch.h"
#include "test_support.h"

namespace meshtrain {
namespace {
using testing::expect_error;
using testing::expect_grad_ok;
using testing::gradcheck;
using testing::InputSpec;

// T = 5 tokens, k = 2, E = 4 experts; expert 2 receives nothing; alignment 4.
const std::vector<double> kIds = {1, 0, 3, 1, 0, 1, 3, 0, 1, 3};
constexpr int64_t kT = 5, kK = 2, kE = 4, kAlign = 4;
// Choices (token, j) in token order. Expert 0: (0,1) (2,0) (3,1) -> rows 0..2, pad 3; expert 1:
// (0,0) (1,1) (2,1) (4,0) -> rows 4..7; expert 2: empty at row 8; expert 3: (1,0) (3,0) (4,1) ->
// rows 8..10, pad 11; rows 12..23 are slack.
const std::vector<int32_t> kRowMap = {4, 0, 8, 5, 1, 6, 9, 2, 7, 10};
const std::vector<int32_t> kGroups = {0, 4, 8, 8, 3, 4, 0, 3};
const std::vector<int64_t> kUsedRows = {0, 1, 2, 4, 5, 6, 7, 8, 9, 10};

InputSpec ids_spec() {
  return {.shape = Shape{kT, kK}, .dtype = DType::kI32, .differentiable = false, .values = kIds};
}

// A [capacity, D] buffer whose rows outside every group are NaN.
InputSpec poisoned_rows(int64_t capacity, int64_t d, std::mt19937_64& rng) {
  std::vector<double> v(static_cast<size_t>(capacity * d), NAN);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t r : kUsedRows)
    for (int64_t c = 0; c < d; ++c) v[size_t(r * d + c)] = u(rng);
  return {.shape = Shape{capacity, d}, .values = v};
}

TEST(OpsMoePermute, CapacityCoversTheWorstCasePadding) {
  EXPECT_EQ(ops::moe_capacity(10, 4, 4), 24);  // 10 + 4·3 = 22, rounded up to 24
  EXPECT_EQ(ops::moe_capacity(10, 4, 1), 10);
  EXPECT_EQ(ops::moe_capacity(0, 3, 8), 24);
}

TEST(OpsMoePermute, PlanPadsGroupsKeepsTokenOrderAndHandlesAnEmptyExpert) {
  std::vector<int32_t> ids(kIds.begin(), kIds.end());
  auto out = testing::run_forward(
      {Tensor::from_vector(ids, Shape{kT, kK})}, [](Builder& b, const std::vector<ValueId>& x) {
        ops::DispatchPlan p = ops::moe_dispatch_plan(b, x[0], kE, kAlign);
        return std::vector<ValueId>{p.row_map, p.groups};
      });
  EXPECT_EQ(out[0].to_vector<int32_t>(), kRowMap);
  EXPECT_EQ(out[1].to_vector<int32_t>(), kGroups);
}

TEST(OpsMoePermute, CombineInvertsPermute) {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t d = 3;
  std::vector<double> x(static_cast<size_t>(kT * d)), w(static_cast<size_t>(kT * kK));
  for (double& v : x) v = std::uniform_real_distribution<double>(-1, 1)(rng);
  for (double& v : w) v = std::uniform_real_distribution<double>(0, 1)(rng);
  std::vector<int32_t> ids(kIds.begin(), kIds.end());
  auto out = testing::run_forward(
      {Tensor::from_vector(x, Shape{kT, d}), Tensor::from_vector(ids, Shape{kT, kK}),
       Tensor::from_vector(w, Shape{kT, kK})},
      [](Builder& b, const std::vector<ValueId>& in) {
        ops::DispatchPlan p = ops::moe_dispatch_plan(b, in[1], kE, kAlign);
        ValueId xp = ops::moe_permute(b, in[0], p);
        return std::vector<ValueId>{
            xp, ops::moe_combine(b, xp, p.row_map), ops::moe_combine(b, xp, p.row_map, in[2]),
            ops::moe_combine(b, ops::moe_permute(b, in[0], p, in[2]), p.row_map)};
      });
  std::vector<double> xp = out[0].to_vector<double>(), sum = out[1].to_vector<double>(),
                      weighted = out[2].to_vector<double>(), before = out[3].to_vector<double>();
  ASSERT_EQ(out[0].shape(), (Shape{ops::moe_capacity(kT * kK, kE, kAlign), d}));
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t j = 0; j < kK; ++j)
      for (int64_t c = 0; c < d; ++c)
        EXPECT_EQ(xp[size_t(kRowMap[size_t(t * kK + j)] * d + c)], x[size_t(t * d + c)]);
  for (int64_t r : {3, 11, 12, 23})  // padding and slack rows are zero
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(xp[size_t(r * d + c)], 0.0) << "row " << r;
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t c = 0; c < d; ++c) {
      const double xv = x[size_t(t * d + c)];
      const double ws = w[size_t(t * kK)] + w[size_t(t * kK + 1)];
      EXPECT_EQ(sum[size_t(t * d + c)], 2 * xv);
      EXPECT_NEAR(weighted[size_t(t * d + c)], ws * xv, 1e-15) << "seed " << seed;
      // score_before_experts: weights applied on the way in, then a plain sum.
      EXPECT_NEAR(before[size_t(t * d + c)], ws * xv, 1e-15) << "seed " << seed;
    }
}

MT_GRADCHECK_TEST(OpsMoePermute, GradCheckPermutationAndScoreBefore, "moe_permute") {
  const int64_t d = 3;
  expect_grad_ok(
      gradcheck({{Shape{kT, d}}, ids_spec()}, [](Builder& b, const std::vector<ValueId>& x) {
        ops::DispatchPlan p = ops::moe_dispatch_plan(b, x[1], kE, kAlign);
        return std::vector<ValueId>{ops::moe_permute(b, x[0], p)};
      }));
  expect_grad_ok(gradcheck({{Shape{kT, d}}, ids_spec(), {Shape{kT, kK}}},
                           [](Builder& b, const std::vector<ValueId>& x) {
                             ops::DispatchPlan p = ops::moe_dispatch_plan(b, x[1], kE, kAlign);
                             return std::vector<ValueId>{ops::moe_permute(b, x[0], p, x[2])};
                           }));
}

MT_GRADCHECK_TEST(OpsMoePermute, GradCheckCombineNeverReadsPaddingRows, "moe_combine") {
  uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t d = 3, cap = ops::moe_capacity(kT * kK, kE, kAlign);
  // Inverse permutation (plain sum) and the weighted combine, both on poisoned buffers: one NaN
  // read anywhere makes the loss NaN and the check fail.
  expect_grad_ok(gradcheck({poisoned_rows(cap, d, rng), ids_spec()},
                           [](Builder& b, const std::vector<ValueId>& x) {
                             ops::DispatchPlan p = ops::moe_dispatch_plan(b, x[1], kE, kAlign);
                             return std::vector<ValueId>{ops::moe_combine(b, x[0], p.row_map)};
                           },
                           {.seed = seed}));
  expect_grad_ok(gradcheck({poisoned_rows(cap, d, rng), ids_spec(), {Shape{kT, kK}}},
                           [](Builder& b, const std::vector<ValueId>& x) {
                             ops::DispatchPlan p = ops::moe_dispatch_plan(b, x[1], kE, kAlign);
                             return std::vector<ValueId>{
                                 ops::moe_combine(b, x[0], p.row_map, x[2])};
                           },
                           {.seed = seed}));
}

TEST(OpsMoePermute, BadInputs) {
  Graph g;
  Builder b(g);
  ValueId ids = b.input("ids", {Shape{5, 2}, DType::kI32});
  ValueId ids64 = b.input("ids64", {Shape{5, 2}, DType::kI64});
  ValueId x = b.input("x", {Shape{5, 3}, DType::kF32});
  ValueId x6 = b.input("x6", {Shape{6, 3}, DType::kF32});
  ValueId w64 = b.input("w64", {Shape{5, 2}, DType::kF64});
  expect_error(
      ErrorKind::kShape, [&] { ops::moe_dispatch_plan(b, ids64, 4, 1); },
      "ids must be int32 [T, k], found int64");
  ops::DispatchPlan p = ops::moe_dispatch_plan(b, ids, 4, 2);
  expect_error(
      ErrorKind::kShape, [&] { ops::moe_permute(b, x6, p); },
      "row_map [5, 2] must have one row per token of x [6, 3]");
  expect_error(
      ErrorKind::kShape, [&] { ops::moe_permute(b, x, p, w64); },
      "weights must be float32 like the rows");
  expect_error(
      ErrorKind::kShape, [&] { ops::moe_permute(b, x, p.row_map, 9); },
      "capacity 9 is below the 10 routed rows");
  ValueId short_y = b.input("short_y", {Shape{8, 3}, DType::kF32});
  expect_error(
      ErrorKind::kShape, [&] { ops::moe_combine(b, short_y, p.row_map); },
      "y has 8 rows, fewer than the 10 routed rows");
  // Out-of-range expert ids are data: the kernel names the choice.
  std::vector<int32_t> bad = {0, 1, 4, 2};
  expect_error(
      ErrorKind::kValue,
      [&] {
        testing::run_forward(
            {Tensor::from_vector(bad, Shape{2, 2})},
            [](Builder& bb, const std::vector<ValueId>& in) {
              return std::vector<ValueId>{ops::moe_dispatch_plan(bb, in[0], 4, 1).row_map};
            });
      },
      "expert id 4 at choice 2 is outside [0, 4)");
}

}  // namespace
}  // namespace meshtrain
