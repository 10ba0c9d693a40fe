// Selective AC "free" (graph/passes/activation_checkpoint.h free_recompute_saves): it recomputes
// only nodes whose inputs the backward keeps anyway, so the forward values the backward (and the
// recompute clones) read are a subset of those read without checkpointing; it recomputes fewer
// nodes than "op". Numerics (bitwise-equal steps, lower peak) are in test_trainer.cpp.
#include <gtest/gtest.h>

#include <set>

#include "step_graph_fixtures.h"

namespace meshtrain {
namespace {

// The forward values some node outside the forward reads: what the step keeps for the backward.
std::set<ValueId> saved_for_backward(const Graph& g) {
  std::set<ValueId> saved;
  for (const Node& n : g.nodes()) {
    if (n.dead || n.phase == NodePhase::kForward) continue;
    for (ValueId v : n.inputs) {
      const NodeId p = g.value(v).producer;
      if (p != kNoNode && g.node(p).phase == NodePhase::kForward) saved.insert(v);
    }
  }
  return saved;
}

std::unique_ptr<BuiltStepGraph> build(const std::string& option) {
  std::vector<std::string> o;
  if (!option.empty())
    o = {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option",
         option};
  return step_graph_of("deepseek_v3_debug.toml", o);
}

TEST(FreeRecompute, KeepsNothingNewAndRecomputesLessThanPerOp) {
  const auto none = build(""), free = build("free"), op = build("op");
  EXPECT_GT(free->sg->checkpoint.nodes_recomputed, 0);
  EXPECT_LT(free->sg->checkpoint.nodes_recomputed, op->sg->checkpoint.nodes_recomputed);
  const std::set<ValueId> before = saved_for_backward(none->sg->graph);
  const std::set<ValueId> after = saved_for_backward(free->sg->graph);
  EXPECT_LT(after.size(), before.size());
  for (ValueId v : after)
    EXPECT_TRUE(before.count(v)) << "\"free\" keeps " << free->sg->graph.value(v).name
                                 << ", which the step without checkpointing did not";
  // "op" keeps some values only for its recompute (a matmul output that only a norm read, say).
  const std::set<ValueId> op_saved = saved_for_backward(op->sg->graph);
  int op_new = 0;
  for (ValueId v : op_saved) op_new += !before.count(v);
  EXPECT_GT(op_new, 0) << "the property above would not tell the policies apart";
}

}  // namespace
}  // namespace meshtrain
