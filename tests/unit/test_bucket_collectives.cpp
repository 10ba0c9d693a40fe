// The scheduling passes on the graph of one rank of a virtual layout (no processes): how many
// collectives the bucketing leaves per step (DeepSeek-V3 debug model, FSDP 4 + EP 2), that no
// bucket mixes mesh groups, phases or blocks, that the flat buffers are in the memory plan, that
// prefetch issues each block's gathers ahead within the bound and what that costs in memory; and
// the flat-buffer layout (pack/unpack) the bucketed kernels use. Equal results are checked across
// real ranks: tests/dist, dist_parity_passes_* (bitwise).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "meshtrain/core/block_name.h"
#include "meshtrain/graph/graph_dump.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/ops/collective_ops.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/train/step_graph.h"

namespace meshtrain {
namespace {

struct Built {
  std::unique_ptr<RankGroups> groups;
  std::unique_ptr<StepGraph> sg;
};

Built deepseek_fsdp4_ep2(const std::vector<std::string>& extra, int rank = 0) {
  std::vector<std::string> o = {"--parallelism.data_parallel_shard_degree", "4",
                                "--parallelism.expert_parallel_degree", "2"};
  o.insert(o.end(), extra.begin(), extra.end());
  JobConfig cfg =
      parse_job_config(std::string(MT_TEST_SOURCE_DIR) + "/configs/deepseek_v3_debug.toml", o);
  Built b;
  b.groups = std::make_unique<RankGroups>(MeshLayout(parallel_dims_of(cfg, 4)), rank);
  b.sg = build_step_graph(cfg, b.groups.get(), StepGraphOptions{.tokenizer_vocab = 258});
  return b;
}

// Scheduled collectives per (kind, group).
std::map<std::pair<Collective, MeshGroup>, int> collectives(const Graph& g) {
  std::map<std::pair<Collective, MeshGroup>, int> n;
  for (NodeId id : g.schedule()) {
    const OpDef& d = OpRegistry::instance().op(g.node(id).op);
    if (d.is_collective()) ++n[{d.collective, g.node(id).attrs.group()}];
  }
  return n;
}
bool is_bucket(const Node& n) {
  const Collective c = OpRegistry::instance().op(n.op).collective;
  return (c == Collective::kAllGather || c == Collective::kReduceScatter) && n.inputs.size() > 1;
}

int total(const std::map<std::pair<Collective, MeshGroup>, int>& m) {
  int t = 0;
  for (const auto& [k, n] : m) t += n;
  return t;
}

TEST(BucketCollectives, DeepSeekFsdp4Ep2CountsPerStep) {
  using C = Collective;
  using G = MeshGroup;
  Built off = deepseek_fsdp4_ep2({"--compile.graph_passes", "none"});
  Built on = deepseek_fsdp4_ep2({});
  const auto a = collectives(off.sg->graph);
  const auto b = collectives(on.sg->graph);
  // One per parameter: 68 dense gathers + 54 re-gathers, 15 expert gathers, their reduce-scatters.
  EXPECT_EQ(a.at({C::kAllGather, G::kFsdp}), 122);
  EXPECT_EQ(a.at({C::kAllGather, G::kEfsdp}), 15);
  EXPECT_EQ(a.at({C::kReduceScatter, G::kFsdp}), 68);
  EXPECT_EQ(a.at({C::kReduceScatter, G::kEfsdp}), 15);
  // Per block: dense gathers = embedding + 6 blocks + (norm, output) + 5 re-gathered blocks (the
  // last block is not resharded); experts: 5 MoE blocks; reduce-scatters alike.
  EXPECT_EQ(b.at({C::kAllGather, G::kFsdp}), 13);
  EXPECT_EQ(b.at({C::kAllGather, G::kEfsdp}), 5);
  EXPECT_EQ(b.at({C::kReduceScatter, G::kFsdp}), 8);
  EXPECT_EQ(b.at({C::kReduceScatter, G::kEfsdp}), 5);
  // The token exchange is not a parameter collective: untouched.
  EXPECT_EQ(a.at({C::kExchange, G::kEp}), b.at({C::kExchange, G::kEp}));
  EXPECT_EQ(on.sg->buckets.collectives_before, 220);
  EXPECT_EQ(on.sg->buckets.collectives_after, 31);
  EXPECT_EQ(total(a) - total(b), 220 - 31);
}

// HSDP 2 x 4 + EP 2 (world 8): the replicas' gradient all-reduces are bucketed per block too, apart
// from the reduce-scatters that feed them.
TEST(BucketCollectives, HsdpReplicaAllReducesAreBucketedPerBlock) {
  using C = Collective;
  using G = MeshGroup;
  auto build = [](const std::vector<std::string>& extra) {
    std::vector<std::string> o = {"--parallelism.data_parallel_replicate_degree", "2",
                                  "--parallelism.data_parallel_shard_degree",     "4",
                                  "--parallelism.expert_parallel_degree",         "2"};
    o.insert(o.end(), extra.begin(), extra.end());
    JobConfig cfg =
        parse_job_config(std::string(MT_TEST_SOURCE_DIR) + "/configs/deepseek_v3_debug.toml", o);
    Built b;
    b.groups = std::make_unique<RankGroups>(MeshLayout(parallel_dims_of(cfg, 8)), 0);
    b.sg = build_step_graph(cfg, b.groups.get(), StepGraphOptions{.tokenizer_vocab = 258});
    return b;
  };
  Built off = build({"--compile.graph_passes", "none"});
  Built on = build({});
  const auto a = collectives(off.sg->graph);
  const auto b = collectives(on.sg->graph);
  // One all-reduce per parameter (68 dense + 15 expert: both are replicated over dp_replicate,
  // one communicator, so a block's dense and expert sums share a bucket) -> embedding + 6 blocks
  // + the final norm and output = 8.
  EXPECT_EQ(a.at({C::kAllReduce, G::kDpReplicate}), 83);
  EXPECT_EQ(b.at({C::kAllReduce, G::kDpReplicate}), 8);
  int all_reduce_buckets = 0;
  for (NodeId id : on.sg->graph.schedule()) {
    const Node& n = on.sg->graph.node(id);
    if (OpRegistry::instance().op(n.op).collective != C::kAllReduce || n.inputs.size() < 2)
      continue;
    ++all_reduce_buckets;
    EXPECT_EQ(n.phase, NodePhase::kBackward);
    EXPECT_EQ(n.attrs.group(), G::kDpReplicate);
    EXPECT_EQ(n.outputs.size(), n.inputs.size());
  }
  EXPECT_GE(all_reduce_buckets, 6);
  // 220 gathers and reduce-scatters (as without the replicas) and the 83 all-reduces.
  EXPECT_EQ(on.sg->buckets.collectives_before, 220 + 83);
  EXPECT_EQ(on.sg->buckets.collectives_after, 31 + 8);
}

TEST(BucketCollectives, ABucketNeverMixesGroupsPhasesOrBlocks) {
  Built on = deepseek_fsdp4_ep2({"--activation_checkpoint.mode", "full"});
  const Graph& g = on.sg->graph;
  int buckets = 0;
  for (NodeId id : g.schedule()) {
    const Node& n = g.node(id);
    if (!is_bucket(n)) continue;
    ++buckets;
    // One group and phase by construction (one node); one block: a block bucket is scoped in
    // its block, and every member's input comes from a node of the bucket's block (the root
    // buckets' from nodes outside the blocks).
    if (n.block != kNoBlock) EXPECT_EQ(n.scope.rfind(block_name(n.block), 0), 0u) << n.scope;
    for (ValueId v : n.inputs) {
      const NodeId p = g.value(v).producer;
      if (p != kNoNode) EXPECT_EQ(g.node(p).block, n.block) << n.scope << " <- " << g.node(p).scope;
    }
    std::set<DType> dtypes;
    for (ValueId v : n.inputs) dtypes.insert(g.value(v).meta.dtype);
    EXPECT_EQ(dtypes.size(), 1u);
  }
  EXPECT_GT(buckets, 20);
}

TEST(BucketCollectives, SizeBucketingClosesBucketsAtTheCap) {
  Built small = deepseek_fsdp4_ep2(
      {"--compile.graph_passes", "size_bucketing", "--compile.bucket_cap_mb", "1"});
  Built large = deepseek_fsdp4_ep2(
      {"--compile.graph_passes", "size_bucketing", "--compile.bucket_cap_mb", "1000"});
  // One bucket per kind, phase and group with a cap above the model: 2 forward gathers (dense,
  // experts), 1 re-gather, 2 reduce-scatters.
  EXPECT_EQ(large.sg->buckets.collectives_after, 5);
  EXPECT_GT(small.sg->buckets.collectives_after, 31);
  for (NodeId id : small.sg->graph.schedule()) {
    const Node& n = small.sg->graph.node(id);
    if (!is_bucket(n)) continue;
    // A bucket closes at the first tensor that reaches the cap: without its last tensor it held
    // less than the cap.
    int64_t bytes = 0;
    for (size_t i = 0; i + 1 < n.inputs.size(); ++i)
      bytes += int64_t(small.sg->graph.value(n.inputs[i]).meta.nbytes());
    EXPECT_LT(bytes, int64_t(1) << 20) << n.scope;
  }
}

TEST(BucketCollectives, FlatBuffersAreInTheMemoryPlan) {
  Built on = deepseek_fsdp4_ep2({});
  const Graph& g = on.sg->graph;
  MemoryPlan mp = plan_memory(g, DeviceType::kCPU);
  int checked = 0;
  for (NodeId id : mp.schedule) {
    const Node& n = g.node(id);
    const Collective c = OpRegistry::instance().op(n.op).collective;
    if (!is_bucket(n)) continue;
    int64_t block = 0;
    for (ValueId v : c == Collective::kAllGather ? n.inputs : n.outputs)
      block += int64_t(g.value(v).meta.nbytes());
    // The send and receive buffers: one rank block and group_size (4 or 2) of them.
    const int64_t k = n.attrs.i("group_size");
    EXPECT_GE(mp.workspace_bytes[size_t(id)], block * (k + 1)) << n.scope;
    EXPECT_GE(mp.workspace_offset[size_t(id)], 0);
    ++checked;
  }
  EXPECT_EQ(checked, 31 - 2);  // the embedding's gather and reduce-scatter are single tensors
}

TEST(Prefetch, GathersRunOneBlockAheadAndCostMemory) {
  Built one = deepseek_fsdp4_ep2({"--compile.max_gathered_blocks", "1"});
  Built two = deepseek_fsdp4_ep2({});
  EXPECT_EQ(one.sg->prefetch.gathers_moved, 0);
  EXPECT_GT(two.sg->prefetch.gathers_moved, 10);
  // Forward: the gather of layers.(i+1) precedes the first matmul of layers.i.
  const Graph& g = two.sg->graph;
  const std::vector<NodeId> order = g.schedule();
  std::map<std::string, size_t> gather_at, compute_at;
  for (size_t p = 0; p < order.size(); ++p) {
    const Node& n = g.node(order[p]);
    if (n.phase != NodePhase::kForward) continue;
    const OpDef& d = OpRegistry::instance().op(n.op);
    const std::string block = n.scope.substr(0, n.scope.find('.', 7));
    if (d.collective == Collective::kAllGather && n.attrs.group() == MeshGroup::kFsdp)
      gather_at.emplace(block, p);
    if (d.compute_heavy) compute_at.emplace(block, p);
  }
  for (int i = 0; i + 1 < 6; ++i) {
    const std::string cur = fmt::format("layers.{}", i), nxt = fmt::format("layers.{}", i + 1);
    EXPECT_LT(gather_at.at(nxt), compute_at.at(cur)) << nxt;
    if (i + 2 < 6) {  // the bound: two blocks gathered at once, not three
      EXPECT_GT(gather_at.at(fmt::format("layers.{}", i + 2)), compute_at.at(cur)) << cur;
    }
  }
  const int64_t a = plan_memory(one.sg->graph, DeviceType::kCPU).live_peak_bytes;
  const int64_t b = plan_memory(g, DeviceType::kCPU).live_peak_bytes;
  EXPECT_GT(b, a);  // prefetched weights are held longer
}

TEST(BucketLayout, PackAndUnpackRankBlocksRoundTrip) {
  std::unique_ptr<Backend> be = create_backend("cpu", 0);
  const int ranks = 3;
  std::vector<Tensor> ts;
  std::vector<size_t> block;
  for (int64_t n : {5, 1, 7}) {
    std::vector<float> v;
    for (int64_t i = 0; i < n * ranks; ++i) v.push_back(float(100 * n + i));
    ts.push_back(Tensor::from_vector(v, Shape{n * ranks}));
    block.push_back(size_t(n) * sizeof(float));
  }
  const BucketLayout l = bucket_layout(block);
  EXPECT_EQ(l.block_bytes, 13 * sizeof(float));
  std::vector<float> flat(13 * ranks, -1.f);
  pack_rank_blocks(*be, be->stream(0), ts, flat.data(), l, ranks);
  // Rank block 1, tensor 2 (7 elements at offset 6 of the block): elements 7..13 of tensor 2.
  EXPECT_EQ(flat[13 + 6], 700.f + 7);
  EXPECT_EQ(flat[13 + 5], 100.f + 1);  // tensor 1's element of rank 1
  std::vector<Tensor> back;
  for (const Tensor& t : ts) back.push_back(Tensor::empty(t.shape(), DType::kF32));
  unpack_rank_blocks(*be, be->stream(0), flat.data(), back, l, ranks);
  for (size_t i = 0; i < ts.size(); ++i)
    EXPECT_EQ(back[i].to_vector<float>(), ts[i].to_vector<float>()) << i;
}

}  // namespace
}  // namespace meshtrain
