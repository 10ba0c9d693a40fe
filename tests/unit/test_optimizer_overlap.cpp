// [optimizer] overlap_next_step (optim/optimizer.h): the update in one AdamW slice per layer, which
// covers every group's flat buffers exactly once at aligned starts; the step graph waiting on each
// stream at the first node that touches an external write only; and training with the overlap
// bitwise equal to training without it (losses, norms, every master weight, the moments and the
// load-balancing state), with one micro-batch and with gradient accumulation (the gradient reset).
// Layouts whose update has collectives: the dist_parity_overlap_* runs (tests/dist).
// CPU streams run in order, so here the overlap checks the slicing and the plumbing; the GPU suite
// (CudaTraining) checks the same equality where the update really runs beside the next step.
#include <gtest/gtest.h>

#include <cstring>

#include "meshtrain/graph/executor.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/train/step_graph.h"
#include "meshtrain/train/trainer.h"
#include "test_support.h"

namespace meshtrain {
namespace {

TEST(OptimizerOverlap, ParamLayerIsTheFirstNameComponentOrLayersN) {
  EXPECT_EQ(param_layer("layers.3.moe.experts.w1"), "layers.3");
  EXPECT_EQ(param_layer("layers.12.attention.wq.weight"), "layers.12");
  EXPECT_EQ(param_layer("tok_embeddings.weight"), "tok_embeddings");
  EXPECT_EQ(param_layer("output.weight"), "output");
  EXPECT_EQ(param_layer("norm"), "norm");
  EXPECT_EQ(param_layer("layers.x1.w"), "layers");
}

// The one-rank step graph of a DeepSeek-V3 flavor (planned only: nothing allocated), its param
// groups, and optimizer graphs built from them.
struct Planned {
  std::unique_ptr<RankGroups> groups;
  std::unique_ptr<StepGraph> sg;
  std::vector<ParamGroup> pg;
  explicit Planned(const std::string& flavor, int n_layers, int world = 1) {
    JobConfig cfg =
        testing::tiny_job({"--model.name", "deepseek_v3", "--model.flavor", flavor,
                           "--model.n_layers", std::to_string(n_layers),
                           "--parallelism.data_parallel_shard_degree", std::to_string(world)});
    groups = std::make_unique<RankGroups>(MeshLayout(parallel_dims_of(cfg, world)), 0);
    sg = build_step_graph(cfg, groups.get(), StepGraphOptions{.tokenizer_vocab = 258});
    pg = layout_param_groups(*sg->plan);
  }
  void optimizer(OptimizerGraph& og, bool by_layer) const {
    build_optimizer_graph(og, pg, *sg->plan, ops::AdamWParams{},
                          {.layers = sg->plan->load_balance_layers()}, by_layer);
  }
};

TEST(OptimizerOverlap, SlicesCoverEachGroupOnceInLayerOrderAtAlignedStarts) {
  const Planned planned("debugmodel", 3);
  const std::vector<ParamGroup>& pg = planned.pg;
  const StepGraph* sg = planned.sg.get();
  for (bool by_layer : {false, true}) {
    SCOPED_TRACE(by_layer ? "by layer" : "whole groups");
    OptimizerGraph og;
    planned.optimizer(og, by_layer);
    EXPECT_EQ(og.state_nodes.empty(), sg->plan->load_balance_layers().empty());
    std::vector<int64_t> covered(pg.size(), 0);
    std::vector<std::string> names;
    for (const OptimizerGraph::Slice& s : og.slices) {
      ASSERT_LT(s.group, pg.size());
      EXPECT_EQ(s.begin, covered[s.group]) << s.name << ": slices must be contiguous";
      EXPECT_EQ(s.begin % 64, 0) << s.name;
      EXPECT_GT(s.count, 0) << s.name;
      covered[s.group] = s.begin + s.count;
      const Node& n = og.graph.node(s.node);
      EXPECT_EQ(n.op, "adamw_update");
      const ops::ElementRange r =
          ops::adamw_range(n.attrs, std::max<int64_t>(pg[s.group].numel, 1));
      EXPECT_EQ(r.begin, s.begin);
      EXPECT_EQ(r.count, s.count);
      names.push_back(s.name);
    }
    for (size_t g = 0; g < pg.size(); ++g)
      EXPECT_EQ(covered[g], std::max<int64_t>(pg[g].numel, 1)) << "group " << g;
    if (!by_layer) {
      EXPECT_EQ(og.slices.size(), pg.size());
      continue;
    }
    // The model's layers in the forward's order: the embedding first, every layer, the head.
    ASSERT_GE(names.size(), size_t(sg->model->n_layers()) + 2);
    EXPECT_EQ(names.front(), "tok_embeddings");
    for (int l = 0; l < sg->model->n_layers(); ++l)
      EXPECT_NE(std::find(names.begin(), names.end(), "layers." + std::to_string(l)), names.end())
          << "layers." << l;
  }
}

// At the 16B shapes (planned only, nothing allocated) a MoE layer's expert weights are slices of
// their own: the layer's first nodes wait for its attention weights, not for its experts.
TEST(OptimizerOverlap, LargeLayersSplitAtParameterBoundaries) {
  const Planned planned("16B", 2);
  const std::vector<ParamGroup>& pg = planned.pg;
  OptimizerGraph og;
  planned.optimizer(og, true);
  int moe_parts = 0;
  for (const OptimizerGraph::Slice& s : og.slices) {
    moe_parts += s.name.rfind("layers.1.part", 0) == 0;
    // Every slice begins at a parameter (rounded down to 64 elements).
    bool at_param = false;
    for (size_t i = 0; i < pg[s.group].params.size(); ++i)
      at_param |= pg[s.group].offsets[i] / 64 * 64 == s.begin;
    EXPECT_TRUE(at_param) << s.name << " begins at " << s.begin;
  }
  EXPECT_GE(moe_parts, 3) << "the MoE layer's w1, w2 and w3 each a slice";
}

TEST(OptimizerOverlap, StepGraphWaitsOncePerStreamAtTheFirstTouch) {
  std::unique_ptr<Backend> backend = create_backend("cpu", 0);
  Backend& be = *backend;
  Graph g;
  Builder b(g);
  ValueId p = b.persistent("p", {Shape{64}, DType::kF32}, ValueRole::kParameter);
  ValueId x = b.input("x", {Shape{64}, DType::kF32});
  ValueId y = ops::add(b, ops::add(b, p, x), p);  // p read twice, on stream 0
  g.mark_output(y);
  Executor ex(g, plan_memory(g, DeviceType::kCPU), be, nullptr);
  // p is the first 256 bytes of a larger buffer whose other bytes nothing of the graph touches.
  Tensor whole = Tensor::empty(Shape{1024}, DType::kF32);
  Tensor pt = whole.slice_rows(0, 64);
  ex.bind(p, pt);
  ex.prepare();
  std::unique_ptr<Event> e1 = be.create_event(false), e2 = be.create_event(false);
  const uintptr_t base = reinterpret_cast<uintptr_t>(pt.raw());
  EXPECT_EQ(ex.wait_for_external_writes({{e1.get(), base + 1000, base + 2000}}), 0)
      << "bytes the graph never touches";
  EXPECT_EQ(ex.wait_for_external_writes({{e1.get(), base + 128, base + 132}}), 1)
      << "the first reader waits, the second is after it on the same stream";
  EXPECT_EQ(
      ex.wait_for_external_writes({{e2.get(), base, base + 4}, {e2.get(), base + 200, base + 204}}),
      1)
      << "one event, two ranges: one wait";
}

struct RunState {
  testing::RunResult steps;
  std::vector<std::vector<uint8_t>> masters, state;
};

std::vector<uint8_t> bytes_of(const Tensor& host) {
  std::vector<uint8_t> bytes(host.nbytes());
  std::memcpy(bytes.data(), host.raw(), host.nbytes());
  return bytes;
}

RunState train_and_read(const JobConfig& cfg) {
  Trainer t(cfg, testing::test_runtime());
  RunState r;
  r.steps = testing::run_train(t);
  for (const ParamInfo& p : t.plan().params())
    r.masters.push_back(bytes_of(t.params().master_to_host(p.name)));
  for (const ParamGroup& g : t.params().groups())  // CPU ranks: the moments are host memory
    for (const Tensor* m : {&g.exp_avg, &g.exp_avg_sq}) r.state.push_back(bytes_of(*m));
  return r;
}

void expect_same_run(std::vector<std::string> overrides) {
  overrides.insert(overrides.end(), {"--model.name", "deepseek_v3", "--model.flavor", "debugmodel",
                                     "--model.n_layers", "2", "--metrics.log_freq", "1"});
  JobConfig off = testing::tiny_job(overrides);
  overrides.insert(overrides.end(), {"--optimizer.overlap_next_step", "true"});
  JobConfig on = testing::tiny_job(overrides);
  const RunState a = train_and_read(off), b = train_and_read(on);
  ASSERT_EQ(a.steps.loss.size(), size_t(off.training.steps));
  EXPECT_EQ(a.steps.loss, b.steps.loss);
  EXPECT_EQ(a.steps.grad_norm, b.steps.grad_norm);
  ASSERT_EQ(a.masters.size(), b.masters.size());
  for (size_t i = 0; i < a.masters.size(); ++i)
    EXPECT_EQ(a.masters[i], b.masters[i]) << "param " << i;
  EXPECT_EQ(a.state, b.state) << "the AdamW moments";
}

// With compute copies (float64 masters, float32 compute): the slices write both.
TEST(OptimizerOverlap, TrainingIsBitwiseTheSameWithOneMicroBatchAndComputeCopies) {
  expect_same_run(
      {"--training.master_dtype", "float64", "--training.mixed_precision_param", "float32"});
}

TEST(OptimizerOverlap, TrainingIsBitwiseTheSameWithGradientAccumulation) {
  expect_same_run({"--training.local_batch_size", "1", "--training.global_batch_size", "2"});
}

}  // namespace
}  // namespace meshtrain
