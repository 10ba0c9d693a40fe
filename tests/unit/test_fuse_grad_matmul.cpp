// fuse_grad_matmul and matmul_accumulate: a bf16 weight-gradient matmul feeding a float32 sink
// becomes one matmul_accumulate (the matmul and its views die); same-dtype sinks, shared products
// and non-view chains stay; the CPU kernel sums bf16 products in float32 without rounding the
// product, overwrites or accumulates, and equals matmul + accumulate bit for bit in float64 when
// it overwrites; bad destinations are refused with the reason.
#include <gtest/gtest.h>

#include <random>

#include "gradcheck.h"
#include "meshtrain/graph/autodiff.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/graph/passes/fuse_grad_matmul.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/linear_cross_entropy.h"
#include "meshtrain/ops/matmul.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/train/step_graph.h"
#include "step_graph_fixtures.h"
#include "test_support.h"

namespace meshtrain {
namespace {

// dW [4, 6] = gyᵀ x with gy [2, 5, 4], x [2, 5, 6] (rows flattened), reshaped, then the sink.
struct SinkGraph {
  Graph g;
  ValueId dst = kNoValue, gy = kNoValue, x = kNoValue, dw = kNoValue;
};

std::unique_ptr<SinkGraph> sink_graph(DType operands, DType dst, bool overwrite,
                                      bool shared = false) {
  auto r = std::make_unique<SinkGraph>();
  Builder b(r->g, NodePhase::kBackward);
  r->dst = b.persistent("w.grad", {Shape{4, 6}, dst}, ValueRole::kGradient);
  r->gy = b.input("gy", {Shape{2, 5, 4}, operands});
  r->x = b.input("x", {Shape{2, 5, 6}, operands});
  r->dw = ops::reshape(b, ops::matmul(b, r->gy, r->x, true, false), Shape{4, 6});
  if (shared) r->g.mark_output(r->dw);
  ops::accumulate(b, r->dst, r->dw, overwrite);
  return r;
}

TEST(FuseGradMatmul, Bf16ProductIntoFloat32SinkBecomesOneGemm) {
  for (bool overwrite : {false, true}) {
    auto r = sink_graph(DType::kBF16, DType::kF32, overwrite);
    EXPECT_EQ(fuse_grad_matmul(r->g), 1);
    EXPECT_EQ(live_nodes(r->g, "matmul"), 0);
    EXPECT_EQ(live_nodes(r->g, "reshape"), 0);
    EXPECT_EQ(live_nodes(r->g, "accumulate"), 0);
    ASSERT_EQ(live_nodes(r->g, ops::kMatmulAccumulateOp), 1);
    for (const Node& n : r->g.nodes()) {
      if (n.dead || n.op != ops::kMatmulAccumulateOp) continue;
      EXPECT_EQ(n.inputs, (std::vector<ValueId>{r->dst, r->gy, r->x}));
      EXPECT_TRUE(n.attrs.b("transpose_a"));
      EXPECT_FALSE(n.attrs.b("transpose_b"));
      EXPECT_EQ(n.attrs.b("overwrite"), overwrite);
      EXPECT_EQ(n.phase, NodePhase::kBackward);
    }
  }
}

TEST(FuseGradMatmul, LeavesSameDtypeSharedAndNonViewChains) {
  EXPECT_EQ(fuse_grad_matmul(sink_graph(DType::kF32, DType::kF32, true)->g), 0);
  EXPECT_EQ(fuse_grad_matmul(sink_graph(DType::kF64, DType::kF64, false)->g), 0);
  auto shared = sink_graph(DType::kBF16, DType::kF32, true, /*shared=*/true);
  EXPECT_EQ(fuse_grad_matmul(shared->g), 0);
  EXPECT_EQ(live_nodes(shared->g, "matmul"), 1);
  // A scale between the product and the sink is arithmetic, not a view.
  Graph g;
  Builder b(g, NodePhase::kBackward);
  ValueId dst = b.persistent("w.grad", {Shape{4, 6}, DType::kF32}, ValueRole::kGradient);
  ValueId gy = b.input("gy", {Shape{5, 4}, DType::kBF16});
  ValueId x = b.input("x", {Shape{5, 6}, DType::kBF16});
  ops::accumulate(b, dst, ops::scale(b, ops::matmul(b, gy, x, true, false), 0.5));
  EXPECT_EQ(fuse_grad_matmul(g), 0);
}

// The step graph of a bf16-compute run on one rank (the graph builds anywhere; only CUDA runs
// it): every dense weight's gradient is written by its GEMM (Llama: wq wk wv wo w1 w2 w3 per
// layer), the output head's by scale_by_accumulate (the fused output loss's dw times dloss);
// the sinks left with a bf16 source are the norms' and the embedding's, whose gradients are no
// matmul. The float32 graph keeps its sinks.
TEST(FuseGradMatmul, Bf16StepGraphWritesEveryDenseWeightGradientFromItsGemm) {
  const auto mp = bf16_step_graph("llama3_debug.toml");
  const StepGraph* bf16 = mp->sg.get();
  const int layers = int(bf16->model->n_layers());
  EXPECT_EQ(bf16->fused_grad_matmuls, 7 * layers + 1);
  EXPECT_EQ(live_nodes(bf16->graph, ops::kMatmulAccumulateOp), 7 * layers);
  EXPECT_EQ(live_nodes(bf16->graph, ops::kScaleByAccumulateOp), 1);
  int bf16_sinks = 0;
  for (const Node& n : bf16->graph.nodes()) {
    if (n.dead || n.op != "accumulate") continue;
    const Value& src = bf16->graph.value(n.inputs.at(1));
    if (src.meta.dtype != DType::kBF16) continue;
    ++bf16_sinks;
    EXPECT_NE(bf16->graph.node(src.producer).op, "matmul") << n.scope;
    EXPECT_NE(bf16->graph.node(src.producer).op, ops::kScaleByOp) << n.scope;
  }
  EXPECT_EQ(bf16_sinks, 2 * layers + 2);  // attention_norm, ffn_norm; norm, tok_embeddings
  auto f32 = build_step_graph(mp->cfg, &mp->groups, StepGraphOptions{.tokenizer_vocab = 258});
  EXPECT_EQ(f32->fused_grad_matmuls, 0);
  EXPECT_EQ(live_nodes(f32->graph, ops::kMatmulAccumulateOp), 0);
  // The unfused output loss: the head's gradient is a matmul again, written by its GEMM.
  const auto unfused = bf16_step_graph("llama3_debug.toml", {"--model.fused_output_loss", "false"});
  const StepGraph* bf16u = unfused->sg.get();
  EXPECT_EQ(live_nodes(bf16u->graph, ops::kMatmulAccumulateOp), 7 * layers + 1);
  EXPECT_EQ(live_nodes(bf16u->graph, ops::kScaleByAccumulateOp), 0);
}

// The fused sinks run where their GEMM was made, not at the end of the backward where the sinks
// were appended: each layer's weight-gradient GEMMs come before any backward node of the layer
// below, and the head's scale_by_accumulate before any backward node of the last layer. (At the
// end they would keep every layer's activation and output gradient alive through the backward.)
TEST(FuseGradMatmul, FusedSinksRunWhereTheirProductWasMade) {
  const auto mp = bf16_step_graph("llama3_debug.toml");
  const StepGraph* sg = mp->sg.get();
  const int layers = int(sg->model->n_layers());
  ASSERT_GE(layers, 2);
  auto layer_of = [](const std::string& scope) {
    if (scope.rfind("layers.", 0) != 0) return -1;
    return std::stoi(scope.substr(7));
  };
  // Schedule position of the first backward node of each layer, and of each fused sink.
  std::vector<int> first_backward(size_t(layers), -1);
  std::vector<std::pair<int, const Node*>> sinks;
  const std::vector<NodeId> order = sg->graph.schedule();
  for (int pos = 0; pos < int(order.size()); ++pos) {
    const Node& n = sg->graph.node(order[size_t(pos)]);
    if (n.op == ops::kMatmulAccumulateOp || n.op == ops::kScaleByAccumulateOp)
      sinks.push_back({pos, &n});
    const int l = layer_of(n.scope);
    if (n.phase == NodePhase::kBackward && l >= 0 && first_backward[size_t(l)] < 0)
      first_backward[size_t(l)] = pos;
  }
  ASSERT_EQ(int(sinks.size()), 7 * layers + 1);
  for (const auto& [pos, n] : sinks) {
    const int l = layer_of(n->scope);
    if (n->op == ops::kScaleByAccumulateOp) {
      EXPECT_LT(pos, first_backward[size_t(layers - 1)]) << "the head's gradient sink";
    } else if (l > 0) {
      EXPECT_LT(pos, first_backward[size_t(l - 1)])
          << n->scope << " runs after layer " << l - 1 << "'s backward began";
    }
  }
}

// Fills a CPU executor's input with uniform values in [-1, 1) rounded to its dtype; returns them.
std::vector<double> fill(Executor& ex, ValueId v, std::mt19937_64& rng) {
  Tensor& t = const_cast<Tensor&>(ex.tensor(v));
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double x = u(rng);
    if (t.dtype() == DType::kBF16) {
      t.data<BFloat16>()[i] = BFloat16(float(x));
      out[size_t(i)] = float(t.data<BFloat16>()[i]);
    } else if (t.dtype() == DType::kF32) {
      t.data<float>()[i] = float(x);
      out[size_t(i)] = t.data<float>()[i];
    } else {
      t.data<double>()[i] = x;
      out[size_t(i)] = x;
    }
  }
  return out;
}

TEST(MatmulAccumulate, CpuBf16OperandsSumInFloat32IntoTheDestination) {
  const uint64_t seed = testing::fresh_seed();
  for (bool overwrite : {false, true}) {
    SCOPED_TRACE(fmt::format("overwrite {} seed {}", overwrite, seed));
    auto r = sink_graph(DType::kBF16, DType::kF32, overwrite);
    ASSERT_EQ(fuse_grad_matmul(r->g), 1);
    auto be = create_backend("cpu", 0);
    Tensor dst = Tensor::empty(Shape{4, 6}, DType::kF32, be->allocator());
    std::mt19937_64 rng(seed);
    std::vector<float> dst0(24);
    for (int i = 0; i < 24; ++i) dst.data<float>()[i] = dst0[size_t(i)] = float(i % 7) - 3.5f;
    Executor ex(r->g, plan_memory(r->g, DeviceType::kCPU), *be, nullptr);
    ex.bind(r->dst, dst);
    ex.prepare();
    const std::vector<double> gy = fill(ex, r->gy, rng), x = fill(ex, r->x, rng);
    ex.run();
    ex.run();  // twice: dst0 + 2 P, or P
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 6; ++j) {
        double p = 0;
        for (int t = 0; t < 10; ++t) p += gy[size_t(t * 4 + i)] * x[size_t(t * 6 + j)];
        const double want = overwrite ? p : dst0[size_t(i * 6 + j)] + 2 * p;
        // Ten products of bf16 values are exact in float32; their sum rounds a few times.
        EXPECT_NEAR(dst.data<float>()[i * 6 + j], want, 1e-5 * (1 + std::abs(want)))
            << "element " << i << "," << j;
      }
  }
}

