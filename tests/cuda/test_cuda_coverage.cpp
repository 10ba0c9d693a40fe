// Coverage follows the registry on the GPU side: every op with a CUDA kernel has a CPU-vs-CUDA
// case declared by a test (MT_CUDA_CASE_TEST, verified while that test runs) or an entry below
// saying where it is checked instead. A new CUDA kernel without either fails
// CudaCoverage.EveryCudaKernelHasACase, by name. The rule itself needs no GPU.
#include <gtest/gtest.h>

#include "common/op_coverage.h"

namespace meshtrain::testing {
namespace {

const char* const kCollective =
    "a collective: one kernel for every backend that calls the group's communicator (NCCL's "
    "collectives: tests/cuda/test_nccl.cpp; the op across ranks: the distributed parity tests)";

const Exemptions kNoCudaCase = {
    {"all_gather", kCollective},
    {"reduce_scatter", kCollective},
    {"all_reduce", kCollective},
    {"ep_counts", kCollective},
    {"ep_to_experts", kCollective},
    {"ep_from_experts", kCollective},
    {"replicate_grad", "a view in forward (the kernel does nothing), an all_reduce in backward"},
    {"expert_bias_update",
     "updates three state buffers in place, which the case harness does not model: "
     "CudaMoeOps.ExpertBiasUpdate checks its launcher against the CPU formula, bit for bit"},
};

TEST(CudaCoverage, EveryCudaKernelHasACase) {
  const std::vector<OpFacts> ops = registered_ops();
  int cuda = 0;
  for (const OpFacts& o : ops) cuda += o.cuda_kernel;
  EXPECT_GT(cuda, 30) << "the CUDA kernels did not register: is this a CUDA build?";
  const std::vector<std::string> gaps =
      cuda_gaps(ops, declared_checks(Check::kCudaVsCpu), kNoCudaCase);
  std::string all;
  for (const std::string& g : gaps) all += "\n  " + g;
  EXPECT_TRUE(gaps.empty()) << gaps.size() << " coverage problem(s):" << all;
}

TEST(CudaCoverage, TheCheckNamesAKernelWithoutACase) {
  std::vector<OpFacts> ops = registered_ops();
  ops.push_back({.name = "planted_cuda_op", .cuda_kernel = true});
  ops.push_back({.name = "planted_cpu_only_op", .cuda_kernel = false});
  const std::vector<std::string> gaps =
      cuda_gaps(ops, declared_checks(Check::kCudaVsCpu), kNoCudaCase);
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_NE(gaps[0].find("op 'planted_cuda_op' has a CUDA kernel but no CPU-vs-CUDA case: add a "
                         "test with MT_CUDA_CASE_TEST"),
            std::string::npos)
      << gaps[0];
}

}  // namespace
}  // namespace meshtrain::testing
