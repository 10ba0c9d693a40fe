// assign_streams: collectives by group; a fixed order of the common groups keeps stream numbers
// stable across models and runs (traces are easier to compare).
#include "meshtrain/graph/passes/assign_streams.h"

#include "meshtrain/ir/op_registry.h"

namespace meshtrain {

std::map<MeshGroup, int> assign_streams(Graph& graph) {
  using G = MeshGroup;
  static constexpr G kOrder[] = {G::kFsdp, G::kTp, G::kEp, G::kEfsdp, G::kDpReplicate, G::kEdp,
                                 G::kEtp,  G::kCp, G::kDp, G::kLoss,  G::kWorld};
  std::map<MeshGroup, int> stream_of;
  int next = 1;
  for (G g : kOrder) stream_of[g] = next++;
  std::map<MeshGroup, int> used;
  const OpRegistry& reg = OpRegistry::instance();
  for (Node& n : graph.nodes()) {
    if (n.dead || !reg.op(n.op).is_collective()) continue;
    const MeshGroup group = n.attrs.group();
    auto it = stream_of.find(group);
    if (it == stream_of.end()) it = stream_of.emplace(group, next++).first;  // dp_shard
    n.stream = it->second;
    used[group] = it->second;
  }
  return used;
}

}  // namespace meshtrain
