// Golden fingerprints of scheduled step graphs: node count, the schedule (ids, ops, phases,
// streams, scopes, value wiring) and the CPU memory plan (every offset, the arena peak) of the
// DeepSeek-V3 and Llama debug models under FSDP + EP with each activation-checkpoint mode. The
// numbers were captured from the code before the recompute passes shared one helper (the EP
// cases re-captured when expert rows were planned at a capacity factor; the worst-case case still
// has the old fingerprint); a refactor of the passes must leave every graph, and so every bit of
// a run, unchanged. The cases run with [compile] graph_passes none (those fingerprints predate
// the scheduling passes); the `_passes` cases add the default scheduling passes (bucketing,
// prefetch), captured when they were switched on after dist_parity_passes_* proved the runs
// bitwise equal (their EP cases re-captured at the default capacity factor on the merge; the TP
// and HSDP ones when gradient all-reduces were bucketed, after dist_parity_passes_ddp4_bitwise,
// _hsdp2x2_f64_bitwise and _dsv3_fsdp2_tp2_ep2_ac_full_bitwise proved those runs bitwise equal).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/train/step_graph.h"

namespace meshtrain {
namespace {

struct Fingerprint {
  int nodes = 0;     // Graph::num_nodes (dead nodes included: ids must not move)
  int schedule = 0;  // live nodes in the schedule
  int64_t arena = 0;
  uint64_t hash = 0;  // FNV-1a of the canonical text below
};

// One line per scheduled node, then the plan of every value and workspace. Attributes and value
// names are left out on purpose: their spelling may change, the graph's structure may not.
std::string canonical(const Graph& g, const MemoryPlan& mp) {
  std::string s;
  for (NodeId id : mp.schedule) {
    const Node& n = g.node(id);
    s += fmt::format("{} {} {} {} {} in[{}] out[{}] ws {}@{}\n", id, n.op, node_phase_name(n.phase),
                     n.stream, n.scope, fmt::join(n.inputs, ","), fmt::join(n.outputs, ","),
                     mp.workspace_bytes[size_t(id)], mp.workspace_offset[size_t(id)]);
  }
  for (ValueId v = 0; v < g.num_values(); ++v)
    s += fmt::format("%{} {} {} {} @{}:{}\n", v, g.value(v).meta.shape,
                     dtype_name(g.value(v).meta.dtype), g.value(v).alias_of,
                     int(mp.region[size_t(v)]), mp.offset[size_t(v)]);
  s += fmt::format("arena {} live {} inputs {}\n", mp.arena_bytes, mp.live_peak_bytes,
                   mp.input_bytes);
  return s;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

Fingerprint fingerprint(const std::string& config, int world, int rank,
                        const std::vector<std::string>& overrides, const std::string& tag) {
  // The source tree the build was configured from (tests/CMakeLists.txt defines it).
  const char* root = MT_TEST_SOURCE_DIR;
  // Pinned to the unfused output loss (linear, then cross_entropy) that the fingerprints were
  // captured with; the fused op is proven against that graph by test_ops_linear_cross_entropy
  // and the parity layouts.
  std::vector<std::string> o = overrides;
  o.insert(o.end(), {"--model.fused_output_loss", "false"});
  JobConfig cfg = parse_job_config(std::string(root) + "/configs/" + config, o);
  MeshLayout layout(parallel_dims_of(cfg, world));
  RankGroups groups(layout, rank);
  auto sg = build_step_graph(cfg, &groups, StepGraphOptions{.tokenizer_vocab = 258});
  MemoryPlan mp = plan_memory(sg->graph, DeviceType::kCPU);
  const std::string text = canonical(sg->graph, mp);
  // Kept for a diff when a fingerprint moves.
  std::ofstream(::testing::TempDir() + "step_graph_golden_" + tag + ".txt") << text;
  return {sg->graph.num_nodes(), int(mp.schedule.size()), mp.arena_bytes, fnv1a(text)};
}

void expect_golden(const Fingerprint& f, const Fingerprint& want, const std::string& tag) {
  EXPECT_EQ(f.nodes, want.nodes) << tag;
  EXPECT_EQ(f.schedule, want.schedule) << tag;
  EXPECT_EQ(f.arena, want.arena) << tag;
  EXPECT_EQ(f.hash, want.hash) << tag << ": the graph or its plan changed; the current text is in "
                               << ::testing::TempDir() << "step_graph_golden_" << tag << ".txt";
}

const std::vector<std::string> kFsdp4Ep2 = {"--compile.graph_passes",
                                            "none",
                                            "--parallelism.data_parallel_shard_degree",
                                            "4",
                                            "--parallelism.expert_parallel_degree",
                                            "2",
                                            "--training.local_batch_size",
                                            "2"};

std::vector<std::string> with(std::vector<std::string> base, std::vector<std::string> extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

struct Case {
  const char* tag;
  const char* config;
  int world, rank;
  std::vector<std::string> overrides;
  Fingerprint want;
};

TEST(StepGraphGolden, SchedulesAndMemoryPlansAreUnchanged) {
  const std::vector<std::string> full = {"--activation_checkpoint.mode", "full"};
  const std::vector<std::string> sel_op = {"--activation_checkpoint.mode", "selective",
                                           "--activation_checkpoint.selective_ac_option", "op"};
  const std::vector<std::string> sel_2 = {"--activation_checkpoint.mode", "selective",
                                          "--activation_checkpoint.selective_ac_option", "2"};
  const std::vector<std::string> tp2 = {"--compile.graph_passes",
                                        "none",
                                        "--parallelism.data_parallel_shard_degree",
                                        "2",
                                        "--parallelism.tensor_parallel_degree",
                                        "2",
                                        "--parallelism.expert_parallel_degree",
                                        "2",
                                        "--parallelism.fsdp_reshard_after_forward",
                                        "always"};
  const std::vector<std::string> hsdp = {"--compile.graph_passes",
                                         "none",
                                         "--parallelism.data_parallel_replicate_degree",
                                         "2",
                                         "--parallelism.data_parallel_shard_degree",
                                         "2"};
  const std::vector<std::string> passes = {"--compile.graph_passes", "transformer_block_bucketing"};
  const char* ds = "deepseek_v3_debug.toml";
  // The EP cases plan the expert rows at the default [parallelism] expert_capacity_factor; at
  // the worst case (factor = EP) the graph and plan are the ones before capacity planning, bit for
  // bit (the first case keeps that fingerprint).
  const std::vector<std::string> worst = {"--parallelism.expert_capacity_factor", "2"};
  const std::vector<Case> cases = {
      {"ds_fsdp4_ep2_none_worst_case",
       ds,
       4,
       0,
       with(kFsdp4Ep2, worst),
       {894, 870, 157904128, 0xff7bfca48e6b23a8ull}},
      {"ds_fsdp4_ep2_none", ds, 4, 0, kFsdp4Ep2, {894, 870, 145026048, 0xde67bfc222c4450aull}},
      {"ds_fsdp4_ep2_full",
       ds,
       4,
       0,
       with(kFsdp4Ep2, full),
       {1117, 1093, 66604544, 0x7731813e320426cfull}},
      {"ds_fsdp4_ep2_sel_op",
       ds,
       4,
       1,
       with(kFsdp4Ep2, sel_op),
       {1039, 1015, 132388864, 0x3509235822fe6e71ull}},
      {"ds_fsdp4_ep2_sel_2",
       ds,
       4,
       3,
       with(kFsdp4Ep2, sel_2),
       {1011, 987, 104131328, 0x85ee539c29cbcea7ull}},
      {"ds_fsdp2_tp2_ep2_full_always",
       ds,
       4,
       2,
       with(tp2, full),
       {1264, 1240, 61919232, 0xad097608d79a417bull}},
      {"llama_hsdp_sel_op",
       "llama3_debug.toml",
       4,
       1,
       with(hsdp, sel_op),
       {698, 698, 190992384, 0x4eef4fef62af0926ull}},
      // The scheduling passes on (a later override wins over kFsdp4Ep2's "none").
      {"ds_fsdp4_ep2_none_passes",
       ds,
       4,
       0,
       with(kFsdp4Ep2, passes),
       {923, 681, 179131136, 0x34073a91581cbed8ull}},
      {"ds_fsdp4_ep2_full_passes",
       ds,
       4,
       0,
       with(with(kFsdp4Ep2, full), passes),
       {1151, 894, 113645312, 0xe842c968f42a4ab2ull}},
      {"ds_fsdp2_tp2_ep2_full_always_passes",
       ds,
       4,
       2,
       with(with(tp2, full), passes),
       {1306, 1007, 85144576, 0xbc2f23f77fcc7a2eull}},
      {"llama_hsdp_sel_op_passes",
       "llama3_debug.toml",
       4,
       1,
       with(with(hsdp, sel_op), passes),
       {724, 511, 193482752, 0x9a96ddebe012c574ull}},
  };
  for (const Case& c : cases) {
    Fingerprint f = fingerprint(c.config, c.world, c.rank, c.overrides, c.tag);
    expect_golden(f, c.want, c.tag);
  }
}

}  // namespace
}  // namespace meshtrain
