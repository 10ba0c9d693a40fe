// Coverage follows the registry: every registered op has a float64 gradient check declared by a
// test (MT_GRADCHECK_TEST, verified while that test runs) or an entry below saying why it needs
// none here. A new op without either fails RegisteredOps.EveryOpHasAGradcheckOrAReason, by name.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "common/op_coverage.h"
#include "test_support.h"

namespace meshtrain::testing {
namespace {

const char* const kDistParity =
    "a collective: its gradient needs ranks, and the distributed parity tests compare every "
    "layout's gradients with the 1-rank run (tests/dist, dist_parity_*)";

// Ops that need no float64 gradcheck here, and why. Non-differentiable ops (no backward rule)
// must be listed too, so that a forward op that lost or never had its backward rule is noticed.
const Exemptions kNoGradcheck = {
    // Differentiable, checked across ranks.
    {"all_gather", kDistParity},
    {"reduce_scatter", kDistParity},
    {"all_reduce", kDistParity},
    {"ep_to_experts", kDistParity},
    {"ep_from_experts", kDistParity},
    {"replicate_grad",
     "identity forward, all_reduce over its group in backward: the HSDP and TP parity layouts "
     "check it (tests/dist, dist_parity_hsdp*, dist_parity_*tp*)"},
    // Backward kernels: their values are the gradients their forward op's gradcheck checks.
    {"attention_backward", "attention's backward kernel (OpsAttention.GradCheck)"},
    {"cross_entropy_backward", "cross_entropy's backward kernel"},
    {"scale_by",
     "linear_cross_entropy's backward (its gradients times dloss): "
     "OpsLinearCrossEntropy.GradCheckHAndW differentiates through it"},
    {"embedding_backward", "embedding's backward kernel"},
    {"grouped_matmul_wgrad", "grouped_matmul's weight-gradient kernel"},
    {"moe_row_dot", "moe_combine's score-gradient kernel"},
    {"rmsnorm_backward", "rmsnorm's backward kernel"},
    {"router_backward", "router's backward kernel"},
    {"slice_backward", "slice's backward kernel (also concat's, by fuse_slice_grads)"},
    {"swiglu_backward", "swiglu's backward kernel"},
    // No gradient flows through them.
    {"fill", "a constant"},
    {"rope_table", "the rotation table: a function of positions and the config only"},
    {"moe_dispatch_plan", "integer routing plan from expert ids"},
    {"moe_token_counts", "counts of routed tokens (load-balancing state)"},
    {"ep_counts", "integer row counts exchanged between expert-parallel ranks"},
    {"sum_squares", "the optimizer graph's squared gradient norm"},
    {"accumulate", "a sink: adds into a persistent buffer in place (tests/unit/test_optim.cpp)"},
    {"matmul_accumulate",
     "a sink: matmul's product added into a gradient buffer in place; its value is matmul's "
     "(gradchecked), test_fuse_grad_matmul.cpp checks the kernel"},
    {"grouped_matmul_wgrad_accumulate",
     "a sink: grouped_matmul_wgrad's product added into a gradient buffer in place; "
     "test_grouped_wgrad_accumulate.cpp checks the kernel"},
    {"scale_by_accumulate",
     "a sink: scale_by added into a gradient buffer in place (fuse_grad_matmul); "
     "test_ops_linear_cross_entropy.cpp checks the rewrite, tests/cuda the kernel"},
    {"adamw_update", "the optimizer update, in place (tests/unit/test_optim.cpp)"},
    {"cast_into", "writes a master's compute copy in place (tests/unit/test_compute_copies.cpp)"},
    {"expert_bias_update", "the load-balancing bias update, in place (test_ops_load_balance.cpp)"},
};

TEST(RegisteredOps, EveryOpHasAGradcheckOrAReason) {
  const std::vector<std::string> gaps =
      gradcheck_gaps(registered_ops(), declared_checks(Check::kGradcheck), kNoGradcheck);
  std::string all;
  for (const std::string& g : gaps) all += "\n  " + g;
  EXPECT_TRUE(gaps.empty()) << gaps.size() << " coverage problem(s):" << all;
}

TEST(RegisteredOps, TheRegistryIsWalked) {
  // The rule is only as good as the list it walks: the ops this binary links must all be there.
  std::vector<std::string> names;
  for (const OpFacts& o : registered_ops()) names.push_back(o.name);
  for (const char* op : {"matmul", "attention", "router", "grouped_matmul", "all_gather"})
    EXPECT_NE(std::find(names.begin(), names.end(), op), names.end()) << op;
}

// The check names a planted op that has a backward rule and no gradcheck, a planted op without a
// backward rule that no one declared non-differentiable, and stale entries.
TEST(RegisteredOps, TheCheckNamesAnOpWithoutAGradcheck) {
  std::vector<OpFacts> ops = registered_ops();
  const auto checks = declared_checks(Check::kGradcheck);
  ASSERT_TRUE(gradcheck_gaps(ops, checks, kNoGradcheck).empty());
  ops.push_back({.name = "planted_differentiable_op", .differentiable = true});
  ops.push_back({.name = "planted_forward_op", .differentiable = false});
  std::vector<std::string> gaps = gradcheck_gaps(ops, checks, kNoGradcheck);
  ASSERT_EQ(gaps.size(), 2u);
  EXPECT_CONTAINS(gaps[0],
                  "op 'planted_differentiable_op' has a backward rule but no float64 "
                  "gradcheck: add a test with MT_GRADCHECK_TEST");
  EXPECT_CONTAINS(gaps[1],
                  "op 'planted_forward_op' has no backward rule and is not declared "
                  "non-differentiable");

  Exemptions stale = kNoGradcheck;
  stale["no_such_op"] = "left behind";
  stale["matmul"] = "also checked";
  auto with_typo = checks;
  with_typo["matmull"].push_back("Suite.Typo");
  gaps = gradcheck_gaps(registered_ops(), with_typo, stale);
  ASSERT_EQ(gaps.size(), 3u);
  EXPECT_CONTAINS(gaps[0],
                  "Suite.Typo declares a float64 gradcheck of op 'matmull', but no such "
                  "op is registered");
  EXPECT_CONTAINS(gaps[1],
                  "op 'matmul' has a float64 gradcheck (GradCheck.MatmulAllTransposes) "
                  "and an exemption");
  EXPECT_CONTAINS(gaps[2],
                  "op 'no_such_op' is exempted (left behind) but no such op is "
                  "registered");
}

// A declaration is verified by the test that makes it: here the planted test declares "mul" but
// its check only differentiates through "add", so the scope reports "mul".
TEST(RegisteredOps, ADeclaringTestFailsWhenItsChecksMissAnOp) {
  declare_checks(Check::kGradcheck, "Planted.Test", __FILE__, {"add", "mul"});
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    CoverageScope scope(Check::kGradcheck, "Planted.Test");
    note_checked(Check::kGradcheck, {"add", "reshape"});
  }
  forget_checks(Check::kGradcheck, "Planted.Test");
  ASSERT_EQ(failures.size(), 1);
  EXPECT_CONTAINS(std::string(failures.GetTestPartResult(0).message()),
                  "Planted.Test (" __FILE__
                  ") declares that its float64 gradchecks cover mul, "
                  "but none of its checks ran it (ops it did run: add, reshape)");
}

}  // namespace
}  // namespace meshtrain::testing
