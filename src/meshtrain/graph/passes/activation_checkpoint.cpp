// Activation checkpointing: per region, find forward values backward reads, clone the chain of
// unsaved producers that recomputes them, rewire, and insert the clones into the schedule.
#include "meshtrain/graph/passes/activation_checkpoint.h"

#include <algorithm>
#include <map>
#include <set>

#include "meshtrain/ir/op_registry.h"

namespace meshtrain {
namespace {

// Nodes the pass never clones, whatever the policy.
bool always_kept(const Node& n) {
  const OpDef& def = OpRegistry::instance().op(n.op);
  if (!def.recomputable || def.side_effect) return true;  // e.g. the token exchange
  // The reshard pass owns the gathers of FSDP-sharded parameters.
  return def.collective == Collective::kAllGather && n.attrs.group() == MeshGroup::kFsdp;
}

}  // namespace

std::function<std::string(const Node&)> block_regions(int every_nth_block) {
  return [every_nth_block](const Node& n) -> std::string {
    if (n.scope.rfind("layers.", 0) != 0) return "";
    size_t end = n.scope.find('.', 7);
    std::string id = n.scope.substr(7, end == std::string::npos ? std::string::npos : end - 7);
    int layer = std::atoi(id.c_str());
    if (every_nth_block > 1 && (layer + 1) % every_nth_block != 0) return "";
    return "layers." + id;
  };
}

bool selective_op_saves(const Node& n) {
  const OpDef& def = OpRegistry::instance().op(n.op);
  return def.compute_heavy || def.is_collective();
}

bool full_recompute_saves(const Node&) { return false; }

CheckpointStats checkpoint_regions(Graph& graph,
                                   const std::function<std::string(const Node&)>& region_of,
                                   const std::function<bool(const Node&)>& save) {
  CheckpointStats stats;
  std::vector<NodeId> order = graph.schedule();
  std::vector<int> pos(size_t(graph.num_nodes()), -1);
  for (size_t i = 0; i < order.size(); ++i) pos[size_t(order[i])] = int(i);
  auto consumers = graph.consumers();

  std::map<std::string, std::vector<NodeId>> regions;  // forward nodes per region, in order
  std::vector<std::string> region(size_t(graph.num_nodes()));
  for (NodeId id : order) {
    const Node& n = graph.node(id);
    if (n.phase != NodePhase::kForward) continue;
    std::string r = region_of(n);
    if (r.empty()) continue;
    region[size_t(id)] = r;
    regions[r].push_back(id);
  }

  std::map<NodeId, std::vector<NodeId>> insert_before;
  for (auto& [key, nodes] : regions) {
    // Producer -> clone (the cloned node's outputs replace the originals for backward readers).
    std::map<NodeId, NodeId> clone_of;
    std::vector<NodeId> clones;
    std::function<ValueId(ValueId)> recompute = [&](ValueId v) -> ValueId {
      NodeId prod = graph.value(v).producer;
      if (prod < 0 || region[size_t(prod)] != key) return v;
      const Node& pn = graph.node(prod);
      if (always_kept(pn) || save(pn)) return v;
      auto it = clone_of.find(prod);
      if (it == clone_of.end()) {
        const Node src = graph.node(prod);
        std::vector<ValueId> ins;
        for (ValueId in : src.inputs) ins.push_back(recompute(in));
        std::vector<TensorMeta> metas;
        for (ValueId o : src.outputs) metas.push_back(graph.value(o).meta);
        NodeId cid =
            graph.add_node(src.op, ins, metas, src.attrs, src.scope, NodePhase::kRecompute);
        const OpDef& def = OpRegistry::instance().op(src.op);
        for (size_t k = 0; k < src.outputs.size(); ++k) {
          ValueId out = graph.node(cid).outputs[k];
          graph.value(out).name = graph.value(src.outputs[k]).name + ".recomputed";
          if (k == 0 && def.view_of_input >= 0) {
            const Value& in = graph.value(ins[size_t(def.view_of_input)]);
            graph.value(out).alias_of =
                in.alias_of != kNoValue ? in.alias_of : ins[size_t(def.view_of_input)];
          }
        }
        region.push_back("");  // keep the per-node table sized for new ids
        it = clone_of.emplace(prod, cid).first;
        clones.push_back(cid);
      }
      const Node& src = graph.node(prod);
      size_t k = size_t(std::find(src.outputs.begin(), src.outputs.end(), v) - src.outputs.begin());
      return graph.node(it->second).outputs[k];
    };

    NodeId first_reader = kNoNode;
    std::vector<std::pair<NodeId, std::pair<ValueId, ValueId>>> rewires;
    for (NodeId id : nodes) {
      const std::vector<ValueId> outs = graph.node(id).outputs;  // recompute() appends nodes
      for (ValueId out : outs)
        for (NodeId c : consumers[size_t(out)]) {
          if (graph.node(c).phase == NodePhase::kForward) continue;
          ValueId repl = recompute(out);
          if (repl == out) continue;
          rewires.push_back({c, {out, repl}});
          if (first_reader == kNoNode || pos[size_t(c)] < pos[size_t(first_reader)])
            first_reader = c;
        }
    }
    for (auto& [c, pr] : rewires)
      for (ValueId& in : graph.node(c).inputs)
        if (in == pr.first) in = pr.second;
    if (clones.empty()) continue;
    // Clones in creation order respect their own dependencies.
    std::sort(clones.begin(), clones.end());
    auto& slot = insert_before[first_reader];
    slot.insert(slot.end(), clones.begin(), clones.end());
    ++stats.regions;
    stats.nodes_recomputed += int(clones.size());
  }

  std::vector<NodeId> schedule;
  schedule.reserve(order.size() + size_t(stats.nodes_recomputed));
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
