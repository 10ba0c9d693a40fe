// fuse_slice_grads: the gradient of a tensor sliced into pieces that tile a dim becomes one concat
// (no slice_backward, no add left), pieces with a gap or an overlap stay as they are, and the
// rewritten graph computes bit-identical gradients to the original on the CPU executor.
#include <gtest/gtest.h>

#include <random>

#include "meshtrain/graph/autodiff.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/graph/passes/fuse_slice_grads.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/ops/shape_ops.h"
#include "meshtrain/runtime/backend.h"

namespace meshtrain {
namespace {

struct Built {
  Graph g;
  ValueId x = kNoValue, w = kNoValue, dx = kNoValue;
};

// x [2, 5, 9]; loss = sum over pieces of sum(piece * w-slice); pieces from `windows` on dim -1.
std::unique_ptr<Built> build(const std::vector<std::pair<int64_t, int64_t>>& windows) {
  auto r = std::make_unique<Built>();
  Builder b(r->g);
  r->x = b.input("x", {Shape{2, 5, 9}, DType::kF64});
  r->w = b.input("w", {Shape{2, 5, 9}, DType::kF64});
  ValueId loss = kNoValue;
  for (auto [start, len] : windows) {
    ValueId p =
        ops::mul(b, ops::slice(b, r->x, -1, start, len), ops::slice(b, r->w, 2, start, len));
    ValueId t = ops::sum(b, ops::mul(b, p, p));  // a nonlinear use: dx depends on x
    loss = loss == kNoValue ? t : ops::add(b, loss, t);
  }
  GradientMap grads = differentiate(r->g, loss, {r->x});
  r->dx = grads.grad_of(r->x);
  r->g.mark_output(r->dx);
  eliminate_dead_nodes(r->g);
  return r;
}

int count(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += !node.dead && node.op == op;
  return n;
}

std::vector<double> gradient(Built& r, uint64_t seed) {
  auto be = create_backend("cpu", 0);
  Executor ex(r.g, plan_memory(r.g, DeviceType::kCPU), *be, nullptr);
  ex.prepare();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  for (ValueId v : {r.x, r.w}) {
    Tensor& t = const_cast<Tensor&>(ex.tensor(v));
    for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = u(rng);
  }
  ex.run();
  return ex.tensor(r.dx).to_vector<double>();
}

TEST(FuseSliceGrads, TilingPiecesBecomeOneConcatWithIdenticalGradients) {
  const std::vector<std::pair<int64_t, int64_t>> windows = {{4, 3}, {0, 4}, {7, 2}};
  auto plain = build(windows);
  auto fused = build(windows);
  ASSERT_EQ(count(fused->g, "slice_backward"), 3);
  EXPECT_EQ(fuse_slice_grads(fused->g), 1);
  EXPECT_EQ(count(fused->g, "slice_backward"), 0);
  EXPECT_EQ(count(fused->g, "concat"), count(plain->g, "concat") + 1);
  const Node& producer = fused->g.node(fused->g.value(fused->dx).producer);
  EXPECT_EQ(producer.op, "concat");
  EXPECT_EQ(producer.attrs.i("dim"), 2);
  EXPECT_EQ(gradient(*plain, 7), gradient(*fused, 7));
}

TEST(FuseSliceGrads, GapsAndOverlapsAreLeftAlone) {
  for (auto windows : {std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {5, 4}},     // gap at 4
                       std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {4, 5}}}) {  // overlap
    auto g = build(windows);
    const int before = count(g->g, "slice_backward");
    EXPECT_EQ(fuse_slice_grads(g->g), 0);
    EXPECT_EQ(count(g->g, "slice_backward"), before);
  }
}

}  // namespace
}  // namespace meshtrain
