// Reshard-after-forward: chain discovery, cloning, rewiring and the new schedule.
#include "meshtrain/graph/passes/reshard_after_forward.h"

#include <algorithm>
#include <map>
#include <set>

#include "meshtrain/graph/memory_plan.h"
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
                                   const std::function<bool(const std::string&)>& reshard) {
  ReshardStats stats;
  std::vector<NodeId> order = graph.schedule();
  std::vector<int> pos(size_t(graph.num_nodes()), -1);
  for (size_t i = 0; i < order.size(); ++i) pos[size_t(order[i])] = int(i);
  auto consumers = graph.consumers();

  // Clones to emit before a given (original) node id.
  std::map<NodeId, std::vector<NodeId>> insert_before;
  const int original_nodes = graph.num_nodes();
  for (NodeId id = 0; id < original_nodes; ++id) {
    const Node start = graph.node(id);
    if (start.dead || start.phase != NodePhase::kForward) continue;
    if (OpRegistry::instance().op(start.op).collective != Collective::kAllGather) continue;
    if (start.attrs.group() != group || !reshard(start.scope)) continue;

    // The chain: all_gather, then single-consumer casts/views/slices in forward.
    std::vector<NodeId> chain = {id};
    for (;;) {
      const Node& last = graph.node(chain.back());
      const auto& cons = consumers[size_t(last.outputs[0])];
      std::vector<NodeId> fwd;
      for (NodeId c : cons)
        if (graph.node(c).phase == NodePhase::kForward) fwd.push_back(c);
      if (fwd.size() != 1 || !is_chain_op(graph.node(fwd[0]).op) ||
          graph.node(fwd[0]).inputs.size() != 1)
        break;
      chain.push_back(fwd[0]);
    }
    // Backward readers of any chain value.
    std::vector<std::pair<NodeId, size_t>> readers;  // (chain index, consumer)
    NodeId first_reader = kNoNode;
    std::vector<std::vector<NodeId>> bwd_of(chain.size());
    for (size_t k = 0; k < chain.size(); ++k)
      for (NodeId c : consumers[size_t(graph.node(chain[k]).outputs[0])])
        if (graph.node(c).phase != NodePhase::kForward) {
          bwd_of[k].push_back(c);
          if (first_reader == kNoNode || pos[size_t(c)] < pos[size_t(first_reader)])
            first_reader = c;
        }
    if (first_reader == kNoNode) continue;

    // Clone the chain (up to the deepest value backward reads) and rewire.
    size_t depth = 0;
    for (size_t k = 0; k < chain.size(); ++k)
      if (!bwd_of[k].empty()) depth = k;
    ValueId prev_in = graph.node(chain[0]).inputs[0];
    std::vector<NodeId> clones;
    for (size_t k = 0; k <= depth; ++k) {
      const Node src = graph.node(chain[k]);
      std::vector<TensorMeta> metas;
      for (ValueId o : src.outputs) metas.push_back(graph.value(o).meta);
      NodeId cid =
          graph.add_node(src.op, {prev_in}, metas, src.attrs, src.scope, NodePhase::kRecompute);
      const OpDef& def = OpRegistry::instance().op(src.op);
      ValueId out = graph.node(cid).outputs[0];
      if (def.view_of_input >= 0) {
        const Value& in = graph.value(prev_in);
        graph.value(out).alias_of = in.alias_of != kNoValue ? in.alias_of : prev_in;
      }
      graph.value(out).name = graph.value(src.outputs[0]).name + ".regathered";
      ValueId old_out = src.outputs[0];
      for (NodeId c : bwd_of[k])
        for (ValueId& in : graph.node(c).inputs)
          if (in == old_out) in = out;
      clones.push_back(cid);
      prev_in = out;
    }
    auto& slot = insert_before[first_reader];
    slot.insert(slot.end(), clones.begin(), clones.end());
    ++stats.gathers_recomputed;
    // Counted as the memory plan counts blocks (aligned), so the two can be compared.
    const int64_t a = MemoryPlan::kAlignment;
    const int64_t bytes = int64_t(graph.value(graph.node(chain[0]).outputs[0]).meta.nbytes());
    stats.bytes_released += (bytes + a - 1) / a * a;
  }

  std::vector<NodeId> schedule;
  schedule.reserve(order.size() + 64);
  for (NodeId id : order) {
    auto it = insert_before.find(id);
    if (it != insert_before.end())
      schedule.insert(schedule.end(), it->second.begin(), it->second.end());
    schedule.push_back(id);
  }
  graph.set_schedule(std::move(schedule));
  return stats;
}

}  // namespace meshtrain