TEST(MatmulAccumulate, CpuFloat64OverwriteEqualsMatmulThenAccumulate) {
  const uint64_t seed = testing::fresh_seed();
  auto be = create_backend("cpu", 0);
  auto run = [&](bool fused) {
    auto r = sink_graph(DType::kF64, DType::kF64, /*overwrite=*/true);
    if (fused) {
      // The pass leaves same-dtype sinks alone: build the accumulating form by hand.
      Graph g;
      Builder b(g, NodePhase::kBackward);
      ValueId dst = b.persistent("w.grad", {Shape{4, 6}, DType::kF64}, ValueRole::kGradient);
      ValueId gy = b.input("gy", {Shape{2, 5, 4}, DType::kF64});
      ValueId x = b.input("x", {Shape{2, 5, 6}, DType::kF64});
      ops::matmul_accumulate(b, dst, gy, x, true, false, true);
      r->g = std::move(g);
      r->dst = dst, r->gy = gy, r->x = x;
    }
    Tensor dst = Tensor::empty(Shape{4, 6}, DType::kF64, be->allocator());
    for (int i = 0; i < 24; ++i) dst.data<double>()[i] = 100.0 + i;  // overwritten
    Executor ex(r->g, plan_memory(r->g, DeviceType::kCPU), *be, nullptr);
    ex.bind(r->dst, dst);
    ex.prepare();
    std::mt19937_64 rng(seed);
    fill(ex, r->gy, rng);
    fill(ex, r->x, rng);
    ex.run();
    return std::vector<double>(dst.data<double>(), dst.data<double>() + 24);
  };
  EXPECT_EQ(run(true), run(false)) << "seed " << seed;
}

TEST(MatmulAccumulate, RefusesADestinationOfTheWrongSizeOrDtype) {
  Graph g;
  Builder b(g);
  ValueId gy = b.input("gy", {Shape{5, 4}, DType::kBF16});
  ValueId x = b.input("x", {Shape{5, 6}, DType::kBF16});
  ValueId small = b.persistent("small", {Shape{4, 5}, DType::kF32}, ValueRole::kGradient);
  ValueId f64 = b.persistent("f64", {Shape{4, 6}, DType::kF64}, ValueRole::kGradient);
  const std::string size = testing::error_message<ShapeError>(
      [&] { ops::matmul_accumulate(b, small, gy, x, true, false, false); });
  EXPECT_NE(size.find("the destination [4, 5] holds 20 elements, the product 4 x 6"),
            std::string::npos)
      << size;
  const std::string dtype = testing::error_message<ShapeError>(
      [&] { ops::matmul_accumulate(b, f64, gy, x, true, false, false); });
  EXPECT_NE(dtype.find("a float64 destination for bfloat16 operands"), std::string::npos) << dtype;
}

}  // namespace
}  // namespace meshtrain
