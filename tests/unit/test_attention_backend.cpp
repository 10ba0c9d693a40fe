// [model] attention_backend reaches every attention node of the step graph, forward and backward
// (the CUDA kernels read it at prepare; tests/cuda checks what each choice runs), and a value it
// does not know is refused naming the key and the choices.
#include <gtest/gtest.h>

#include "meshtrain/ops/attention.h"
#include "meshtrain/train/step_graph.h"
#include "test_support.h"

namespace meshtrain {
namespace {

std::vector<ops::AttentionKernel> kernels_of(const std::vector<std::string>& overrides) {
  JobConfig cfg = testing::tiny_job(overrides);
  auto sg = build_step_graph(cfg, nullptr, StepGraphOptions{.tokenizer_vocab = 258});
  std::vector<ops::AttentionKernel> seen;
  for (NodeId id : sg->graph.schedule()) {
    const Node& n = sg->graph.node(id);
    if (n.op == "attention" || n.op == "attention_backward")
      seen.push_back(ops::attention_kernel_of(n.attrs));
  }
  return seen;
}

TEST(AttentionBackend, EveryAttentionNodeCarriesTheConfiguredKernels) {
  for (const char* model : {"llama3", "deepseek_v3"}) {
    const std::vector<std::string> base = {"--model.name", model, "--model.flavor", "debugmodel"};
    const std::vector<ops::AttentionKernel> by_default = kernels_of(base);
    ASSERT_FALSE(by_default.empty()) << model;
    for (ops::AttentionKernel k : by_default) EXPECT_EQ(k, ops::AttentionKernel::kAuto) << model;
    for (ops::AttentionKernel want :
         {ops::AttentionKernel::kCudnn, ops::AttentionKernel::kMeshtrain}) {
      std::vector<std::string> o = base;
      o.insert(o.end(), {"--model.attention_backend", ops::attention_kernel_name(want)});
      const std::vector<ops::AttentionKernel> seen = kernels_of(o);
      EXPECT_EQ(seen.size(), by_default.size()) << model;  // forward and backward nodes alike
      for (ops::AttentionKernel k : seen) EXPECT_EQ(k, want) << model;
    }
  }
}

TEST(AttentionBackend, UnknownValueNamesTheKeyAndTheChoices) {
  const std::string msg = testing::error_message<ConfigError>([] {
    testing::tiny_job({"--model.attention_backend", "flash3"});
  });
  EXPECT_NE(msg.find("model.attention_backend"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudnn"), std::string::npos) << msg;
  EXPECT_NE(msg.find("meshtrain"), std::string::npos) << msg;
}

}  // namespace
}  // namespace meshtrain
