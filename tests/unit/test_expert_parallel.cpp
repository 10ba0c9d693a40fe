// Expert placements and EP configuration errors, on the graph of one rank of a virtual layout;
// and routing that sends every token to one expert (the multi-rank runs are in tests/dist).
#include <gtest/gtest.h>

#include <algorithm>

#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {

const std::vector<std::string> kDs = {"--model.name",   "deepseek_v3", "--model.n_layers", "2",
                                      "--model.flavor", "debugmodel"};

std::unique_ptr<StepGraph> ds_graph(int world, std::vector<std::string> extra, int rank = 0) {
  extra.insert(extra.end(), kDs.begin(), kDs.end());
  JobConfig cfg = testing::tiny_job(extra);
  static std::vector<std::unique_ptr<RankGroups>> keep;
  keep.push_back(std::make_unique<RankGroups>(MeshLayout(parallel_dims_of(cfg, world)), rank));
  return build_step_graph(cfg, keep.back().get(), StepGraphOptions{.tokenizer_vocab = 258});
}

TEST(ExpertParallel, ExpertsShardOnEpThenFsdpAlongDim0WhenTheLocalExpertsDivide) {
  auto sg = ds_graph(4,
                     {"--parallelism.data_parallel_shard_degree", "4",
                      "--parallelism.expert_parallel_degree", "2"},
                     3);
  const ParamInfo& w1 = sg->plan->info("layers.1.moe.experts.w1");  // [8, 256, 256]
  EXPECT_EQ(w1.placement_string(), "ep: Shard(0), efsdp: Shard(0)");
  EXPECT_EQ(w1.local_shape, (Shape{2, 256, 256}));
  EXPECT_EQ(w1.piece.at(0), 4 + 2);  // ep rank 1 owns experts 4..7; efsdp rank 1 the last two
  EXPECT_EQ(w1.shard_groups, (std::vector<MeshGroup>{MeshGroup::kEfsdp, MeshGroup::kEp}));
}

TEST(ExpertParallel, ExpertsShardAlongDim1WhenTheLocalExpertsDoNotDivide) {
  auto sg = ds_graph(6, {"--parallelism.data_parallel_shard_degree", "6",
                         "--parallelism.expert_parallel_degree", "2"});
  const ParamInfo& w2 = sg->plan->info("layers.1.moe.experts.w2");  // 4 local experts, efsdp 3
  EXPECT_EQ(w2.placement_string(), "ep: Shard(0), efsdp: Shard(1)");
  EXPECT_EQ(w2.local_shape, (Shape{4, 86, 256}));  // 256 rows over 3: 86 each, padded
  int transposes = 0;
  for (NodeId id : sg->graph.schedule()) transposes += sg->graph.node(id).op == "transpose01";
  EXPECT_GT(transposes, 0);
}

TEST(ExpertParallel, ExpertTensorParallelShardsHiddenColumnsAndRows) {
  auto sg = ds_graph(
      4, {"--parallelism.data_parallel_shard_degree", "2", "--parallelism.tensor_parallel_degree",
          "2", "--parallelism.expert_parallel_degree", "2",
          "--parallelism.expert_tensor_parallel_degree", "2"});
  EXPECT_EQ(sg->plan->info("layers.1.moe.experts.w1").placement_string(),
            "ep: Shard(0), etp: Shard(1)");
  EXPECT_EQ(sg->plan->info("layers.1.moe.experts.w2").placement_string(),
            "ep: Shard(0), etp: Shard(2)");
}

TEST(ExpertParallel, ExpertsThatDoNotDivideByEpNameTheDegrees) {
  std::string m = testing::error_message<ConfigError>([] {
    ds_graph(3, {"--parallelism.data_parallel_shard_degree", "3",
                 "--parallelism.expert_parallel_degree", "3"});
  });
  EXPECT_CONTAINS(m, "num_experts 8 must divide by expert_parallel_degree 3");
}

TEST(ExpertParallel, EpThatDoesNotDivideTheShardRanksNamesTheDegrees) {
  std::string m = testing::error_message<ConfigError>([] {
    ds_graph(4, {"--parallelism.data_parallel_shard_degree", "4",
                 "--parallelism.expert_parallel_degree", "3"});
  });
  EXPECT_CONTAINS(m, "ep=3 must divide dp_shard=4 × cp=1 × tp=1 = 4");
}

// A zero gate ties every score: the initial expert bias alone picks the expert, the same one for
// every token, and its gaps are far above rounding, so no reduction order can reorder the experts.
TEST(ExpertParallel, ZeroGateTopOneSendsEveryTokenToTheExpertOfHighestBias) {
  std::vector<std::string> o = kDs;
  o.insert(o.end(), {"--model.moe_top_k", "1", "--model.router_zero_init", "true"});
  Trainer t(testing::tiny_job(o), testing::test_runtime());
  std::vector<float> bias =
      t.params().master_to_host("layers.1.moe.expert_bias").to_vector<float>();
  ASSERT_EQ(bias.size(), 8u);
  std::vector<float> sorted = bias;
  std::sort(sorted.begin(), sorted.end());
  for (size_t e = 1; e < sorted.size(); ++e) EXPECT_GT(sorted[e] - sorted[e - 1], 1e-5f);
  const size_t chosen = size_t(std::max_element(bias.begin(), bias.end()) - bias.begin());
  t.step();
  std::vector<float> load =
      t.params().master_to_host("layers.1.moe.tokens_per_expert_last_step").to_vector<float>();
  ASSERT_EQ(load.size(), 8u);
  for (size_t e = 0; e < load.size(); ++e)
    EXPECT_EQ(load[e], e == chosen ? 2.0f * 32 : 0.0f) << "expert " << e;  // batch 2 × seq 32
}

}  // namespace
}  // namespace meshtrain
