// SimpleFSDP as placements, checked on the graph of one rank of a virtual 2- or 3-rank layout:
// every parameter is gathered where used and its gradient reduce-scattered (derived by autodiff),
// uneven shapes are padded, and reshard_after_forward lowers the planned peak by the gathered
// weights it no longer holds.
#include <gtest/gtest.h>

#include "meshtrain/core/block_name.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/step_graph.h"
#include "test_support.h"

namespace meshtrain {
namespace {

std::unique_ptr<StepGraph> graph_for(int world, const std::vector<std::string>& extra,
                                     int rank = 0) {
  // One collective per parameter (no bucketing): these tests check the placements' collectives;
  // tests/unit/test_bucket_collectives.cpp checks what the scheduling passes make of them.
  std::vector<std::string> o = {"--parallelism.data_parallel_shard_degree", std::to_string(world),
                                "--compile.graph_passes", "none"};
  o.insert(o.end(), extra.begin(), extra.end());
  JobConfig cfg = testing::tiny_job(o);
  ParallelDims dims;
  dims.dp_shard = world;
  dims.world = world;
  static std::vector<std::unique_ptr<RankGroups>> keep;  // the plan keeps a pointer
  keep.push_back(std::make_unique<RankGroups>(MeshLayout(dims), rank));
  return build_step_graph(cfg, keep.back().get(), StepGraphOptions{.tokenizer_vocab = 258});
}

int count_ops(const Graph& g, const std::string& op, NodePhase phase) {
  int n = 0;
  for (NodeId id : g.schedule())
    if (g.node(id).op == op && g.node(id).phase == phase) ++n;
  return n;
}

TEST(Fsdp, EveryParameterGatheredAndItsGradientReduceScattered) {
  auto sg = graph_for(2, {"--parallelism.fsdp_reshard_after_forward", "never"});
  const int params = int(sg->plan->params().size());
  EXPECT_EQ(count_ops(sg->graph, "all_gather", NodePhase::kForward), params);
  EXPECT_EQ(count_ops(sg->graph, "reduce_scatter", NodePhase::kBackward), params);
  EXPECT_EQ(count_ops(sg->graph, "all_gather", NodePhase::kRecompute), 0);
  for (const ParamInfo& p : sg->plan->params()) {
    EXPECT_EQ(p.shard_groups, std::vector<MeshGroup>{MeshGroup::kFsdp});
    EXPECT_EQ(p.local_shape[0], (p.global_shape[0] + 1) / 2) << p.name;
  }
}

TEST(Fsdp, UnevenShardsArePaddedAndTheLastRankHoldsThePadding) {
  auto sg = graph_for(3, {}, /*rank=*/2);
  const ParamInfo& wq = sg->plan->info("layers.0.attention.wq.weight");  // [40, 40]
  EXPECT_EQ(wq.local_shape, (Shape{14, 40}));
  EXPECT_EQ(wq.piece.at(0), 28);  // rows 28..41 of 40: two padding rows
  EXPECT_GT(count_ops(sg->graph, "slice", NodePhase::kForward), 0);
  EXPECT_GT(count_ops(sg->graph, "slice_backward", NodePhase::kBackward), 0);
}

TEST(Fsdp, ReshardAfterForwardLowersPlannedPeakByTheReleasedWeights) {
  auto keep = graph_for(2, {"--parallelism.fsdp_reshard_after_forward", "never"});
  auto free = graph_for(2, {"--parallelism.fsdp_reshard_after_forward", "always"});
  EXPECT_GT(free->reshard.gathers_recomputed, 0);
  EXPECT_EQ(count_ops(free->graph, "all_gather", NodePhase::kRecompute),
            free->reshard.gathers_recomputed);
  MemoryPlan a = plan_memory(keep->graph, DeviceType::kCPU);
  MemoryPlan b = plan_memory(free->graph, DeviceType::kCPU);
  const int64_t saved = a.live_peak_bytes - b.live_peak_bytes;
  // At the forward/backward boundary every gathered weight is live without resharding; with it,
  // only the one being re-gathered for the first backward block is. So the saving is the released
  // bytes minus at most one layer's gathered weights.
  int64_t largest_layer = 0;
  for (int l = 0; l < 2; ++l) {
    int64_t bytes = 0;
    for (const ParamInfo& p : free->plan->params())
      if (auto in = parse_block_name(p.name); in && in->index == l)
        bytes += p.global_shape.numel() * 4;
    largest_layer = std::max(largest_layer, bytes);
  }
  EXPECT_GT(saved, 0);
  EXPECT_LE(saved, free->reshard.bytes_released);
  EXPECT_GE(saved, free->reshard.bytes_released - largest_layer)
      << "saved " << saved << " of " << free->reshard.bytes_released << " released";
}

TEST(Fsdp, DefaultPolicyKeepsTheLastBlockAndRootParametersGathered) {
  auto sg = graph_for(2, {"--parallelism.fsdp_reshard_after_forward", "default"});
  for (NodeId id : sg->graph.schedule()) {
    const Node& n = sg->graph.node(id);
    if (n.phase == NodePhase::kRecompute && n.op == "all_gather") {
      EXPECT_EQ(n.block, 0) << n.scope;  // tiny has 2 layers
    }
  }
  EXPECT_GT(sg->reshard.gathers_recomputed, 0);
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

TEST(Placement, ParametersCarryTheirPlacementsPerGroup) {
  // One collective per parameter (as graph_for): the placements' own collectives.
  JobConfig cfg = testing::tiny_job({"--parallelism.data_parallel_replicate_degree", "2",
                                     "--parallelism.data_parallel_shard_degree", "2",
                                     "--compile.graph_passes", "none"});
  ParallelDims dims = parallel_dims_of(cfg, 4);
  RankGroups groups{MeshLayout(dims), 3};
  auto sg = build_step_graph(cfg, &groups, StepGraphOptions{.tokenizer_vocab = 258});
  const ParamInfo& p = sg->plan->info("output.weight");
  EXPECT_EQ(p.placement_string(), "fsdp: Shard(0), dp_replicate: Replicate()");
  // Backward: reduce-scatter over fsdp, then the all-reduce over the replicas.
  EXPECT_GT(count_ops(sg->graph, "all_reduce", NodePhase::kBackward), 0);
  EXPECT_EQ(count_ops(sg->graph, "reduce_scatter", NodePhase::kBackward),
            int(sg->plan->params().size()));
}

TEST(Placement, RedistributeEmitsTheCollectiveAndAutodiffItsReverse) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", {Shape{4, 3}, DType::kF64});
  ValueId full =
      redistribute(b, x, Placement::shard(0), Placement::replicate(), MeshGroup::kFsdp, 2);
  EXPECT_EQ(b.shape(full), (Shape{8, 3}));
  EXPECT_EQ(g.node(g.value(full).producer).op, "all_gather");
  ValueId part =
      redistribute(b, full, Placement::partial(), Placement::shard(0), MeshGroup::kTp, 4);
  EXPECT_EQ(g.node(g.value(part).producer).op, "reduce_scatter");
  EXPECT_EQ(redistribute(b, x, Placement::replicate(), Placement::replicate(), MeshGroup::kTp, 4),
            x);
  EXPECT_THROW(redistribute(b, x, Placement::replicate(), Placement::shard(0), MeshGroup::kTp, 4),
               ValueError);
  EXPECT_EQ(Placement::partial().to_string(), "Partial(sum)");
}

}  // namespace
}  // namespace meshtrain
