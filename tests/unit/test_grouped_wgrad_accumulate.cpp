// grouped_matmul_wgrad_accumulate and its rewrite by fuse_grad_matmul: a bf16 expert weight
// gradient feeding a float32 sink becomes one accumulating grouped GEMM (the wgrad and its views
// die, their kernel choice stays); the CPU kernel sums bf16 products in float32 without rounding
// them, overwrites (zeroing experts with no rows) or accumulates (leaving them), and equals wgrad +
// accumulate bit for bit in float64 when it overwrites; the bf16 DeepSeek step graph writes every
// routed expert weight's gradient from its GEMM; bad destinations are refused with the reason.
#include <gtest/gtest.h>

#include <random>

#include "gradcheck.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/graph/passes/fuse_grad_matmul.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/moe/grouped_matmul.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/parallel/rank_groups.h"
#include "meshtrain/runtime/backend.h"
#include "meshtrain/train/step_graph.h"
#include "step_graph_fixtures.h"
#include "test_support.h"

namespace meshtrain {
namespace {

// 4 experts over 12 rows: rows 0..2, 4..7, none (expert 2), 8..10; rows 3 and 11 unused.
constexpr int64_t kE = 4, kRows = 12, kP = 4, kQ = 3;
const std::vector<int32_t> kGroups = {0, 4, 8, 8, 3, 4, 0, 3};
int expert_of(int64_t r) { return r < 3 ? 0 : r == 3 ? -1 : r < 8 ? 1 : r < 11 ? 3 : -1; }

// dst [E·P, Q] (+)= wgrad(a [12, P], b [12, Q]) through a reshape, or the accumulating form
// built by hand (`direct`: what the pass leaves alone for same-dtype sinks).
struct WgradGraph {
  Graph g;
  ValueId dst = kNoValue, a = kNoValue, b = kNoValue, groups = kNoValue;
};

std::unique_ptr<WgradGraph> wgrad_graph(
    DType operands, DType dst, bool overwrite, bool direct = false,
    ops::ExpertGemmKernel kernel = ops::ExpertGemmKernel::kAuto) {
  auto r = std::make_unique<WgradGraph>();
  Builder b(r->g, NodePhase::kBackward);
  r->dst = b.persistent("experts.w1.grad", {Shape{kE * kP, kQ}, dst}, ValueRole::kGradient);
  r->a = b.input("a", {Shape{kRows, kP}, operands});
  r->b = b.input("b", {Shape{kRows, kQ}, operands});
  r->groups = b.input("groups", {Shape{2, kE}, DType::kI32});
  if (direct) {
    ops::grouped_matmul_wgrad_accumulate(b, r->dst, r->a, r->b, r->groups, overwrite, kernel);
  } else {
    ValueId w = ops::grouped_matmul_wgrad(b, r->a, r->b, r->groups, kernel);
    ops::accumulate(b, r->dst, ops::reshape(b, w, Shape{kE * kP, kQ}), overwrite);
  }
  return r;
}

// Runs the graph `runs` times on the CPU from dst0; operands uniform in [-1, 1) rounded to their
// dtype (rows 3 and 11 NaN: no group reads them). Returns dst, and the operands as doubles.
struct CpuRun {
  std::vector<double> dst, a, b;
};
CpuRun run_cpu(WgradGraph& r, const std::vector<double>& dst0, uint64_t seed, int runs) {
  auto be = create_backend("cpu", 0);
  const DType dd = r.g.value(r.dst).meta.dtype;
  Tensor dst = Tensor::empty(Shape{kE * kP, kQ}, dd, be->allocator());
  for (size_t i = 0; i < dst0.size(); ++i) {
    if (dd == DType::kF32) dst.data<float>()[i] = float(dst0[i]);
    if (dd == DType::kF64) dst.data<double>()[i] = dst0[i];
  }
  Executor ex(r.g, plan_memory(r.g, DeviceType::kCPU), *be, nullptr);
  ex.bind(r.dst, dst);
  ex.prepare();
  std::mt19937_64 rng(seed);
  CpuRun out;
  auto fill = [&](ValueId v, int64_t cols) {
    Tensor& t = const_cast<Tensor&>(ex.tensor(v));
    std::vector<double> vals(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const bool unused = expert_of(i / cols) < 0;
      const double x = unused ? NAN : std::uniform_real_distribution<double>(-1, 1)(rng);
      if (t.dtype() == DType::kBF16) {
        t.data<BFloat16>()[i] = BFloat16(float(x));
        vals[size_t(i)] = float(t.data<BFloat16>()[i]);
      } else {
        t.data<double>()[i] = x;
        vals[size_t(i)] = x;
      }
    }
    return vals;
  };
  out.a = fill(r.a, kP);
  out.b = fill(r.b, kQ);
  Tensor& g = const_cast<Tensor&>(ex.tensor(r.groups));
  std::copy(kGroups.begin(), kGroups.end(), g.data<int32_t>());
  for (int i = 0; i < runs; ++i) ex.run();
  out.dst.resize(dst0.size());
  for (size_t i = 0; i < dst0.size(); ++i)
    out.dst[i] = dd == DType::kF32 ? double(dst.data<float>()[i]) : dst.data<double>()[i];
  return out;
}

// The product in float64: P[e][i][j] = Σ over e's rows of a[r][i] · b[r][j].
std::vector<double> product(const CpuRun& r) {
  std::vector<double> p(size_t(kE * kP * kQ), 0.0);
  for (int64_t row = 0; row < kRows; ++row) {
    const int e = expert_of(row);
    if (e < 0) continue;
    for (int64_t i = 0; i < kP; ++i)
      for (int64_t j = 0; j < kQ; ++j)
        p[size_t((e * kP + i) * kQ + j)] += r.a[size_t(row * kP + i)] * r.b[size_t(row * kQ + j)];
  }
  return p;
}

std::vector<double> start_values() {
  std::vector<double> v(size_t(kE * kP * kQ));
  for (size_t i = 0; i < v.size(); ++i) v[i] = double(i % 7) - 3.5;
  return v;
}

TEST(FuseGradMatmul, Bf16ExpertWgradIntoFloat32SinkBecomesOneGroupedGemm) {
  for (bool overwrite : {false, true}) {
    auto r = wgrad_graph(DType::kBF16, DType::kF32, overwrite);
    EXPECT_EQ(fuse_grad_matmul(r->g), 1);
    EXPECT_EQ(live_nodes(r->g, "grouped_matmul_wgrad"), 0);
    EXPECT_EQ(live_nodes(r->g, "reshape"), 0);
    EXPECT_EQ(live_nodes(r->g, "accumulate"), 0);
    ASSERT_EQ(live_nodes(r->g, ops::kGroupedWgradAccumulateOp), 1);
    for (const Node& n : r->g.nodes()) {
      if (n.dead || n.op != ops::kGroupedWgradAccumulateOp) continue;
      EXPECT_EQ(n.inputs, (std::vector<ValueId>{r->dst, r->a, r->b, r->groups}));
      EXPECT_EQ(n.attrs.b("overwrite"), overwrite);
    }
  }
  // Same-dtype sinks keep the wgrad and the add.
  EXPECT_EQ(fuse_grad_matmul(wgrad_graph(DType::kF64, DType::kF64, true)->g), 0);
}

// [model] expert_gemm_backend is the wgrad's "kernel" attribute: the sink made of it runs the same
// kernels.
TEST(FuseGradMatmul, FusedExpertSinkKeepsTheWgradsKernel) {
  for (ops::ExpertGemmKernel k : {ops::ExpertGemmKernel::kAuto, ops::ExpertGemmKernel::kCublas,
                                  ops::ExpertGemmKernel::kMeshtrain}) {
    auto r = wgrad_graph(DType::kBF16, DType::kF32, true, false, k);
    ASSERT_EQ(fuse_grad_matmul(r->g), 1);
    int fused = 0;
    for (const Node& n : r->g.nodes()) {
      if (n.dead || n.op != ops::kGroupedWgradAccumulateOp) continue;
      ++fused;
      EXPECT_TRUE(n.attrs.has("kernel")) << ops::expert_gemm_kernel_name(k);
      EXPECT_EQ(ops::expert_gemm_kernel_of(n.attrs), k) << ops::expert_gemm_kernel_name(k);
      EXPECT_TRUE(n.attrs.b("overwrite"));
    }
    EXPECT_EQ(fused, 1);
  }
}

TEST(GroupedWgradAccumulate, CpuBf16OperandsSumInFloat32AndEmptyExpertsFollowOverwrite) {
  const uint64_t seed = testing::fresh_seed();
  const std::vector<double> dst0 = start_values();
  for (bool overwrite : {false, true}) {
    SCOPED_TRACE(fmt::format("overwrite {} seed {}", overwrite, seed));
    auto r = wgrad_graph(DType::kBF16, DType::kF32, overwrite);
    ASSERT_EQ(fuse_grad_matmul(r->g), 1);
    const CpuRun got = run_cpu(*r, dst0, seed, 2);  // twice: dst0 + 2 P, or P
    const std::vector<double> p = product(got);
    for (size_t i = 0; i < p.size(); ++i) {
      const double want = overwrite ? p[i] : dst0[i] + 2 * p[i];
      // Products of bf16 values are exact in float32; their few sums round.
      EXPECT_NEAR(got.dst[i], want, 1e-5 * (1 + std::abs(want))) << "element " << i;
      if (int64_t(i) / (kP * kQ) == 2) {  // expert 2 has no rows
        EXPECT_EQ(got.dst[i], overwrite ? 0.0 : double(float(dst0[i]))) << "element " << i;
      }
    }
  }
}

TEST(GroupedWgradAccumulate, CpuFloat64OverwriteEqualsWgradThenAccumulate) {
  const uint64_t seed = testing::fresh_seed();
  std::vector<double> dst0(size_t(kE * kP * kQ), 100.0);  // overwritten
  auto fused = wgrad_graph(DType::kF64, DType::kF64, true, /*direct=*/true);
  auto plain = wgrad_graph(DType::kF64, DType::kF64, true);
  EXPECT_EQ(run_cpu(*fused, dst0, seed, 1).dst, run_cpu(*plain, dst0, seed, 1).dst)
      << "seed " << seed;
  // Accumulating: dst0 + 3 P.
  auto acc = wgrad_graph(DType::kF64, DType::kF64, false, /*direct=*/true);
  const CpuRun got = run_cpu(*acc, dst0, seed, 3);
  const std::vector<double> p = product(got);
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(got.dst[i], dst0[i] + 3 * p[i], 1e-12) << "element " << i << " seed " << seed;
}

TEST(GroupedWgradAccumulate, RefusesADestinationOfTheWrongSizeOrDtype) {
  Graph g;
  Builder b(g);
  ValueId a = b.input("a", {Shape{kRows, kP}, DType::kBF16});
  ValueId x = b.input("b", {Shape{kRows, kQ}, DType::kBF16});
  ValueId groups = b.input("groups", {Shape{2, kE}, DType::kI32});
  ValueId small = b.persistent("small", {Shape{kE, kP}, DType::kF32}, ValueRole::kGradient);
  ValueId f64 = b.persistent("f64", {Shape{kE, kP, kQ}, DType::kF64}, ValueRole::kGradient);
  const std::string size = testing::error_message<ShapeError>(
      [&] { ops::grouped_matmul_wgrad_accumulate(b, small, a, x, groups, false); });
  EXPECT_NE(size.find("the destination [4, 4] holds 16 elements, the product [4, 4, 3] holds 48"),
            std::string::npos)
      << size;
  const std::string dtype = testing::error_message<ShapeError>(
      [&] { ops::grouped_matmul_wgrad_accumulate(b, f64, a, x, groups, false); });
  EXPECT_NE(dtype.find("a float64 destination for bfloat16 operands"), std::string::npos) << dtype;
}

// The bf16 DeepSeek debug step graph on one rank (it builds anywhere; only CUDA runs it): the
// routed experts' w1, w2, w3 gradients of every MoE layer come from accumulating grouped GEMMs,
// and no bf16 sink is fed by a grouped wgrad any more.
TEST(FuseGradMatmul, Bf16DeepSeekStepGraphWritesEveryExpertWeightGradientFromItsGemm) {
  const auto mp = bf16_step_graph("deepseek_v3_debug.toml");
  const StepGraph* sg = mp->sg.get();
  const int moe_layers = int(sg->model->n_layers()) - 1;  // the debug flavor's first layer is dense
  EXPECT_EQ(live_nodes(sg->graph, ops::kGroupedWgradAccumulateOp), 3 * moe_layers);
  EXPECT_EQ(live_nodes(sg->graph, "grouped_matmul_wgrad"), 0);
  for (const Node& n : sg->graph.nodes()) {
    if (n.dead || n.op != "accumulate") continue;
    const Value& src = sg->graph.value(n.inputs.at(1));
    if (src.producer == kNoNode) continue;
    EXPECT_NE(sg->graph.node(src.producer).op, "grouped_matmul_wgrad") << n.scope;
  }
}

}  // namespace
}  // namespace meshtrain
