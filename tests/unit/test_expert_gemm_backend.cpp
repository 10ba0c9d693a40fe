// [model] expert_gemm_backend: the key parses (default auto), a value it does not know is refused
// naming the key and the choices, and the choice reaches every grouped GEMM of the DeepSeek step
// graph: the forward's, the backward's dx and wgrad that autodiff emits, the MTP module's, and the
// accumulating sinks fuse_grad_matmul makes of the wgrads under bf16 (the CUDA kernels read it at
// prepare).
#include <gtest/gtest.h>

#include "meshtrain/core/config.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/train/step_graph.h"
#include "step_graph_fixtures.h"
#include "test_support.h"

namespace meshtrain {
namespace {

constexpr ops::ExpertGemmKernel kAllKernels[] = {ops::ExpertGemmKernel::kAuto,
                                                 ops::ExpertGemmKernel::kCublas,
                                                 ops::ExpertGemmKernel::kMeshtrain};

TEST(ExpertGemmBackend, DefaultsToAutoAndParsesEveryChoice) {
  EXPECT_EQ(JobConfig{}.model.expert_gemm_backend, ops::ExpertGemmKernel::kAuto);
  EXPECT_EQ(testing::tiny_job().model.expert_gemm_backend, ops::ExpertGemmKernel::kAuto);
  for (ops::ExpertGemmKernel k : kAllKernels) {
    const char* name = ops::expert_gemm_kernel_name(k);
    EXPECT_EQ(testing::tiny_job({"--model.expert_gemm_backend", name}).model.expert_gemm_backend, k)
        << name;
  }
  // From a TOML file as from the command line.
  const ConfigValues v = load_config_string(
      job_config_schema(), "[model]\nexpert_gemm_backend = \"cublas\"\n", "test.toml", {});
  EXPECT_EQ(job_config_from_values(v).model.expert_gemm_backend, ops::ExpertGemmKernel::kCublas);
  EXPECT_STREQ(ops::expert_gemm_kernel_name(ops::ExpertGemmKernel::kCublas), "cublas");
  // A node without the attribute (built by hand, or before it existed) runs auto.
  EXPECT_EQ(ops::expert_gemm_kernel_of(Attrs{}), ops::ExpertGemmKernel::kAuto);
}

TEST(ExpertGemmBackend, UnknownValueNamesTheKeyAndTheChoices) {
  const std::string msg = testing::error_message<ConfigError>([] {
    testing::tiny_job({"--model.expert_gemm_backend", "cutlass"});
  });
  EXPECT_CONTAINS(msg,
                  "[model] expert_gemm_backend must be one of auto, cublas, meshtrain, found "
                  "\"cutlass\" (from --model.expert_gemm_backend)");
}

bool is_grouped_gemm(const Node& n) {
  return n.op == "grouped_matmul" || n.op == "grouped_matmul_wgrad" ||
         n.op == ops::kGroupedWgradAccumulateOp;
}

// Live grouped GEMM nodes of a step graph by op and phase; each must carry `want` as its "kernel"
// attribute (a dropped attribute would read as auto).
struct Seen {
  int forward = 0, dx = 0, wgrad = 0, fused = 0;
};
Seen expect_kernels(const Graph& g, ops::ExpertGemmKernel want, const std::string& what) {
  Seen s;
  for (const Node& n : g.nodes()) {
    if (n.dead || !is_grouped_gemm(n)) continue;
    EXPECT_TRUE(n.attrs.has("kernel")) << what << ": " << n.op << " at " << n.scope;
    EXPECT_EQ(ops::expert_gemm_kernel_of(n.attrs), want)
        << what << ": " << n.op << " at " << n.scope;
    if (n.op == ops::kGroupedWgradAccumulateOp)
      ++s.fused;
    else if (n.op == "grouped_matmul_wgrad")
      ++s.wgrad;
    else if (n.phase == NodePhase::kBackward)
      ++s.dx;
    else
      ++s.forward;
  }
  return s;
}

TEST(ExpertGemmBackend, EveryGroupedGemmNodeOfTheDeepSeekStepGraphCarriesTheConfiguredKernel) {
  for (ops::ExpertGemmKernel k : kAllKernels) {
    const std::vector<std::string> o = {"--model.expert_gemm_backend",
                                        ops::expert_gemm_kernel_name(k), "--model.mtp_layers", "1"};
    // float32: autodiff's dx and wgrad nodes stay as they are (same-dtype sinks are not fused).
    {
      const auto built = step_graph_of("deepseek_v3_debug.toml", o);
      const StepGraph& sg = *built->sg;
      const int moe_blocks = sg.model->num_blocks() - 1;  // the debug flavor's first is dense
      ASSERT_GT(moe_blocks, sg.model->n_layers() - 1);    // the MTP module's block is MoE too
      const Seen s = expect_kernels(sg.graph, k, fmt::format("float32, {}", o[1]));
      EXPECT_EQ(s.forward, 3 * moe_blocks);
      EXPECT_EQ(s.dx, 3 * moe_blocks);
      EXPECT_EQ(s.wgrad, 3 * moe_blocks);
      EXPECT_EQ(s.fused, 0);
    }
    // bf16 over float32 masters: every wgrad is folded into its float32 gradient sink.
    {
      const auto built = bf16_step_graph("deepseek_v3_debug.toml", o);
      const StepGraph& sg = *built->sg;
      const int moe_blocks = sg.model->num_blocks() - 1;
      const Seen s = expect_kernels(sg.graph, k, fmt::format("bf16, {}", o[1]));
      EXPECT_EQ(s.forward, 3 * moe_blocks);
      EXPECT_EQ(s.dx, 3 * moe_blocks);
      EXPECT_EQ(s.wgrad, 0);
      EXPECT_EQ(s.fused, 3 * moe_blocks);
    }
  }
}

}  // namespace
}  // namespace meshtrain
