// Load-balancing ops: token counts per expert, and the in-place bias update (sign rule,
// re-centring, coeff 0 = off, the counts handed to the metrics buffer and reset), run through
// the executor on bound persistent tensors as the optimizer graph runs them.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/moe/load_balance.h"

namespace meshtrain {
namespace {

TEST(OpsLoadBalance, TokenCountsPerExpert) {
  std::vector<int32_t> ids = {1, 0, 3, 1, 0, 1, 3, 0, 1, 3};
  auto out = testing::run_forward(
      {Tensor::from_vector(ids, Shape{5, 2})}, [](Builder& b, const std::vector<ValueId>& x) {
        return std::vector<ValueId>{ops::moe_token_counts(b, x[0], 5, DType::kF32)};
      });
  EXPECT_EQ(out[0].to_vector<float>(), (std::vector<float>{3, 4, 0, 3, 0}));
}

struct BiasRun {
  std::vector<double> bias, counts, load;
};

// `summed` (optional): counts summed over data-parallel ranks, given as a separate input.
BiasRun run_update(std::vector<double> bias, std::vector<double> counts, double coeff,
                   std::vector<double> summed = {}) {
  const int64_t e = int64_t(bias.size());
  Graph g;
  Builder b(g, NodePhase::kOptimizer);
  TensorMeta m{Shape{e}, DType::kF64};
  ValueId vb = b.persistent("bias", m, ValueRole::kState);
  ValueId vc = b.persistent("counts", m, ValueRole::kState);
  ValueId vl = b.persistent("load", m, ValueRole::kState);
  ValueId vs = summed.empty() ? kNoValue : b.input("summed", m);
  ops::expert_bias_update(b, vb, vc, vl, coeff, vs);
  auto backend = create_backend("cpu", 0);
  Executor ex(g, plan_memory(g, DeviceType::kCPU), *backend, nullptr);
  Tensor tb = Tensor::from_vector(bias, Shape{e});
  Tensor tc = Tensor::from_vector(counts, Shape{e});
  Tensor tl = Tensor::from_vector(std::vector<double>(size_t(e), -1.0), Shape{e});
  ex.bind(vb, tb);
  ex.bind(vc, tc);
  ex.bind(vl, tl);
  ex.prepare();
  if (vs != kNoValue) ex.tensor(vs).copy_from_host(Tensor::from_vector(summed, Shape{e}));
  ex.run();
  return {tb.to_vector<double>(), tc.to_vector<double>(), tl.to_vector<double>()};
}

TEST(OpsLoadBalance, BiasMovesTowardsUnderloadedExpertsAndStaysCentred) {
  // counts (5, 1, 1, 1): mean 2, sign(mean - c) = (-1, 1, 1, 1), whose mean 0.5 is removed.
  const double c = 1e-3;
  BiasRun r = run_update({0.1, -0.1, 0, 0}, {5, 1, 1, 1}, c);
  std::vector<double> want = {0.1 - 1.5 * c, -0.1 + 0.5 * c, 0.5 * c, 0.5 * c};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(r.bias[i], want[i], 1e-15) << i;
  EXPECT_EQ(r.load, (std::vector<double>{5, 1, 1, 1}));
  EXPECT_EQ(r.counts, (std::vector<double>{0, 0, 0, 0}));
  // An expert exactly at the mean is not moved (sign 0), before re-centring.
  BiasRun m = run_update({0, 0, 0}, {2, 1, 3}, c);
  EXPECT_NEAR(m.bias[0], 0, 1e-18);
  EXPECT_NEAR(m.bias[1], c, 1e-18);
  EXPECT_NEAR(m.bias[2], -c, 1e-18);
}

TEST(OpsLoadBalance, CoeffZeroKeepsTheBiasButStillReportsAndResets) {
  BiasRun r = run_update({0.25, -0.25}, {7, 1}, 0.0);
  EXPECT_EQ(r.bias, (std::vector<double>{0.25, -0.25}));
  EXPECT_EQ(r.load, (std::vector<double>{7, 1}));
  EXPECT_EQ(r.counts, (std::vector<double>{0, 0}));
}

TEST(OpsLoadBalance, SummedCountsDriveTheUpdateAndTheLocalCounterIsReset) {
  const double c = 1e-3;
  BiasRun r = run_update({0, 0}, {9, 0}, c, {1, 3});
  EXPECT_NEAR(r.bias[0], c, 1e-18);
  EXPECT_NEAR(r.bias[1], -c, 1e-18);
  EXPECT_EQ(r.load, (std::vector<double>{1, 3}));
  EXPECT_EQ(r.counts, (std::vector<double>{0, 0}));
}

TEST(OpsLoadBalance, BadInputs) {
  Graph g;
  Builder b(g, NodePhase::kOptimizer);
  ValueId bias = b.persistent("bias", {Shape{4}, DType::kF32}, ValueRole::kState);
  ValueId counts = b.persistent("counts", {Shape{4}, DType::kF64}, ValueRole::kState);
  ValueId load = b.persistent("load", {Shape{4}, DType::kF32}, ValueRole::kState);
  try {
    ops::expert_bias_update(b, bias, counts, load, 1e-3);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("counter must be float32 [4] like the bias"),
              std::string::npos)
        << e.what();
  }
  ValueId counts32 = b.persistent("counts32", {Shape{4}, DType::kF32}, ValueRole::kState);
  try {
    ops::expert_bias_update(b, bias, counts32, load, -1);
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("coeff must be >= 0, found -1"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace meshtrain
