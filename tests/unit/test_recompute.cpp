// The recompute helper (graph/passes/recompute.h): clones are made inputs first with phase
// kRecompute, view clones alias their input's storage, only readers outside forward are rewired,
// a producer the predicate rejects is read as saved, regions sharing a first reader are spliced in
// the order they were added, and the rewritten graph computes bit-identical gradients.
#include <gtest/gtest.h>

#include <random>

#include "meshtrain/graph/autodiff.h"
#include "meshtrain/graph/executor.h"
#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/graph/passes/recompute.h"
#include "meshtrain/ir/builder.h"
#include "meshtrain/ops/elementwise.h"
#include "meshtrain/runtime/backend.h"

namespace meshtrain {
namespace {

// Forward: a = scale(x), v = reshape(a) (a view), p = mul(v, v); backward: two readers of p and
// one of v, written by hand so every id is known.
struct Small {
  Graph g;
  ValueId x, a, v, p, r1, r2, r3;
  NodeId na, nv, np, n1, n2, n3;
};

std::unique_ptr<Small> small() {
  auto s = std::make_unique<Small>();
  Builder f(s->g);
  s->x = f.input("x", {Shape{2, 6}, DType::kF64});
  s->a = ops::scale(f, s->x, 2.0);
  s->na = f.last_node();
  s->v = ops::reshape(f, s->a, Shape{3, 4});
  s->nv = f.last_node();
  s->p = ops::mul(f, s->v, s->v);
  s->np = f.last_node();
  Builder b(s->g, NodePhase::kBackward);
  s->r1 = ops::scale(b, s->p, 3.0);
  s->n1 = b.last_node();
  s->r2 = ops::add(b, s->r1, s->p);
  s->n2 = b.last_node();
  s->r3 = ops::add(b, s->r2, s->v);
  s->n3 = b.last_node();
  s->g.mark_output(s->r3);
  return s;
}

const auto kAll = [](const Node&) { return true; };

TEST(Recompute, ClonesInputsFirstAliasesViewsAndRewiresOnlyNonForwardReaders) {
  auto s = small();
  Graph& g = s->g;
  Recompute rc(g, ".again");
  Recompute::Region r = rc.add({s->p}, kAll);
  ASSERT_EQ(r.clones.size(), 3u);
  const Node& ca = g.node(r.clones[0]);
  const Node& cv = g.node(r.clones[1]);
  const Node& cp = g.node(r.clones[2]);
  EXPECT_EQ(ca.op, "scale");
  EXPECT_EQ(cv.op, "reshape");
  EXPECT_EQ(cp.op, "mul");
  for (NodeId c : r.clones) EXPECT_EQ(g.node(c).phase, NodePhase::kRecompute);
  EXPECT_LT(r.clones[0], r.clones[1]);  // creation order is dependency order
  EXPECT_LT(r.clones[1], r.clones[2]);
  EXPECT_EQ(ca.inputs, std::vector<ValueId>{s->x});  // x has no producer: read as it is
  EXPECT_EQ(cv.inputs, std::vector<ValueId>{ca.outputs[0]});
  EXPECT_EQ(cp.inputs, (std::vector<ValueId>{cv.outputs[0], cv.outputs[0]}));
  EXPECT_EQ(g.value(cv.outputs[0]).alias_of, ca.outputs[0]);  // the view shares its input
  EXPECT_EQ(g.value(cp.outputs[0]).name, g.value(s->p).name + ".again");
  // Backward readers of p read the clone; the forward reader of v and the reader of v that was
  // not asked for keep the originals.
  EXPECT_EQ(g.node(s->n1).inputs, std::vector<ValueId>{cp.outputs[0]});
  EXPECT_EQ(g.node(s->n2).inputs, (std::vector<ValueId>{s->r1, cp.outputs[0]}));
  EXPECT_EQ(g.node(s->n3).inputs, (std::vector<ValueId>{s->r2, s->v}));
  EXPECT_EQ(g.node(s->np).inputs, (std::vector<ValueId>{s->v, s->v}));
  EXPECT_EQ(r.before, s->n1);
  rc.splice();
  EXPECT_EQ(g.schedule(), (std::vector<NodeId>{s->na, s->nv, s->np, r.clones[0], r.clones[1],
                                               r.clones[2], s->n1, s->n2, s->n3}));
  EXPECT_EQ(rc.num_clones(), 3);
  EXPECT_NE(g.dump().find(fmt::format("{:>5} *[recompute:0]", r.clones[2])), std::string::npos)
      << g.dump();
}

TEST(Recompute, RejectedProducersAreReadAsSavedAndViewsAliasTheirRoot) {
  auto s = small();
  Graph& g = s->g;
  Recompute rc(g, ".r");
  // a is saved: the clone of v views the original a.
  Recompute::Region r = rc.add({s->p, s->v}, [&](const Node& n) { return n.id != s->na; });
  ASSERT_EQ(r.clones.size(), 2u);
  const Node& cv = g.node(r.clones[0]);
  EXPECT_EQ(cv.inputs, std::vector<ValueId>{s->a});
  EXPECT_EQ(g.value(cv.outputs[0]).alias_of, s->a);
  EXPECT_EQ(g.node(s->n3).inputs, (std::vector<ValueId>{s->r2, cv.outputs[0]}));
  // A value whose producer is rejected, or that no one outside forward reads, clones nothing.
  EXPECT_TRUE(rc.add({s->a}, kAll).clones.empty());
  EXPECT_TRUE(rc.add({s->p}, [](const Node&) { return false; }).clones.empty());
  EXPECT_EQ(rc.num_clones(), 2);
}

TEST(Recompute, RegionsSharingAFirstReaderAreSplicedInTheOrderAdded) {
  auto s = small();
  Graph& g = s->g;
  Recompute rc(g, ".r");
  Recompute::Region first = rc.add({s->v}, kAll);  // read first by n3
  Recompute::Region second = rc.add({s->p}, [&](const Node& n) { return n.id == s->np; });
  EXPECT_EQ(first.before, s->n3);
  EXPECT_EQ(second.before, s->n1);
  // The second region clones p alone: its clone reads the original v.
  EXPECT_EQ(g.node(second.clones[0]).inputs, (std::vector<ValueId>{s->v, s->v}));
  Recompute::Region third = rc.add({s->a}, kAll);  // a has no reader outside forward
  EXPECT_EQ(third.before, kNoNode);
  Recompute::Region fourth = rc.add({s->v}, [&](const Node& n) { return n.id == s->nv; });
  EXPECT_TRUE(fourth.clones.empty()) << "n3 already reads the first region's clone";
  rc.splice();
  std::vector<NodeId> want = {s->na, s->nv, s->np, second.clones[0], s->n1, s->n2};
  want.insert(want.end(), first.clones.begin(), first.clones.end());
  want.push_back(s->n3);
  EXPECT_EQ(g.schedule(), want);
}

// x -> a chain of scale, mul and reshape; loss = sum(h * h). Autodiff's backward reads forward
// values; recomputing them all must not change the gradient by one bit.
TEST(Recompute, RecomputedGraphGivesBitIdenticalGradients) {
  auto run = [](bool recompute) {
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", {Shape{4, 6}, DType::kF64});
    ValueId h = ops::mul(b, ops::scale(b, x, 1.5), x);
    h = ops::mul(b, ops::reshape(b, h, Shape{6, 4}), ops::reshape(b, x, Shape{6, 4}));
    ValueId loss = ops::sum(b, ops::mul(b, h, h));
    ValueId dx = differentiate(g, loss, {x}).grad_of(x);
    g.mark_output(dx);
    eliminate_dead_nodes(g);
    int clones = 0;
    if (recompute) {
      Recompute rc(g, ".recomputed");
      std::vector<ValueId> forward_values;
      for (NodeId id : g.schedule())
        if (g.node(id).phase == NodePhase::kForward)
          for (ValueId o : g.node(id).outputs) forward_values.push_back(o);
      clones = int(rc.add(forward_values, kAll).clones.size());
      rc.splice();
    }
    auto be = create_backend("cpu", 0);
    Executor ex(g, plan_memory(g, DeviceType::kCPU), *be, nullptr);
    ex.prepare();
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> u(-1, 1);
    double* xp = ex.tensor(x).data<double>();
    for (int i = 0; i < 24; ++i) xp[i] = u(rng);
    ex.run();
    const double* d = ex.tensor(dx).data<double>();
    return std::make_pair(std::vector<double>(d, d + 24), clones);
  };
  auto [plain, none] = run(false);
  auto [recomputed, clones] = run(true);
  EXPECT_EQ(none, 0);
  EXPECT_GT(clones, 0);
  EXPECT_EQ(plain, recomputed);
}

}  // namespace
}  // namespace meshtrain
