// Activation checkpointing: per region, the forward values backward reads are recomputed from
// the region's unsaved producers (graph/passes/recompute.h does the cloning and splicing).
#include "meshtrain/graph/passes/activation_checkpoint.h"

#include <map>

#include "meshtrain/core/block_name.h"
#include "meshtrain/graph/passes/recompute.h"
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
    if (n.block == kNoBlock) return "";
    if (every_nth_block > 1 && (n.block + 1) % every_nth_block != 0) return "";
    // Keyed by the block's name: regions are cloned in the order of their keys, which fixes the
    // ids of the recomputed nodes (the step graphs and their dumps rely on it).
    return block_name(n.block);
  };
}

bool selective_op_saves(const Node& n) {
  const OpDef& def = OpRegistry::instance().op(n.op);
  return def.compute_heavy || def.is_collective();
}

bool full_recompute_saves(const Node&) { return false; }

std::function<bool(const Node&)> free_recompute_saves(const Graph& graph) {
  const std::vector<std::vector<NodeId>> consumers = graph.consumers();
  std::vector<char> recompute(size_t(graph.num_nodes()), 0);
  auto read_outside_forward = [&](ValueId u) {
    for (NodeId c : consumers[size_t(u)])
      if (graph.node(c).phase != NodePhase::kForward) return true;
    return false;
  };
  // In schedule order, so every producer is decided before its readers.
  for (NodeId id : graph.schedule()) {
    const Node& n = graph.node(id);
    if (n.phase != NodePhase::kForward || always_kept(n) || selective_op_saves(n)) continue;
    bool inputs_kept = true;
    for (ValueId u : n.inputs) {
      const NodeId p = graph.value(u).producer;
      inputs_kept =
          inputs_kept && (p == kNoNode || recompute[size_t(p)] || read_outside_forward(u));
    }
    recompute[size_t(id)] = inputs_kept;
  }
  return [recompute = std::move(recompute)](const Node& n) {
    return size_t(n.id) >= recompute.size() || !recompute[size_t(n.id)];
  };
}

CheckpointStats checkpoint_regions(Graph& graph,
                                   const std::function<std::string(const Node&)>& region_of,
                                   const std::function<bool(const Node&)>& save) {
  CheckpointStats stats;
  Recompute recompute(graph, ".recomputed");
  // Forward values per region, in schedule order; the region of every forward node.
  std::map<std::string, std::vector<ValueId>> regions;
  std::vector<std::string> region(size_t(graph.num_nodes()));
  for (NodeId id : graph.schedule()) {
    const Node& n = graph.node(id);
    if (n.phase != NodePhase::kForward) continue;
    std::string r = region_of(n);
    if (r.empty()) continue;
    region[size_t(id)] = r;
    auto& values = regions[r];
    values.insert(values.end(), n.outputs.begin(), n.outputs.end());
  }
  for (const auto& [key, values] : regions) {
    // Unsaved producers of the region are recomputed; anything else is read as saved.
    auto clone = [&, key = key](const Node& n) {
      return size_t(n.id) < region.size() && region[size_t(n.id)] == key && !always_kept(n) &&
             !save(n);
    };
    const Recompute::Region r = recompute.add(values, clone);
    if (r.clones.empty()) continue;
    ++stats.regions;
    stats.nodes_recomputed += int(r.clones.size());
  }
  recompute.splice();
  return stats;
}

}  // namespace meshtrain
