// Node::block: every node of the step and optimizer graphs whose scope lies in a transformer
// block carries that block's index (forward, backward, recomputed and bucketed nodes alike), and
// every other node carries none. The expected index is read from the scope here, in the test only.
#include <gtest/gtest.h>

#include <set>

#include "meshtrain/core/block_name.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/step_graph.h"
#include "test_support.h"

namespace meshtrain {
namespace {

struct Built {
  std::unique_ptr<RankGroups> groups;
  std::unique_ptr<StepGraph> sg;
};

Built build(JobConfig cfg, int world) {
  Built b;
  b.groups = std::make_unique<RankGroups>(MeshLayout(parallel_dims_of(cfg, world)), 0);
  b.sg = build_step_graph(cfg, b.groups.get(), StepGraphOptions{.tokenizer_vocab = 258});
  return b;
}

BlockIndex block_of_scope(const std::string& scope) {
  const std::optional<ParsedBlockName> in = parse_block_name(scope);
  return in ? in->index : kNoBlock;
}

// Checks every node (dead ones too) and returns the phases seen inside each block.
std::set<std::pair<BlockIndex, NodePhase>> expect_blocks_match_scopes(const Graph& g) {
  std::set<std::pair<BlockIndex, NodePhase>> seen;
  for (const Node& n : g.nodes()) {
    EXPECT_EQ(n.block, block_of_scope(n.scope))
        << "node " << n.id << " " << n.op << " (" << node_phase_name(n.phase) << ") at '" << n.scope
        << "'";
    if (n.block != kNoBlock) seen.insert({n.block, n.phase});
  }
  return seen;
}

void expect_every_block_in(const std::set<std::pair<BlockIndex, NodePhase>>& seen, int n_layers,
                           const std::vector<NodePhase>& phases) {
  for (BlockIndex l = 0; l < n_layers; ++l)
    for (NodePhase p : phases)
      EXPECT_TRUE(seen.count({l, p}))
          << "block " << l << " has no " << node_phase_name(p) << " node";
}

TEST(BlockIndex, DeepSeekStepAndOptimizerNodesCarryTheirBlock) {
  JobConfig cfg = parse_job_config(
      std::string(MT_TEST_SOURCE_DIR) + "/configs/deepseek_v3_debug.toml",
      {"--parallelism.data_parallel_shard_degree", "4", "--parallelism.expert_parallel_degree", "2",
       "--activation_checkpoint.mode", "full"});
  Built b = build(cfg, 4);
  const int n_layers = b.sg->model->n_layers();
  ASSERT_GE(n_layers, 2);
  EXPECT_GT(b.sg->checkpoint.nodes_recomputed, 0);
  EXPECT_GT(b.sg->buckets.collectives_after, 0);
  expect_every_block_in(expect_blocks_match_scopes(b.sg->graph), n_layers,
                        {NodePhase::kForward, NodePhase::kBackward, NodePhase::kRecompute});
  // Nodes outside the blocks exist and carry none (the embedding, the head, the loss).
  int outside = 0;
  for (const Node& n : b.sg->graph.nodes()) outside += n.block == kNoBlock;
  EXPECT_GT(outside, 0);

  // The optimizer's load balancing re-enters each MoE layer's block.
  ASSERT_FALSE(b.sg->plan->load_balance_layers().empty());
  OptimizerGraph og;
  build_optimizer_graph(og, layout_param_groups(*b.sg->plan), *b.sg->plan, ops::AdamWParams{},
                        {.layers = b.sg->plan->load_balance_layers()});
  const auto seen = expect_blocks_match_scopes(og.graph);
  for (const LoadBalanceLayer& l : b.sg->plan->load_balance_layers()) {
    EXPECT_EQ(block_name(l.block) + ".moe", l.layer);
    EXPECT_TRUE(seen.count({l.block, NodePhase::kOptimizer})) << l.layer;
  }
}

TEST(BlockIndex, LlamaStepNodesCarryTheirBlockUnderSelectiveAcAndResharding) {
  JobConfig cfg = testing::tiny_job({"--parallelism.data_parallel_shard_degree", "2",
                                     "--activation_checkpoint.mode", "selective",
                                     "--activation_checkpoint.selective_ac_option", "op"});
  Built b = build(cfg, 2);
  EXPECT_GT(b.sg->checkpoint.nodes_recomputed, 0);
  EXPECT_GT(b.sg->reshard.gathers_recomputed, 0);
  expect_every_block_in(expect_blocks_match_scopes(b.sg->graph), b.sg->model->n_layers(),
                        {NodePhase::kForward, NodePhase::kBackward, NodePhase::kRecompute});
}

TEST(BlockIndex, BlockNamesParseBackToTheirIndex) {
  EXPECT_EQ(block_name(3), "layers.3");
  const auto p = parse_block_name("layers.12.attention.wq.weight");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->index, 12);
  EXPECT_EQ(p->suffix, "attention.wq.weight");
  ASSERT_TRUE(parse_block_name("layers.0"));
  EXPECT_EQ(parse_block_name("layers.0")->suffix, "");
  for (const char* outside : {"tok_embeddings.weight", "layers", "layers.", "layers.x.w",
                              "layers.01.w", "layers.-1.w", "layers.3.", "model.layers.3.w"})
    EXPECT_FALSE(parse_block_name(outside)) << outside;
}

}  // namespace
}  // namespace meshtrain
