// Reshard-after-forward: finds each gather chain; graph/passes/recompute.h clones it for backward.
#include "meshtrain/graph/passes/reshard_after_forward.h"

#include <algorithm>

#include "meshtrain/graph/memory_plan.h"
#include "meshtrain/graph/passes/recompute.h"
#include "meshtrain/ir/op_registry.h"

namespace meshtrain {
namespace {
// Links of a gather chain: the casts, views and slices that turn the gathered shard into the
// weight the model uses.
bool is_chain_op(const std::string& op) {
  const OpDef& def = OpRegistry::instance().op(op);
  return def.cast || def.rearranges || def.view_of_input >= 0;
}
}  // namespace

ReshardStats reshard_after_forward(Graph& graph, MeshGroup group,
                                   const std::function<bool(const Node&)>& reshard) {
  ReshardStats stats;
  const OpRegistry& reg = OpRegistry::instance();
  const auto consumers = graph.consumers();
  Recompute recompute(graph, ".regathered");
  const int original_nodes = graph.num_nodes();
  for (NodeId id = 0; id < original_nodes; ++id) {
    const Node& start = graph.node(id);
    if (start.dead || start.phase != NodePhase::kForward) continue;
    if (reg.op(start.op).collective != Collective::kAllGather) continue;
    if (start.attrs.group() != group || !reshard(start)) continue;

    // The chain: all_gather, then single-consumer casts/views/slices in forward.
    std::vector<NodeId> chain = {id};
    for (;;) {
      const Node& last = graph.node(chain.back());
      std::vector<NodeId> fwd;
      for (NodeId c : consumers[size_t(last.outputs[0])])
        if (graph.node(c).phase == NodePhase::kForward) fwd.push_back(c);
      if (fwd.size() != 1 || !is_chain_op(graph.node(fwd[0]).op) ||
          graph.node(fwd[0]).inputs.size() != 1)
        break;
      chain.push_back(fwd[0]);
    }
    // Backward readers of any chain value read a re-gathered copy: the chain up to the deepest
    // value they read, cloned right before the first of them.
    std::vector<ValueId> values;
    for (NodeId c : chain) values.push_back(graph.node(c).outputs[0]);
    auto in_chain = [&chain](const Node& n) {
      return std::find(chain.begin(), chain.end(), n.id) != chain.end();
    };
    if (recompute.add(values, in_chain).clones.empty()) continue;
    ++stats.gathers_recomputed;
    // Counted as the memory plan counts blocks (aligned), so the two can be compared.
    const int64_t a = MemoryPlan::kAlignment;
    const int64_t bytes = int64_t(graph.value(values[0]).meta.nbytes());
    stats.bytes_released += (bytes + a - 1) / a * a;
  }
  recompute.splice();
  return stats;
}

}  // namespace meshtrain
